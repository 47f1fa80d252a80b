// Pieces several pages share: an error box, a keyset "load more", polling.

import { ApiError, explainError } from '../api.js';
import { h, raw } from '../dom.js';
import { t } from '../i18n.js';

/** An alert paragraph for a failed call; a 403 names the scope the token lacks. */
export function errorBox(err) {
  if (err && err.name === 'AbortError') return null;
  const box = h('div', { class: 'error-box', role: 'alert' }, h('p', {}, explainError(err)));
  if (err instanceof ApiError && err.detail && err.status !== 403) {
    box.append(h('p', { class: 'detail' }, raw(err.detail)));
  }
  return box;
}

/** Show the outcome of a write next to its button (or the error, with the missing scope). */
export function resultSlot() {
  const slot = h('div', { class: 'result', 'aria-live': 'polite' });
  return {
    el: slot,
    ok(text) { slot.replaceChildren(h('p', { class: 'notice notice-ok' }, text)); },
    fail(err) { slot.replaceChildren(errorBox(err) || ''); },
    message(text) { slot.replaceChildren(h('div', { class: 'error-box', role: 'alert' }, h('p', {}, text))); },
    clear() { slot.replaceChildren(); },
  };
}

/** Call fn now and every ms while the page lives; errors are passed to onError. */
export function every(ms, signal, fn) {
  let timer = null;
  const tick = async () => {
    if (signal.aborted) return;
    try { await fn(); } catch (err) { if (err.name === 'AbortError') return; }
    if (!signal.aborted) timer = setTimeout(tick, ms);
  };
  timer = setTimeout(tick, ms);
  signal.addEventListener('abort', () => clearTimeout(timer));
}

/** A "load more" button that asks loadPage(cursor) for the next keyset page. */
export function loadMore(loadPage) {
  let cursor = null;
  const button = h('button', { type: 'button', class: 'secondary load-more', hidden: true }, t('common.load_more'));
  button.addEventListener('click', async () => {
    button.disabled = true;
    try { cursor = await loadPage(cursor); } finally { button.disabled = false; }
    button.hidden = !cursor;
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
