// Secrets: names and update times; set or replace through a write-only form; delete after
// an in-page confirmation. No value is ever read back (the API has no way to).

import { api, path, query } from '../api.js';
import { h, put, raw } from '../dom.js';
import { t } from '../i18n.js';
import { timeEl } from '../format.js';
import { FormError, busy, errorBox, loadMore, loadingRow, onEscape, outOfScope, resultSlot, settle } from './common.js';

const NAME = /^[a-z0-9][a-z0-9._-]{0,127}$/;

export function secretsPage(view, { signal, ready }) {
  // Listing names is a secrets:write power too (docs/api.md §5).
  if (outOfScope(view, t('secrets.title'), 'secrets:write', ready)) return;
  const body = h('tbody', {}, loadingRow(3));
  const problem = h('div');
  const result = resultSlot();
  const empty = h('p', { class: 'empty', hidden: true }, t('secrets.empty'));
  const name = h('input', { id: 'secret-name', name: 'name', required: true, autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'secret-name-help' });
  const value = h('input', { id: 'secret-value', name: 'value', type: 'password', required: true, autocomplete: 'new-password', spellcheck: 'false', 'aria-describedby': 'secret-value-help' });
  const save = h('button', { type: 'submit' }, t('secrets.save'));
  const more = loadMore(async (cursor) => add(await fetchPage(cursor)), body);
  put(view, h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', {}, t('secrets.title'))),
    h('form', { class: 'card secret-form', novalidate: true, on: { submit: onSave } },
      h('h2', {}, t('secrets.set')),
      h('label', { for: 'secret-name' }, t('secrets.name')), name,
      h('p', { id: 'secret-name-help', class: 'help' }, t('secrets.name_help')),
      h('label', { for: 'secret-value' }, t('secrets.value')), value,
      h('p', { id: 'secret-value-help', class: 'help' }, t('secrets.write_only')),
      h('div', { class: 'actions' }, save)),
    result.el, problem,
    h('div', { class: 'table-wrap' }, h('table', {},
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, t('secrets.name')),
        h('th', { scope: 'col' }, t('secrets.updated')),
        h('th', { scope: 'col' }, h('span', { class: 'sr-only' }, t('secrets.actions'))))),
      body)),
    empty, more.el));
  result.clearOkOnEdit(view.querySelector('form.secret-form'));

  function fetchPage(cursor) {
    return api.get(`${path('secrets')}${query({ limit: 50, cursor })}`, { scope: 'secrets:write', signal });
  }

  function add(page) {
    settle(body);
    for (const s of page.items) body.append(row(s));
    empty.hidden = body.rows.length > 0;
    return page.next_cursor;
  }

  // A delete asks in a row of its own under the secret's, spanning the table, so no column
  // changes width; the keyboard goes to "Keep it", the answer that deletes nothing.
  function row(s) {
    const questionId = `confirm-${s.name}`; // a secret's name is [a-z0-9._-]: a valid id
    let asking = null;
    const start = h('button', { type: 'button', class: 'secondary', 'aria-expanded': 'false', on: { click: () => (asking ? close() : open()) } }, t('secrets.delete'));
    const tr = h('tr', { dataset: { secret: s.name } },
      h('td', {}, raw(s.name, 'code')), h('td', {}, timeEl(s.updated_at_ms)), h('td', { class: 'row-actions' }, start));
    function open() {
      const keepIt = () => { close(); start.focus(); };
      const keep = h('button', { type: 'button', class: 'secondary', on: { click: keepIt } }, t('secrets.keep'));
      asking = h('tr', { class: 'confirm-row' }, h('td', { colspan: '3' },
        h('span', { class: 'confirm-inline', role: 'group', 'aria-labelledby': questionId, on: { keydown: onEscape(keepIt) } },
          h('span', { id: questionId }, t('secrets.confirm', { name: s.name })), ' ',
          h('button', { type: 'button', class: 'danger', on: { click: onDelete } }, t('secrets.confirm_delete')), ' ',
          keep)));
      tr.after(asking);
      start.setAttribute('aria-expanded', 'true');
      keep.focus();
    }
    function close() {
      if (asking) asking.remove();
      asking = null;
      start.setAttribute('aria-expanded', 'false');
    }
    async function onDelete(ev) {
      ev.target.disabled = true;
      result.clear();
      try {
        await api.del(path('secrets', s.name), { scope: 'secrets:write' });
        // The keyboard goes on from a neighbour's "Delete…" (or the form), not the top.
        const next = secretRow(asking || tr, 'nextElementSibling') || secretRow(tr, 'previousElementSibling');
        close();
        tr.remove();
        (next ? next.querySelector('.row-actions button') : name).focus();
        empty.hidden = Boolean(body.querySelector('tr[data-secret]'));
        result.ok(t('secrets.deleted', { name: s.name }));
      } catch (err) {
        close();
        result.fail(err);
      }
    }
    return tr;
  }

  // The nearest secret's row past ``from`` in direction ``step``, skipping open questions' rows.
  function secretRow(from, step) {
    let at = from[step];
    while (at && !at.dataset.secret) at = at[step];
    return at;
  }

  // The form is novalidate: what is missing is said in the page, in its language, as the
  // other forms do (not in the browser's own bubble).
  async function onSave(ev) {
    ev.preventDefault();
    result.clear();
    const done = busy(save);
    try {
      const secret = name.value.trim();
      if (!secret) throw new FormError(t('secrets.err_name_empty'));
      if (!NAME.test(secret)) throw new FormError(t('problem.INVALID_NAME'));
      if (!value.value) throw new FormError(t('secrets.err_value_empty'));
      await api.put(path('secrets', secret), { value: value.value }, { scope: 'secrets:write' });
      value.value = '';
      result.ok(t('secrets.saved', { name: secret }));
      await reload();
    } catch (err) {
      if (err instanceof FormError) {
        result.message(err.message);
        return;
      }
      // A token without secrets:write had the list refused with the same words: say it once.
      if (err.status === 403) problem.replaceChildren();
      result.fail(err);
    } finally {
      done();
    }
  }

  async function reload() {
    try {
      const page = await fetchPage(null);
      body.replaceChildren();
      more.set(add(page));
      problem.replaceChildren();
    } catch (err) {
      problem.replaceChildren(errorBox(err) || '');
    }
  }

  reload().finally(ready);
}
