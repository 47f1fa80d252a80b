// Pieces several pages share: an error box, a keyset "load more", polling.

import { ApiError, can, explainError, onNextAnswer } from '../api.js';
import { h, link, put, raw } from '../dom.js';
import { has, t, withNodes } from '../i18n.js';
import { notify } from '../main.js';

/** A form's own refusal, shown under its button before anything is sent. */
export class FormError extends Error {}

/** A number field's value: null when empty. The forms are novalidate, and what the browser
 *  cannot read as a number ("1e", "--") reads as "": refused here, never sent as empty. */
export function numberOrNull(input) {
  const field = input.labels && input.labels[0] ? input.labels[0].textContent : input.name;
  const validity = input.validity || {};
  if (validity.badInput) throw new FormError(t('common.err_number', { field }));
  // The field's own bounds, said in the page's language before any request (the server's
  // 422 detail is English: "Input should be greater than or equal to 0").
  if (validity.rangeUnderflow || validity.rangeOverflow) {
    const { min, max } = input;
    const key = min && max ? 'common.err_range' : min ? 'common.err_min' : 'common.err_max';
    throw new FormError(t(key, { field, min, max }));
  }
  if (validity.stepMismatch) throw new FormError(t('common.err_whole', { field }));
  const v = input.value.trim();
  return v === '' ? null : Number(v);
}

/** What stands where a page's controls would be when the token lacks their scope(s): the
 *  page offers only what the token may do (GET /api/v1/token), and says what it leaves out
 *  and why (naming each scope it lacks), rather than draw buttons that the server refuses
 *  after a click. Null when the token holds them all. */
export function scopeNote(scopes, key = 'common.scope_hidden') {
  const lacking = scopes.split(' ').filter((one) => !can(one));
  if (!lacking.length) return null;
  const scope = lacking.map((one, i) => [i ? t('common.and') : '', raw(one, 'code')]);
  const many = lacking.length > 1 && has(`${key}_many`) ? `${key}_many` : key; // "scopes"
  return h('p', { class: 'notice notice-info scope-note' }, withNodes(many, { scope }));
}

/** A page whose every action needs scopes the token lacks (a form to save, a write-only
 *  list): its heading and the note say so, and nothing is asked of the server. True when it
 *  drew that; the page is then ready. */
export function outOfScope(view, heading, scopes, ready, key = 'common.scope_page') {
  const note = scopeNote(scopes, key);
  if (!note) return false;
  put(view, h('section', { class: 'page' }, h('div', { class: 'page-head' }, h('h1', {}, heading)), note));
  ready();
  return true;
}

/** An alert paragraph for a failed call; a 403 names the scope the token lacks. */
export function errorBox(err) {
  if (err && err.name === 'AbortError') return null;
  const box = h('div', { class: 'error-box', role: 'alert' }, h('p', {}, explainError(err)));
  if (err instanceof ApiError && err.detail && err.status !== 403) {
    box.append(h('p', { class: 'detail' }, raw(err.detail)));
  }
  return box;
}

/** A polled call's failure in slot. One that keeps failing the same way leaves the box that
 *  is there: a new alert at every tick would be read out again and again by a screen reader. */
export function showProblem(slot, err) {
  const box = errorBox(err);
  const shown = slot.firstElementChild;
  if (box && shown && slot.childElementCount === 1 && shown.classList.contains('error-box')
    && shown.textContent === box.textContent) return;
  slot.replaceChildren(box || '');
}

/** When the page's own run, task or schedule does not exist (404), the whole page becomes
 *  that error and a way back to the list: no empty cards, no buttons that act on nothing.
 *  It keeps the page's heading (what was asked for), so a screen reader's heading list still
 *  names the page. True when it did so. */
export function missing(view, err, list, heading) {
  if (!(err instanceof ApiError) || err.status !== 404) return false;
  put(view, h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', {}, heading)),
    errorBox(err),
    h('p', {}, link([list], t('common.back_to', { page: t(`nav.${list}`) })))));
  return true;
}

/** Show the outcome of a write next to its button (or the error, with the missing scope).
 *  An error takes the focus and is scrolled into view: under a long form it would be below
 *  the fold, and the button that was disabled while the write ran has lost the focus.
 *  "Could not be reached" is true until the server answers again (a poll, any other call):
 *  then it says so, and to try again if the write did not take (its answer was lost, or the
 *  write never arrived: the page cannot tell which). */
export function resultSlot() {
  const slot = h('div', { class: 'result', 'aria-live': 'polite' });
  // The notice the page arrived with ("Saved schedule ...") spoke of what came before: an
  // action's own result replaces it, rather than stand under it as if both were news.
  const arrived = () => notify(null);
  const reveal = (box) => {
    arrived();
    slot.replaceChildren(box || '');
    if (!box) return;
    box.tabIndex = -1;
    box.focus({ preventScroll: true });
    box.scrollIntoView({ block: 'nearest' });
  };
  return {
    el: slot,
    ok(text) {
      arrived();
      const note = h('p', { class: 'notice notice-ok' }, text);
      slot.replaceChildren(note);
      return note;
    },
    fail(err) {
      const box = errorBox(err);
      reveal(box);
      if (!box || !(err instanceof ApiError) || err.status !== 0) return;
      onNextAnswer(() => {
        if (box.parentNode !== slot) return;
        const again = h('p', { class: 'notice notice-info' }, t('error.reachable_again'));
        const focused = box.contains(document.activeElement);
        slot.replaceChildren(again);
        if (focused) { again.tabIndex = -1; again.focus({ preventScroll: true }); } // not lost to <body>
      });
    },
    message(text) { reveal(h('div', { class: 'error-box', role: 'alert' }, h('p', {}, text))); },
    clear() { slot.replaceChildren(); },
    /** Only an error or a done notice goes: one still true (a cancel under way) stays. */
    clearErrors() { for (const el of slot.querySelectorAll(':scope > .error-box, :scope > .notice-info')) el.remove(); },
    /** A "saved" notice goes once the user edits the form again: it spoke of the last save. */
    clearOkOnEdit(form) {
      form.addEventListener('input', () => { if (slot.querySelector('.notice-ok')) slot.replaceChildren(); });
    },
  };
}

/** The row a table's body holds until its first answer: "Loading…" across its columns (a
 *  slow server showed an empty table). main.js marks its table aria-busy until the page is
 *  ready; settle(body) ends it sooner, before the first rows go in. */
export function loadingRow(columns) {
  return h('tr', { class: 'loading-row' }, h('td', { colspan: String(columns), class: 'loading' }, t('common.loading')));
}

/** The first answer came: the body's "Loading…" row goes and its table is no longer busy. */
export function settle(body) {
  for (const row of body.querySelectorAll(':scope > tr.loading-row')) row.remove();
  const table = body.closest('table');
  if (table && table.hasAttribute('aria-busy')) table.setAttribute('aria-busy', 'false');
}

/** Call fn every ms while the page lives; a failure (server unreachable, an error answer)
 *  is passed to onError, so a page never keeps showing its last good answer as current. */
export function every(ms, signal, fn, onError = () => {}) {
  let timer = null;
  const tick = async () => {
    if (signal.aborted) return;
    try { await fn(); } catch (err) {
      if (err.name === 'AbortError') return;
      onError(err);
    }
    if (!signal.aborted) timer = setTimeout(tick, ms);
  };
  timer = setTimeout(tick, ms);
  signal.addEventListener('abort', () => clearTimeout(timer));
}

/** Disable a button while its write runs; the function returned enables it again. Disabled,
 *  the button drops the keyboard focus to the page's body (Tab would start over at the top):
 *  if it had the focus and nothing took it meanwhile (an error box, a new page), it gets it
 *  back. */
export function busy(button) {
  const had = document.activeElement === button;
  button.disabled = true;
  return () => {
    button.disabled = false;
    if (had && (!document.activeElement || document.activeElement === document.body)) button.focus();
  };
}

/** A "load more" button that asks loadPage(cursor) for the next keyset page of rows (the
 *  tbody rows). The keyboard goes on from the first row it added (Tab then reaches that row's
 *  links), or stays on the button: disabled while it loads, and hidden after the last page,
 *  the button would drop it to the page's top. */
export function loadMore(loadPage, rows) {
  let cursor = null;
  const button = h('button', { type: 'button', class: 'secondary load-more', hidden: true }, t('common.load_more'));
  button.addEventListener('click', async () => {
    const had = document.activeElement === button;
    const last = rows.lastElementChild;
    button.disabled = true;
    try { cursor = await loadPage(cursor); } finally {
      button.disabled = false;
      button.hidden = !cursor;
      const first = last ? last.nextElementSibling : rows.firstElementChild;
      if (had && first) { first.tabIndex = -1; first.focus(); }
      else if (had && !button.hidden) button.focus();
    }
  });
  return {
    el: button,
    set(next) { cursor = next; button.hidden = !next; },
  };
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/** A definition list from [label, value] pairs (value: node or text). */
export function facts(pairs) {
  return h('dl', { class: 'facts' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

/** The keydown handler of an in-page question: Escape gives the answer that changes nothing,
 *  as Escape closes a dialog (the questions are not dialogs, but read and act as one). */
export function onEscape(keep) {
  return (ev) => {
    if (ev.key !== 'Escape') return;
    ev.preventDefault();
    keep();
  };
}
