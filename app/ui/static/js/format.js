// Times, sizes, statuses and attempt endings in words.

import { h, raw } from './dom.js';
import { has, language, t } from './i18n.js';

export const TERMINAL = new Set(['succeeded', 'failed', 'cancelled', 'timed_out', 'lost']);
export const RUN_STATUSES = ['queued', 'dispatching', 'running', 'succeeded', 'failed', 'cancelled', 'timed_out', 'lost'];
const STATUS_MARK = {
  queued: '◌', dispatching: '◔', running: '▶', claimed: '◌', starting: '◔',
  succeeded: '✓', failed: '✗', cancelled: '⊘', timed_out: '◷', lost: '?',
};
const SIGNALS = {
  1: 'SIGHUP', 2: 'SIGINT', 3: 'SIGQUIT', 4: 'SIGILL', 6: 'SIGABRT', 7: 'SIGBUS', 8: 'SIGFPE',
  9: 'SIGKILL', 10: 'SIGUSR1', 11: 'SIGSEGV', 12: 'SIGUSR2', 13: 'SIGPIPE', 14: 'SIGALRM',
  15: 'SIGTERM', 24: 'SIGXCPU', 25: 'SIGXFSZ',
};

/** A status as a coloured badge that also reads as a word (and a mark for colour-blind eyes). */
export function statusBadge(status) {
  const label = has(`status.${status}`) ? t(`status.${status}`) : null;
  return h('span', { class: `status status-${status}`, dataset: { status } },
    h('span', { class: 'mark', 'aria-hidden': 'true' }, STATUS_MARK[status] || '•'),
    ' ',
    label === null ? raw(status) : label);
}

/** An archived task's badge (a task's page, and by the task of each of its schedules). */
export function archivedBadge(attrs = {}) {
  return h('span', { class: 'status status-archived', ...attrs },
    h('span', { class: 'mark', 'aria-hidden': 'true' }, '▪'), ' ', t('tasks.archived_tag'));
}

/** Local date and time for ms since the epoch. */
export function localTime(ms) {
  if (ms === null || ms === undefined) return '—';
  return new Date(ms).toLocaleString(language(), { hour12: false });
}

/** UTC in ISO 8601, to the second. */
export function utcTime(ms) {
  if (ms === null || ms === undefined) return '—';
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** An ISO 8601 instant as data (``raw``) that a narrow column may wrap after its "T" only:
 *  the date and the time each stay whole ("2026-12-" over "07T06:08:00Z" read as neither). */
export function isoRaw(text, tag = 'span') {
  const at = text.indexOf('T');
  if (at < 0) return raw(text, tag);
  return h(tag, { class: 'raw iso' }, h('span', {}, text.slice(0, at + 1)), h('wbr'), h('span', {}, text.slice(at + 1)));
}

/** An event's data as ``k=v`` pairs: nulls left out, an instant (``not_before_ms``, past
 *  2001) as a local time without its ``_ms``, anything else as JSON. */
export function eventData(data) {
  return Object.entries(data || {})
    .filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => (k.endsWith('_ms') && Number.isInteger(v) && v >= 1e12
      ? `${k.slice(0, -3)}=${localTime(v)}`
      : `${k}=${JSON.stringify(v)}`))
    .join(' ');
}

/** A <time> with the local time shown and its UTC form as text: read by a screen reader,
 *  shown on hover (app.css .utc). A title reached no keyboard, touch screen or screen
 *  reader, and beside this text it would be read twice (as the time's description). */
export function timeEl(ms) {
  if (ms === null || ms === undefined) return h('span', { class: 'muted' }, '—');
  return h('time', { datetime: new Date(ms).toISOString() }, localTime(ms),
    h('span', { class: 'utc' }, t('time.utc', { utc: utcTime(ms) })));
}

export function duration(startMs, endMs) {
  if (!startMs) return '—';
  const s = Math.max(0, Math.round(((endMs || Date.now()) - startMs) / 1000));
  if (s < 60) return t('time.seconds', { n: s });
  if (s < 3600) return t('time.minutes', { m: Math.floor(s / 60), s: s % 60 });
  return t('time.hours', { h: Math.floor(s / 3600), m: Math.floor((s % 3600) / 60) });
}

export function bytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Number(n);
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

/** How an attempt ended, in words: exit code, signal and error code each explained. */
export function explainEnding(a) {
  const parts = [];
  // The service stopped it (its time limit, a cancel): the signal alone would read as if
  // something else had killed the job.
  if (a.status === 'timed_out' || a.status === 'cancelled') parts.push(t(`ending.${a.status}`));
  if (a.exit_code !== null && a.exit_code !== undefined) {
    parts.push(a.exit_code === 0 ? t('ending.exit_zero') : t('ending.exit_code', { code: a.exit_code }));
  }
  if (a.signal !== null && a.signal !== undefined) {
    parts.push(t('ending.signal', { signal: a.signal, name: SIGNALS[a.signal] || '?' }));
  }
  if (a.error_code) {
    const key = `code.${a.error_code}`;
    parts.push(has(key) ? t(key) : t('ending.error_code'));
  }
  // A retry that waits for its instant has not started: "not ended yet" would suggest it runs.
  const waiting = a.status === 'claimed' && a.not_before_ms != null;
  if (!parts.length) parts.push(TERMINAL.has(a.status) ? t('ending.none') : t(waiting ? 'ending.retry_waits' : 'ending.not_yet'));
  return parts.join(' ');
}

export function shortId(id) {
  return id ? id.slice(-12) : '';
}
