// One run: status, attempts with their endings in words, the event timeline, the live log
// (or "expired" once retention removed it), download of the whole log, cancel, re-run, and
// pin / unpin (a pinned run is kept against every retention policy).

import { api, call, can, path } from '../api.js';
import { h, link, put, raw } from '../dom.js';
import { has, t, tOr } from '../i18n.js';
import { TERMINAL, bytes, duration, eventData, explainEnding, statusBadge, timeEl } from '../format.js';
import { LogFollower } from '../log.js';
import { locateGap } from '../loggap.js';
import { go } from '../main.js';
import { busy, errorBox, every, facts, loadingRow, missing, onEscape, outOfScope, resultSlot, scopeNote, settle, showProblem } from './common.js';

const POLL_MS = 1000;
// The page shows at most this much of a log; the download has every byte.
const SHOWN_CHARS = 2_000_000;
// The characters of log text one byte range holds at most while the page looks for a gap.
const GAP_STRETCH = 65_536;

/** What holds a queued run back in words ("1 of its runs is active", not "are"); a reason a
 *  newer build names is shown as it is. */
function waitingWords({ reason, active, limit }) {
  const key = `run.waiting.${reason}`;
  if (!has(key)) return raw(reason, 'code');
  return t(active === 1 && has(`${key}_one`) ? `${key}_one` : key, { active, limit });
}

export function runPage(view, { args: [runId], signal, ready }) {
  // A token that may not read runs is told so once, not polled into 403s every second.
  if (outOfScope(view, [t('run.title'), ' ', raw(runId, 'code')], 'runs:read', ready)) return;
  const state = { run: null, attempts: [], events: [], follower: null, followed: null };
  const head = h('div', { class: 'page-head' });
  // The status is a polite live region that stays in place: a change the poll sees (a run
  // cancelled before any attempt started has no log to say it) is read out once, and a poll
  // that sees the same status leaves it untouched, so nothing is read again.
  const statusLive = h('span', { role: 'status', 'aria-live': 'polite', 'aria-atomic': 'true' });
  let shownStatus = null;
  const summary = h('div', { class: 'card' });
  const actions = h('div', { class: 'actions run-actions' });
  const result = resultSlot();
  // "Cancel requested: the run ends once its job was stopped" speaks of a run still going.
  let cancelSent = null;
  const attemptsBody = h('tbody', {}, loadingRow(6));
  const timeline = h('ol', { class: 'timeline', 'aria-busy': 'true' }, h('li', { class: 'loading-row loading' }, t('common.loading')));
  const logState = h('span', { class: 'log-state', 'aria-live': 'polite' });
  const truncation = h('p', { class: 'notice notice-warn truncation', hidden: true });
  const expiredNote = h('p', { class: 'notice notice-info log-expired', id: 'log-expired', hidden: true });
  // The text new chunks are appended to. Once a truncated log's gap is marked, the box holds
  // the text before it (logHead), the marker, then logText; before that logHead is logText.
  let logText = document.createTextNode('');
  let logHead = logText;
  // Focusable so arrow keys scroll it; a named region, since a bare <pre> may carry no name.
  const logBox = h('pre', { class: 'log raw', tabindex: '0', role: 'region', 'aria-labelledby': 'log-title', id: 'log' }, logText);
  // Finding the gap: the byte range and first character (counted from the follow's first
  // one) of each chunk still shown, the characters trimmed off the box's top, and how far
  // the marking is ('placing' while its bytes are read; 'done' once marked, or once there is
  // nothing to mark where the page can show it).
  let chunks = [];
  let shownChars = 0;
  let trimmedChars = 0;
  let gapState = null;
  // Text received and not yet in the box, and the frame that puts it there (flushLog).
  let pendingText = '';
  let frame = null;
  const logTitle = h('span', {});
  const download = h('button', { type: 'button', class: 'secondary', disabled: true, on: { click: onDownload } }, t('run.download'));
  const problem = h('div');
  let shownDropped = false;
  // What the token may not do is not offered (GET /api/v1/token): no buttons the server would
  // refuse after a click, and no log box that could only stay empty.
  const logsNote = scopeNote('logs:read', 'run.log_scope');
  if (logsNote) { logBox.hidden = true; download.hidden = true; logState.hidden = true; }

  put(view, h('section', { class: 'page' },
    head, problem, summary, actions, result.el,
    h('section', { class: 'log-section' },
      h('div', { class: 'section-head' }, h('h2', { id: 'log-title' }, t('run.log'), ' ', logTitle),
        h('div', { class: 'log-tools' }, logState, download)),
      logsNote, truncation, expiredNote, logBox),
    h('section', {}, h('h2', {}, t('run.attempts')),
      h('div', { class: 'table-wrap' }, h('table', { class: 'attempts' },
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, t('run.attempt')),
          h('th', { scope: 'col' }, t('runs.status')),
          h('th', { scope: 'col' }, t('run.ending')),
          h('th', { scope: 'col', class: 'wide' }, t('run.started')),
          h('th', { scope: 'col', class: 'wide' }, t('runs.duration')),
          h('th', { scope: 'col', class: 'wide' }, t('run.log_size')))),
        attemptsBody))),
    h('section', {}, h('h2', {}, t('run.timeline')), timeline)));

  setLogState('waiting');
  signal.addEventListener('abort', () => {
    if (state.follower) state.follower.stop();
    if (frame !== null) cancelAnimationFrame(frame); // no flush into a page left
    frame = null;
  });

  async function refresh() {
    try {
      const [run, attempts, events] = await Promise.all([
        api.get(path('runs', runId), { scope: 'runs:read', signal }),
        api.get(path('runs', runId, 'attempts'), { scope: 'runs:read', signal }),
        allEvents(),
      ]);
      problem.replaceChildren();
      state.run = run;
      state.attempts = attempts.items;
      state.events = events;
      draw();
    } catch (err) {
      if (missing(view, err, 'runs', [t('run.title'), ' ', raw(runId, 'code')])) {
        state.gone = true;
        if (state.follower) state.follower.stop();
      }
      else showProblem(problem, err);
      throw err;
    }
  }

  async function allEvents() {
    const items = [];
    let cursor = null;
    do {
      const q = cursor ? `?limit=200&cursor=${encodeURIComponent(cursor)}` : '?limit=200';
      const page = await api.get(path('runs', runId, 'events') + q, { scope: 'runs:read', signal });
      items.push(...page.items);
      cursor = page.next_cursor;
    } while (cursor);
    return items;
  }

  function draw() {
    const run = state.run;
    if (shownStatus !== run.status) {
      shownStatus = run.status;
      put(statusLive, h('span', { class: 'sr-only' }, t('runs.status'), ' '), statusBadge(run.status));
    }
    // Filled before it is first shown: the status the page opens with is not announced.
    if (!head.contains(statusLive)) put(head, h('h1', {}, t('run.title'), ' ', raw(run.id, 'code')), statusLive);
    const cancel = run.cancel_requested;
    // serve --stop-jobs-on-exit asks under the reason "user", the one older builds read
    // (app/supervisor/stop_jobs.py); its event says that the service asked, not a user.
    const byService = cancel && state.events.some((e) => e.type === 'run.cancel_requested'
      && e.data && e.data.service_stop === true);
    const cancelReason = cancel && (byService ? 'service_stop' : cancel.reason);
    put(summary, facts([
      [t('runs.task'), link(['tasks', run.task], raw(run.task))],
      [t('run.revision'), raw(run.revision)],
      [t('runs.trigger'), run.trigger.kind === 'schedule'
        ? [t('runs.by_schedule'), ' ', link(['schedules', run.trigger.schedule], raw(run.trigger.schedule))]
        : t('runs.manual')],
      [t('run.priority'), raw(run.priority)],
      [t('runs.created'), timeEl(run.created_at_ms)],
      [t('run.started'), timeEl(run.started_at_ms)],
      [t('run.finished'), timeEl(run.finished_at_ms)],
      [t('runs.duration'), duration(run.started_at_ms, run.finished_at_ms)],
      run.trigger.rerun_of ? [t('run.rerun_of'), link(['runs', run.trigger.rerun_of], raw(run.trigger.rerun_of, 'code'))] : null,
      [t('run.pinned'), run.pinned ? t('run.pinned_yes') : t('run.pinned_no')],
      // What holds a queued run back (a reason a newer build names is shown as it is).
      run.waiting ? [t('run.waiting'), waitingWords(run.waiting)] : null,
      // A reason a newer build records is shown as it is, not as a missing label.
      cancel ? [t('run.cancel_requested'), [tOr('cancel.', cancelReason) || raw(cancelReason, 'code'), ' · ', timeEl(cancel.at_ms)]] : null,
      run.next_attempt_at_ms != null
        ? [t(run.next_attempt_at_ms > Date.now() ? 'run.retry_waits' : 'run.retry_due'), timeEl(run.next_attempt_at_ms)]
        : null,
    ]));
    drawActions(run);
    if (cancelSent && TERMINAL.has(run.status)) {
      if (cancelSent.isConnected) result.clear(); // the status says how it ended
      cancelSent = null;
    }
    const logSize = (a) => [bytes(a.log.bytes),
      a.log.truncated ? [' ', h('span', { class: 'tag warn' }, t('run.truncated_short'))] : null,
      a.log.expired ? [' ', h('span', { class: 'tag idle' }, t('run.expired_short'))] : null];
    settle(attemptsBody);
    // At phone width the log size goes under the ending (its column would not fit 320 px).
    put(attemptsBody, state.attempts.map((a) => h('tr', {},
      h('td', {}, raw(a.number)),
      h('td', {}, statusBadge(a.status)),
      h('td', {}, h('span', {}, explainEnding(a)),
        a.error_code ? [' ', raw(a.error_code, 'code')] : null, startFailure(a),
        h('span', { class: 'narrow' }, t('run.log_size_is'), ' ', logSize(a))),
      h('td', { class: 'wide' }, timeEl(a.started_at_ms)),
      h('td', { class: 'wide' }, duration(a.started_at_ms, a.finished_at_ms)),
      h('td', { class: 'wide' }, logSize(a)))));
    if (!state.attempts.length) put(attemptsBody, h('tr', {}, h('td', { colspan: '6', class: 'empty' }, t('run.no_attempts'))));
    timeline.setAttribute('aria-busy', 'false');
    put(timeline, state.events.map((e) => h('li', {},
      timeEl(e.at_ms), ' ',
      h('span', { class: 'event-type' }, has(`event.${e.type}`) ? t(`event.${e.type}`) : raw(e.type)),
      ' ', raw(e.type, 'code'),
      eventDataSpan(eventData(e.data)))));
    followLatest();
    drawTruncation();
    placeGap();
  }

  function eventDataSpan(text) {
    return text ? h('span', { class: 'event-data' }, ' ', raw(text)) : null;
  }

  // Why an attempt never ran, from its ending event (the attempt itself has only its code):
  // which secret is missing, or why the launch failed (words for the common ones, and the
  // codes).
  function startFailure(a) {
    if (a.error_code !== 'EXECUTOR_START_FAILED' && a.error_code !== 'SECRET_NOT_FOUND') return null;
    const ending = state.events.find((e) => e.type === 'attempt.failed' && e.data
      && e.data.attempt === a.number && (e.data.start_failure || e.data.secret));
    if (!ending) return null;
    if (ending.data.secret) {
      return h('span', { class: 'start-failure' }, ' ', t('start.secret_missing'), ' ', raw(ending.data.secret, 'code'));
    }
    const { start_failure: reason, errno } = ending.data;
    const key = [`start.${reason}.${errno}`, `start.${reason}`].find((k) => has(k));
    return h('span', { class: 'start-failure' }, ' ', key ? [t(key), ' '] : null,
      raw([reason, errno].filter(Boolean).join(' '), 'code'));
  }

  let actionsFor = null;
  // Cancelling stops a job that may be mid-way: it asks first, in the page (as a secret's delete).
  let confirming = false;
  function drawActions(run) {
    if (run.cancel_requested || TERMINAL.has(run.status)) confirming = false;
    const key = `${run.status}|${Boolean(run.cancel_requested)}|${run.pinned}|${confirming}`;
    if (actionsFor === key) return;
    actionsFor = key;
    const buttons = [];
    const note = scopeNote('runs:write');
    if (note) buttons.push(note);
    else if (confirming) {
      buttons.push(h('span', { class: 'confirm-inline', role: 'group', 'aria-labelledby': 'cancel-question', on: { keydown: onEscape(() => ask(false, 'cancel')) } },
        h('span', { id: 'cancel-question' }, t('run.cancel_confirm')), ' ',
        h('button', { type: 'button', class: 'danger', id: 'cancel-yes', on: { click: onCancel } }, t('run.cancel_yes')), ' ',
        h('button', { type: 'button', class: 'secondary', id: 'cancel-keep', on: { click: () => ask(false, 'cancel') } }, t('run.cancel_keep'))));
    } else if (!TERMINAL.has(run.status)) {
      buttons.push(h('button', { type: 'button', class: 'danger', id: 'cancel', disabled: Boolean(run.cancel_requested), on: { click: () => ask(true, 'cancel-keep') } },
        run.cancel_requested ? t('run.cancelling') : t('run.cancel')));
    }
    if (!note) {
      buttons.push(h('button', { type: 'button', id: 'rerun', on: { click: onRerun } }, t('run.rerun')));
      // An action named by what it does (Pin / Unpin), not a toggle: a pressed "Unpin" read
      // "Unpin, toggle button, pressed", a state and a label that contradict each other.
      buttons.push(h('button', { type: 'button', class: 'secondary', id: 'pin', on: { click: onPin } },
        run.pinned ? t('run.unpin') : t('run.pin')));
    }
    const back = link(['runs'], t('run.back'));
    back.id = 'back-to-runs';
    buttons.push(back);
    const focused = actions.contains(document.activeElement) ? document.activeElement.id : null;
    put(actions, buttons);
    // A redraw keeps the keyboard where it was (pin -> unpin is the same control); a control
    // that went or is off now (Cancel, once the run ended or another client cancelled it)
    // hands it to Run again rather than drop it to the page's top.
    if (focused) (actions.querySelector(`#${focused}:not(:disabled)`) || actions.querySelector('#rerun')).focus();
  }

  async function onPin(ev) {
    const pinned = Boolean(state.run && state.run.pinned);
    ev.target.disabled = true;
    result.clear();
    try {
      state.run = await api.post(path('runs', runId, pinned ? 'unpin' : 'pin'), undefined, { scope: 'runs:write' });
      result.ok(pinned ? t('run.unpinned') : t('run.pinned_done'));
      draw();
      // The button was disabled (and so lost the focus): give it back to its successor.
      const again = actions.querySelector('#pin');
      if (again) again.focus();
    } catch (err) {
      result.fail(err);
      ev.target.disabled = false;
    }
  }

  // Show or leave the cancel question; the keyboard goes to the named control of the result
  // (asking focuses "keep", the safe answer, as a dialog would).
  function ask(on, focusId) {
    confirming = on;
    if (state.run) drawActions(state.run);
    // A run that ended meanwhile has no Cancel any more: the keyboard goes on from Run again.
    const target = actions.querySelector(`#${focusId}`) || actions.querySelector('#rerun');
    if (target) target.focus();
  }

  async function onCancel(ev) {
    ev.target.disabled = true;
    result.clear();
    try {
      await api.post(path('runs', runId, 'cancel'), undefined, { scope: 'runs:write' });
      cancelSent = result.ok(t('run.cancel_sent'));
      confirming = false;
      actionsFor = null;
      await refresh();
      // The answered question is gone; Cancelling… is disabled: go on from Run again.
      const next = actions.querySelector('#rerun');
      if (next && !actions.contains(document.activeElement)) next.focus();
    } catch (err) {
      confirming = false;
      if (state.run) drawActions(state.run);
      result.fail(err);
    }
  }

  async function onRerun(ev) {
    ev.target.disabled = true;
    try {
      const run = await api.post(path('runs', runId, 'rerun'), undefined, { scope: 'runs:write' });
      go(`runs/${encodeURIComponent(run.id)}`, null, t('run.rerun_done'));
    } catch (err) {
      result.fail(err);
      ev.target.disabled = false;
    }
  }

  function followLatest() {
    // A retry that has not started (it waits, or was cancelled waiting) has no output yet:
    // the attempt before it holds what the user came to read.
    const started = state.attempts.filter((a) => a.started_at_ms != null);
    const last = state.attempts[state.attempts.length - 1];
    const latest = last && last.started_at_ms == null && started.length ? started[started.length - 1] : last;
    if (!latest || state.followed === latest.number || logsNote) return;
    if (state.follower) state.follower.stop();
    state.followed = latest.number;
    resetLog();
    shownDropped = false;
    logTitle.textContent = t('run.log_attempt', { n: latest.number });
    if (latest.log.expired) { showExpired(latest); return; }
    // A log longer than the page shows is read from where the shown part starts: streamed
    // from its first byte, a 64 MiB log took minutes to reach the end the page keeps.
    const tail = latest.log.bytes > SHOWN_CHARS ? SHOWN_CHARS : null;
    shownDropped = tail !== null;
    drawTruncation();
    expiredNote.hidden = true;
    logBox.hidden = false;
    download.disabled = false;
    setLogState('connecting');
    state.follower = new LogFollower(runId, latest.number, {
      onText: appendLog,
      onState: setLogState,
      onEnd: (end) => { flushLog(); setLogState('ended', end.status); refresh().catch(() => {}); },
      onError: (err) => {
        flushLog();
        if (err.code === 'LOG_EXPIRED') { refresh().catch(() => {}); showExpired(latest); return; }
        if (err.code === 'LOG_MISSING') { // there is nothing to download, nor an end shown
          download.disabled = true;
          shownDropped = false;
          drawTruncation();
        }
        logState.replaceChildren(errorBox(err) || '');
      },
    }, { tailBytes: tail }).start();
    // A hook for the browser tests (tests/e2e/test_ui_browser.py): drop the connection.
    window.qlLogFollower = state.follower;
  }

  /** Retention removed this attempt's log (410 LOG_EXPIRED): say so, not an error. */
  function showExpired(attempt) {
    if (state.follower) state.follower.stop();
    if (shownDropped) { shownDropped = false; drawTruncation(); } // no part of it is shown
    download.disabled = true;
    setLogState('expired');
    const a = state.attempts.find((x) => x.number === attempt.number) || attempt;
    put(expiredNote, t('run.log_expired_note', { bytes: bytes(a.log.bytes) }),
      a.log.expired_at_ms ? [' ', timeEl(a.log.expired_at_ms)] : null);
    expiredNote.hidden = false;
    logBox.hidden = true; // nothing will stream into it
  }

  function appendLog(text, offset, end) {
    if (gapState !== 'done' && Number.isInteger(offset)) {
      // Chunks that follow each other are one stretch of bytes (each ends on a character):
      // joined up to a size, a job that writes a line at a time keeps a few dozen, not one a line.
      const last = chunks[chunks.length - 1];
      if (last && last.end === offset && Number.isInteger(end) && last.length < GAP_STRETCH) {
        last.end = end;
        last.length += text.length;
      } else chunks.push({ start: offset, end, at: shownChars, length: text.length });
    }
    shownChars += text.length;
    pendingText += text;
    if (pendingText.length > SHOWN_CHARS) flushLog(); // a hidden tab runs no frames
    else if (frame === null) frame = requestAnimationFrame(flushLog);
  }

  /** Put the text received since the last frame into the box, once a frame: each append read
   *  the box's layout (is the reader at its end?), so every 64 KiB chunk laid out up to two
   *  million characters again (a 4 MiB log took 11 s to draw). */
  function flushLog() {
    if (frame !== null) cancelAnimationFrame(frame);
    frame = null;
    if (!pendingText) return;
    const stick = logBox.scrollHeight - logBox.scrollTop - logBox.clientHeight < 24;
    logText.appendData(pendingText);
    pendingText = '';
    const over = (logHead === logText ? 0 : logHead.length) + logText.length - SHOWN_CHARS;
    if (over > 0) {
      trimLog(over);
      shownDropped = true;
      drawTruncation();
    }
    placeGap();
    if (stick) logBox.scrollTop = logBox.scrollHeight;
  }

  function resetLog() {
    if (frame !== null) cancelAnimationFrame(frame);
    frame = null;
    pendingText = '';
    logText = document.createTextNode('');
    logHead = logText;
    logBox.replaceChildren(logText);
    chunks = [];
    shownChars = 0;
    trimmedChars = 0;
    gapState = null;
  }

  /** Drop `n` characters off the box's top; the gap's marker goes once its text before does. */
  function trimLog(n) {
    trimmedChars += n;
    if (logHead !== logText) {
      if (n < logHead.length) {
        logHead.deleteData(0, n);
        return;
      }
      n -= logHead.length;
      logHead.nextSibling.remove(); // the marker
      logHead.remove();
      logHead = logText;
    }
    logText.deleteData(0, n);
    while (chunks.length && chunks[0].at + chunks[0].length <= trimmedChars) chunks.shift();
  }

  /**
   * Mark a truncated log's gap in the box, at its byte offset (`log.dropped_at`, known once
   * the attempt ended: before the follower starts, or at its end's refresh), in the chunk
   * that holds it. A gap in text trimmed off the box, or in a chunk whose bytes are not
   * known, is not marked: the notice above the box says it in words.
   */
  function placeGap() {
    if (gapState) return;
    if (pendingText) { flushLog(); return; } // it places the gap once the text is in
    const a = state.attempts.find((x) => x.number === state.followed);
    if (!a || !a.log) return;
    const gap = a.log.dropped_at;
    if (!(Number.isInteger(gap) && gap >= 0 && gap < a.log.bytes)) {
      if (TERMINAL.has(a.status)) settleGap(); // nothing dropped before the log's end
      return;
    }
    const chunk = chunks.find((c) => c.start <= gap && gap < c.end);
    if (!chunk) {
      if (!chunks.length || gap >= chunks[0].start) return; // not received yet
      settleGap(); // before the first chunk still shown
      return;
    }
    if (chunk.at < trimmedChars) { settleGap(); return; } // its start is trimmed off
    const text = logText.substringData(chunk.at - trimmedChars, chunk.length);
    const spot = locateGap(text, chunk.start, chunk.end, gap);
    if (!spot) settleGap();
    else if (spot.window) decodeAcross(chunk, spot, gap, a);
    else {
      markGap(chunk.at - trimmedChars + spot.at, a);
      settleGap();
    }
  }

  function settleGap() {
    gapState = 'done';
    chunks = [];
  }

  /** Insert the marker before logText's character `at`. */
  function markGap(at, attempt) {
    const label = t('run.log_gap', { dropped: bytes(attempt.log.dropped_bytes) });
    // Its words are CSS content (app.css), so copying the log's text or reading the box's
    // textContent never takes them; a separator named with them tells a screen reader, at
    // this very point of the log, that bytes are missing here.
    const marker = h('span', { class: 'log-gap', role: 'separator', 'aria-label': label });
    const after = logText.splitText(at);
    logText.after(marker);
    logHead = logText;
    logText = after;
  }

  /**
   * The chunk's characters `spot.window` decode bytes from both sides of the gap (a cut
   * character, or replacement characters): read those few bytes and decode each side alone,
   * so the text on either side of the marker is what its bytes say.
   */
  async function decodeAcross(chunk, spot, gap, attempt) {
    gapState = 'placing';
    const followed = logText;
    const [fromByte, toByte] = spot.bytes;
    try {
      const r = await call('GET', path('runs', runId, 'attempts', attempt.number, 'log'), {
        raw: true, scope: 'logs:read', signal, headers: { Range: `bytes=${fromByte}-${toByte - 1}` },
      });
      if (r.status !== 206) { // the whole log (a proxy that dropped the Range): not read
        r.body?.cancel().catch(() => {});
        return;
      }
      const got = new Uint8Array(await r.arrayBuffer());
      const [from, to] = spot.window.map((i) => chunk.at + i - trimmedChars);
      // Another attempt followed meanwhile, or the window trimmed off the box: leave it.
      if (logText !== followed || logHead !== logText || from < 0
        || got.length !== toByte - fromByte) return;
      // A BOM is text like any other here, as the server's decoding keeps it.
      const decode = (b) => new TextDecoder('utf-8', { ignoreBOM: true }).decode(b);
      const before = decode(got.subarray(0, gap - fromByte));
      logText.replaceData(from, to - from, before + decode(got.subarray(gap - fromByte)));
      markGap(from + before.length, attempt);
    } catch {
      // Not marked (the log expired, the connection dropped): the notice above still says it.
    } finally {
      if (logText === followed || logHead === followed) settleGap();
    }
  }

  function setLogState(what, status) {
    const text = what === 'ended'
      ? t('run.log_ended', { status: has(`status.${status}`) ? t(`status.${status}`) : status })
      : t(`run.log_${what}`);
    // A live region: a follower that keeps reconnecting says "Reconnecting…" once.
    if (logState.className === `log-state log-${what}` && logState.textContent === text) return;
    // The ending is read out by the status region above (the run's status changes with it):
    // said here too, a screen reader would hear it twice.
    logState.setAttribute('aria-live', what === 'ended' ? 'off' : 'polite');
    logState.className = `log-state log-${what}`;
    logState.textContent = text;
  }

  function drawTruncation() {
    const a = state.attempts.find((x) => x.number === state.followed);
    const lines = [];
    if (a && a.log.truncated && !TERMINAL.has(a.status) && !a.log.dropped_bytes) {
      // The job runs on past its head: what was dropped is counted only when it ends.
      lines.push(t('run.truncated_running', { head: bytes(a.log.bytes) }));
    } else if (a && a.log.truncated) {
      lines.push(t('run.truncated', {
        dropped: bytes(a.log.dropped_bytes),
        reason: a.log.truncation_reason && has(`truncation.${a.log.truncation_reason}`) ? t(`truncation.${a.log.truncation_reason}`) : t('truncation.unknown'),
      }));
      // Over its quota the log keeps its head and the output's last bytes after the gap.
      const gap = a.log.dropped_at;
      if (Number.isInteger(gap) && gap >= 0 && gap < a.log.bytes) {
        lines.push(t('run.truncated_gap', { head: bytes(gap), tail: bytes(a.log.bytes - gap) }));
      }
    }
    if (shownDropped) lines.push(t('run.shown_tail'));
    truncation.hidden = !lines.length;
    truncation.textContent = lines.join(' ');
  }

  async function onDownload() {
    const number = state.followed;
    if (!number) return;
    const done = busy(download);
    result.clearErrors(); // a cancel's "the run ends once..." is still true
    try {
      const r = await call('GET', path('runs', runId, 'attempts', number, 'log'), { raw: true, scope: 'logs:read' });
      const blob = await r.blob();
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: `${state.run.task}-${runId}-attempt-${number}.log`, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (err) {
      result.fail(err);
    } finally {
      done();
    }
  }

  refresh().catch(() => {}).finally(ready);
  every(POLL_MS, signal, async () => {
    if (state.gone) return;
    if (state.run && TERMINAL.has(state.run.status) && (!state.follower || state.follower.stopped)) return;
    await refresh();
  });
}
