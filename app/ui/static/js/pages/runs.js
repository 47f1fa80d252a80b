// Runs: newest first, filters by task, status, schedule and a window of created time,
// keyset "load more", live status.

import { api, can, path, query } from '../api.js';
import { h, link, put, raw } from '../dom.js';
import { t } from '../i18n.js';
import { RUN_STATUSES, TERMINAL, duration, shortId, statusBadge, timeEl } from '../format.js';
import { go } from '../main.js';
import { every, loadMore, loadingRow, outOfScope, settle, showProblem } from './common.js';

const PAGE = 50;
const POLL_MS = 2000;

export function runsPage(view, { params, signal, ready }) {
  if (outOfScope(view, t('runs.title'), 'runs:read', ready, 'common.scope_list')) return;
  const task = params.get('task') || '';
  const status = params.get('status') || '';
  const schedule = params.get('schedule') || '';
  // The window is kept in the address as RFC 3339 instants (the API's form, the same
  // instant wherever the link is opened), and shown in this browser's local time.
  const since = params.get('since') || '';
  const until = params.get('until') || '';
  const taskInput = h('input', { id: 'filter-task', name: 'task', value: task, autocomplete: 'off', spellcheck: 'false', placeholder: t('runs.any_task') });
  const statusSelect = h('select', { id: 'filter-status', name: 'status' },
    h('option', { value: '' }, t('runs.any_status')),
    RUN_STATUSES.map((s) => h('option', { value: s, selected: s === status }, t(`status.${s}`))));
  const scheduleInput = h('input', { id: 'filter-schedule', name: 'schedule', value: schedule, autocomplete: 'off', spellcheck: 'false', placeholder: t('runs.any_schedule') });
  const sinceInput = h('input', { id: 'filter-since', name: 'since', type: 'datetime-local', step: '1', value: localInput(since) });
  const untilInput = h('input', { id: 'filter-until', name: 'until', type: 'datetime-local', step: '1', value: localInput(until) });
  const formProblem = h('p', { class: 'form-error', id: 'filter-error', role: 'alert', hidden: true });
  // novalidate: the browser's own check would stop a half-typed time with a bubble of its
  // own words; the form says what is wrong itself, as it does for the window.
  const filters = h('form', { class: 'filters runs-filters', role: 'search', novalidate: true, on: { submit: (ev) => {
    ev.preventDefault();
    // A field the user did not change keeps the address's instant as it is (its
    // milliseconds too: the field shows whole seconds only).
    const kept = (input, was) => (input.value && seconds(input.value) === localInput(was) ? was : instant(input.value));
    const from = kept(sinceInput, since);
    const to = kept(untilInput, until);
    const refuse = (input, key) => {
      formProblem.textContent = t(key, { field: t(input === sinceInput ? 'runs.filter_since' : 'runs.filter_until') });
      formProblem.hidden = false;
      input.setAttribute('aria-invalid', 'true');
      input.focus();
    };
    sinceInput.removeAttribute('aria-invalid');
    untilInput.removeAttribute('aria-invalid');
    formProblem.hidden = true;
    // Never list unfiltered what the user meant to filter: a field left half typed (or a
    // year past 9999) has no value but says so in validity.badInput.
    for (const [input, at] of [[sinceInput, from], [untilInput, to]]) {
      if (at === null || input.validity.badInput) { refuse(input, 'runs.err_time'); return; }
      if (at === SKIPPED) { refuse(input, 'runs.err_skipped'); return; }
    }
    if (from && to && Date.parse(from) >= Date.parse(to)) { refuse(sinceInput, 'runs.err_window'); return; }
    go('runs', { task: taskInput.value.trim(), status: statusSelect.value, schedule: scheduleInput.value.trim(), since: from, until: to });
  } } },
    h('div', { class: 'field' }, h('label', { for: 'filter-task' }, t('runs.filter_task')), taskInput),
    h('div', { class: 'field' }, h('label', { for: 'filter-status' }, t('runs.filter_status')), statusSelect),
    h('div', { class: 'field' }, h('label', { for: 'filter-schedule' }, t('runs.filter_schedule')), scheduleInput),
    h('div', { class: 'field' }, h('label', { for: 'filter-since' }, t('runs.filter_since')), sinceInput),
    h('div', { class: 'field' }, h('label', { for: 'filter-until' }, t('runs.filter_until')), untilInput),
    h('div', { class: 'field actions' }, h('button', { type: 'submit' }, t('runs.apply')),
      task || status || schedule || since || until ? h('a', { href: '#/runs', class: 'button secondary' }, t('runs.clear')) : null),
    formProblem);
  const body = h('tbody', {}, loadingRow(6));
  const table = h('div', { class: 'table-wrap' }, h('table', { class: 'runs' },
    h('caption', { class: 'sr-only' }, t('runs.title')),
    h('thead', {}, h('tr', {},
      h('th', { scope: 'col' }, t('runs.status')),
      h('th', { scope: 'col' }, t('runs.task')),
      // At phone width the run's id shows under the task instead: the table fits 360 px.
      h('th', { scope: 'col', class: 'wide' }, t('runs.run')),
      h('th', { scope: 'col', class: 'wide' }, t('runs.trigger')),
      h('th', { scope: 'col' }, t('runs.created')),
      h('th', { scope: 'col', class: 'wide' }, t('runs.duration')))),
    body));
  const empty = h('p', { class: 'empty', hidden: true }, t('runs.empty'));
  const problem = h('div');
  const rows = new Map();
  const more = loadMore(async (cursor) => {
    const page = await fetchPage(cursor);
    page.items.forEach((run) => upsert(run, false));
    return page.next_cursor;
  }, body);
  put(view, h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', {}, t('runs.title')),
      can('runs:write') && can('definitions:read') ? h('a', { href: '#/tasks', class: 'button' }, t('runs.start_from_task')) : null),
    filters, problem, table, empty, more.el));

  function fetchPage(cursor) {
    return api.get(`${path('runs')}${query({ task, status, schedule, since, until, limit: PAGE, cursor })}`, { scope: 'runs:read', signal });
  }

  function row(run) {
    return h('tr', { dataset: { run: run.id } },
      h('td', {}, statusBadge(run.status)),
      h('td', {}, link(['tasks', run.task], raw(run.task)),
        h('div', { class: 'narrow' }, link(['runs', run.id], raw(shortId(run.id), 'code')))),
      h('td', { class: 'wide' }, link(['runs', run.id], raw(shortId(run.id), 'code'))),
      h('td', { class: 'wide' }, run.trigger && run.trigger.kind === 'schedule'
        ? [t('runs.by_schedule'), ' ', raw(run.trigger.schedule || '')] : t('runs.manual')),
      h('td', {}, timeEl(run.created_at_ms)),
      h('td', { class: 'wide' }, duration(run.started_at_ms, run.finished_at_ms)));
  }

  function upsert(run, atTop) {
    const known = rows.get(run.id);
    if (known) {
      // In place: a focused link in the row keeps its focus while the status changes.
      if (known.run.status !== run.status) known.el.cells[0].replaceChildren(statusBadge(run.status));
      known.el.cells[5].textContent = duration(run.started_at_ms, run.finished_at_ms);
      known.run = run;
      return;
    }
    const fresh = row(run);
    if (atTop) body.prepend(fresh);
    else body.append(fresh);
    rows.set(run.id, { el: fresh, run });
    empty.hidden = rows.size > 0;
  }

  async function first() {
    try {
      const page = await fetchPage(null);
      settle(body);
      problem.replaceChildren();
      // Newest first: insert the ones not shown yet above the rest, in their order.
      const unseen = page.items.filter((r) => !rows.has(r.id));
      unseen.reverse().forEach((r) => upsert(r, true));
      page.items.filter((r) => rows.has(r.id)).forEach((r) => {
        const known = rows.get(r.id);
        if (known.run.status !== r.status || known.run.finished_at_ms !== r.finished_at_ms || !TERMINAL.has(r.status)) upsert(r, false);
      });
      if (!more.initialised) { more.set(page.next_cursor); more.initialised = true; }
      empty.hidden = rows.size > 0;
    } catch (err) {
      showProblem(problem, err);
      throw err;
    }
  }

  async function refreshOlder() {
    // Rows past the first page that were still going: one GET each (few, and cheap).
    const live = [...rows.values()].filter((r) => !TERMINAL.has(r.run.status)).slice(PAGE);
    for (const r of live) upsert(await api.get(path('runs', r.run.id), { scope: 'runs:read', signal }), false);
  }

  first().catch(() => {}).finally(ready);
  every(POLL_MS, signal, async () => { await first(); await refreshOlder(); });
}

const SKIPPED = Symbol('a local time a clock change skips');

/** A datetime-local input's value (local time, to the second) as an RFC 3339 instant: ''
 *  for none, null for one that is not a time the API takes (a year past 9999), SKIPPED for
 *  a local time a clock change skips (the browser would move it an hour on). A local time
 *  a clock change repeats is its first instant, the browser's. */
function instant(local) {
  if (!local) return '';
  const at = new Date(local);
  if (Number.isNaN(at.getTime())) return null;
  const iso = at.toISOString();
  if (!/^\d{4}-/.test(iso) || iso.startsWith('0000-')) return null;
  return localInput(iso) === seconds(local) ? iso : SKIPPED;
}

/** A datetime-local value with its seconds: the browser leaves out ":00". */
function seconds(local) {
  return local.length === 16 ? `${local}:00` : local;
}

/** An instant from the address as a datetime-local value in this browser's zone ('' for
 *  none, or for one that is not a time: the API's answer then says what is wrong). */
function localInput(rfc3339) {
  const at = new Date(rfc3339);
  if (!rfc3339 || Number.isNaN(at.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  return `${String(at.getFullYear()).padStart(4, '0')}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}T${pad(at.getHours())}:${pad(at.getMinutes())}:${pad(at.getSeconds())}`;
}
