// Schedules: the list, one schedule with its next fire times (local and UTC), pause and
// resume, and the decision history (fired, skipped, missed, ...), newest first. A schedule
// whose task is archived is marked so: it stays paused, and a resume is refused with 409
// TASK_ARCHIVED until the task is unarchived (docs/api.md §4).

import { api, can, path, query } from '../api.js';
import { h, link, put, raw } from '../dom.js';
import { has, t } from '../i18n.js';
import { archivedBadge, isoRaw, localTime, shortId, timeEl, utcTime } from '../format.js';
import { errorBox, facts, loadMore, loadingRow, missing, onEscape, outOfScope, resultSlot, scopeNote, settle } from './common.js';
import { go } from '../main.js';

function cadence(s) {
  if (s.every_seconds) return t('schedules.every', { n: s.every_seconds });
  // One expression never wraps inside itself ("* * *" over "* *" reads as two); a line may
  // break between expressions.
  if (s.cron) {
    const exprs = Array.isArray(s.cron) ? s.cron : [s.cron];
    return [t('schedules.cron'), ' ', exprs.map((c, i) => [i ? ' | ' : '', h('span', { class: 'cron' }, raw(c, 'code'))])];
  }
  return '—';
}

function policy(kind, name) {
  return has(`${kind}.${name}`) ? [raw(name, 'code'), ': ', t(`${kind}.${name}`)] : raw(name, 'code');
}

function pausedTag(s) {
  if (s.paused) return h('span', { class: 'status status-paused' }, h('span', { class: 'mark', 'aria-hidden': 'true' }, '‖'), ' ', t('schedules.paused'));
  // Past its end_at_ms no slot is left: "active" would promise runs that never come.
  if (s.end_at_ms != null && s.end_at_ms < Date.now()) return h('span', { class: 'status status-ended' }, h('span', { class: 'mark', 'aria-hidden': 'true' }, '■'), ' ', t('schedules.ended'));
  return h('span', { class: 'status status-active' }, h('span', { class: 'mark', 'aria-hidden': 'true' }, '▶'), ' ', t('schedules.active'));
}

/** The names of every archived task: one list call (a page of 200; more only past that),
 *  not one per schedule. A failure marks none: the marks help, the list stands without. */
async function archivedTasks(signal) {
  const names = new Set();
  try {
    let cursor = null;
    do {
      const page = await api.get(`${path('tasks')}${query({ archived: 'only', limit: 200, cursor })}`, { scope: 'definitions:read', signal });
      for (const item of page.items) names.add(item.task);
      cursor = page.next_cursor;
    } while (cursor);
  } catch (err) {
    if (err.name === 'AbortError') throw err;
  }
  return names;
}

export function schedulesPage(view, { signal, ready }) {
  if (outOfScope(view, t('schedules.title'), 'definitions:read', ready, 'common.scope_list')) return;
  const body = h('tbody', {}, loadingRow(5));
  const problem = h('div');
  const empty = h('p', { class: 'empty', hidden: true }, t('schedules.empty'));
  const archived = archivedTasks(signal);
  const more = loadMore(async (cursor) => add(await fetchPage(cursor), await archived), body);
  put(view, h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', {}, t('schedules.title')),
      h('div', { class: 'actions' }, can('definitions:write runs:write') ? h('a', { class: 'button', id: 'new-schedule', href: '#/new-schedule' }, t('schedule_form.new')) : null)),
    scopeNote('definitions:write runs:write'),
    problem,
    h('div', { class: 'table-wrap' }, h('table', {},
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, t('schedules.name')),
        h('th', { scope: 'col', class: 'wide' }, t('runs.task')),
        h('th', { scope: 'col', class: 'wide' }, t('schedules.cadence')),
        h('th', { scope: 'col' }, t('schedules.state')),
        h('th', { scope: 'col' }, t('schedules.next')))),
      body)),
    empty, more.el));

  function fetchPage(cursor) {
    return api.get(`${path('schedules')}${query({ limit: 50, cursor })}`, { scope: 'definitions:read', signal });
  }
  function add(page, gone) {
    settle(body);
    for (const s of page.items) {
      const next = s.next_fires && s.next_fires[0];
      // Its task archived: the Tasks page's badge by the task's name (in both places it shows).
      const tag = gone.has(s.task) ? () => [' ', archivedBadge()] : () => null;
      body.append(h('tr', { dataset: { schedule: s.name } },
        // At phone width the task and cadence columns are hidden; both show under the name
        // instead (a cron expression does not wrap, and state and next fire keep their room).
        h('td', {}, link(['schedules', s.name], raw(s.name)),
          h('div', { class: 'narrow muted' }, cadence(s)),
          h('div', { class: 'narrow muted' }, t('runs.task'), ' ', link(['tasks', s.task], raw(s.task)), tag())),
        h('td', { class: 'wide' }, link(['tasks', s.task], raw(s.task)), tag()),
        h('td', { class: 'wide' }, cadence(s)),
        h('td', {}, pausedTag(s)),
        // A paused schedule's next slot is where it would fire: only once it is resumed.
        h('td', {}, next ? timeEl(next.at_ms) : '—',
          next && s.paused ? h('div', { class: 'muted' }, h('small', {}, t(gone.has(s.task) ? 'schedules.next_if_unarchived' : 'schedules.next_if_resumed'))) : null)));
    }
    empty.hidden = body.rows.length > 0;
    return page.next_cursor;
  }
  Promise.all([fetchPage(null), archived]).then(([page, gone]) => more.set(add(page, gone))).catch((err) => problem.replaceChildren(errorBox(err) || '')).finally(ready);
}

export function schedulePage(view, { args: [name], signal, ready }) {
  if (outOfScope(view, [t('schedules.schedule'), ' ', raw(name)], 'definitions:read', ready)) return;
  const problem = h('div');
  const result = resultSlot();
  const head = h('div', { class: 'page-head' }, h('h1', {}, t('schedules.schedule'), ' ', raw(name)));
  const info = h('div', { class: 'card' });
  const actions = h('div', { class: 'actions' });
  const fires = h('tbody', {}, loadingRow(3));
  const pausedNote = h('p', { class: 'notice notice-warn', hidden: true }, t('schedules.paused_fires'));
  // Its task archived: a badge by the task, and why a resume is refused (TASK_ARCHIVED).
  const taskTag = h('span');
  const archivedNote = h('p', { class: 'notice notice-warn', id: 'task-archived-note', hidden: true }, t('schedules.task_archived_note'));
  const decisions = h('tbody', {}, loadingRow(3));
  const more = loadMore(async (cursor) => addDecisions(await fetchDecisions(cursor)), decisions);
  // Pause takes definitions:write; resume, edit and delete make runs start or stop coming,
  // and take runs:write too. What the token may not do is not offered; the note says why.
  put(view, h('section', { class: 'page' }, head, problem, actions, scopeNote('definitions:write runs:write'), result.el, archivedNote, info,
    h('section', {}, h('h2', {}, t('schedules.next_fires')), pausedNote,
      h('div', { class: 'table-wrap' }, h('table', {},
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, t('schedules.local_browser')),
          // On a phone the schedule's own zone stays (its slots are that zone's times); UTC goes.
          h('th', { scope: 'col' }, t('schedules.local_zone')),
          h('th', { scope: 'col', class: 'wide' }, t('schedules.utc')))),
        fires))),
    h('section', {}, h('h2', {}, t('schedules.decisions')),
      h('div', { class: 'table-wrap' }, h('table', {},
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, t('schedules.slot')),
          h('th', { scope: 'col' }, t('schedules.decision')),
          h('th', { scope: 'col' }, t('schedules.detail')))),
        decisions)),
      more.el)));

  async function load() {
    try {
      const s = await api.get(path('schedules', name), { scope: 'definitions:read', signal });
      draw(s);
      await markArchived(s.task);
      more.set(addDecisions(await fetchDecisions(null)));
    } catch (err) {
      if (!missing(view, err, 'schedules', [t('schedules.schedule'), ' ', raw(name)])) problem.replaceChildren(errorBox(err) || '');
    } finally {
      ready();
    }
  }

  async function markArchived(task) {
    let archived = false;
    try {
      archived = (await api.get(path('tasks', task), { scope: 'definitions:read', signal })).archived === true;
    } catch (err) {
      if (err.name === 'AbortError') throw err; // else no mark: the page stands without it
    }
    put(taskTag, archived ? [' ', archivedBadge()] : null);
    archivedNote.hidden = !archived;
  }

  function draw(s) {
    put(head, h('h1', {}, t('schedules.schedule'), ' ', raw(s.name)), pausedTag(s));
    put(info, facts([
      [t('runs.task'), [link(['tasks', s.task], raw(s.task)), taskTag]],
      [t('run.revision'), s.revision ? raw(s.revision) : t('schedules.latest_revision')],
      [t('schedules.cadence'), cadence(s)],
      [t('schedules.timezone'), raw(s.timezone)],
      // The policy's name as the API spells it, and what it does in words (a name the UI
      // does not know yet: the name alone).
      [t('schedules.overlap'), policy('overlap', s.overlap)],
      // The window bounds "latest" only (docs/schedules-time.md §4): under the others it
      // would read as a bound that is not.
      [t('schedules.catchup'), s.catchup === 'latest'
        ? [policy('catchup', s.catchup), ' · ', t('schedules.within', { n: s.catchup_window_seconds })]
        : policy('catchup', s.catchup)],
      [t('schedules.updated'), timeEl(s.updated_at_ms)],
    ]));
    const both = can('definitions:write runs:write');
    put(actions,
      s.paused
        ? both && h('button', { type: 'button', id: 'resume', on: { click: () => act('resume') } }, t('schedules.resume'))
        : can('definitions:write') && h('button', { type: 'button', id: 'pause', class: 'secondary', on: { click: () => act('pause') } }, t('schedules.pause')),
      both && h('a', { class: 'button secondary', id: 'edit-schedule', href: `#/schedules/${encodeURIComponent(s.name)}/edit` }, t('schedule_form.edit_button')),
      both && removal.start,
      can('runs:read') && h('a', { id: 'schedule-runs', href: `#/runs?schedule=${encodeURIComponent(s.name)}` }, t('schedules.see_runs')),
      both && removal.question);
    pausedNote.hidden = !s.paused;
    settle(fires);
    put(fires, (s.next_fires || []).map((f) => h('tr', {},
      h('td', {}, localTime(f.at_ms)),
      h('td', {}, isoRaw(f.local, 'code')),
      h('td', { class: 'wide' }, raw(utcTime(f.at_ms), 'code')))));
  }

  // Delete after an in-page question (the keyboard on "Keep it", the answer that changes
  // nothing); the runs it started stay, and name it still.
  const removal = (() => {
    const keep = h('button', { type: 'button', class: 'secondary', on: { click: () => close() } }, t('secrets.keep'));
    const yes = h('button', { type: 'button', class: 'danger', id: 'delete-yes', on: { click: onDelete } }, t('secrets.confirm_delete'));
    const question = h('span', { class: 'confirm-inline', role: 'group', 'aria-labelledby': 'delete-question', hidden: true, on: { keydown: onEscape(() => close()) } },
      h('span', { id: 'delete-question' }, t('schedules.confirm_delete')), ' ', yes, ' ', keep);
    const start = h('button', { type: 'button', class: 'danger', id: 'delete-schedule', 'aria-expanded': 'false', on: { click: open } }, t('secrets.delete'));
    function open() { question.hidden = false; start.setAttribute('aria-expanded', 'true'); keep.focus(); }
    function close() { question.hidden = true; start.setAttribute('aria-expanded', 'false'); start.focus(); }
    async function onDelete() {
      result.clear();
      yes.disabled = true;
      try {
        // Deleting stops a schedule's runs from coming: like resume, it needs runs:write too.
        await api.del(path('schedules', name), { scope: 'definitions:write runs:write' });
        go('schedules', null, t('schedules.deleted', { name }));
      } catch (err) {
        yes.disabled = false;
        question.hidden = true;
        start.setAttribute('aria-expanded', 'false');
        result.fail(err);
      }
    }
    return { start, question };
  })();

  async function act(what) {
    result.clear();
    try {
      // Resuming starts runs again: it needs runs:write too (the server's 403 names which).
      const scope = what === 'resume' ? 'runs:write' : 'definitions:write';
      draw(await api.post(path('schedules', name, what), undefined, { scope }));
      result.ok(t(`schedules.done_${what}`));
      // Pause became resume: the keyboard stays here (on the runs link if resume is not
      // offered: a token with definitions:write alone pauses, and cannot resume).
      actions.querySelector('button, a')?.focus();
    } catch (err) {
      result.fail(err);
    }
  }

  function fetchDecisions(cursor) {
    return api.get(`${path('schedules', name, 'decisions')}${query({ limit: 50, cursor })}`, { scope: 'definitions:read', signal });
  }

  function addDecisions(page) {
    settle(decisions);
    for (const d of page.items) {
      const label = has(`decision.${d.decision}`) ? t(`decision.${d.decision}`) : raw(d.decision);
      let detail = '';
      if (d.decision === 'missed') {
        detail = t('schedules.missed_span', { n: d.count, until: localTime(d.until_slot_ms) });
      } else if (d.run) {
        detail = [t(d.decision === 'fired' ? 'schedules.fired_run' : 'schedules.blocking_run'), ' ', link(['runs', d.run], raw(shortId(d.run), 'code'))];
      }
      decisions.append(h('tr', { dataset: { decision: d.decision } },
        h('td', {}, localTime(d.slot_ms), h('br'), isoRaw(utcTime(d.slot_ms), 'small')),
        h('td', {}, h('span', { class: `status decision decision-${d.decision}` }, label)),
        h('td', {}, detail)));
    }
    if (!decisions.rows.length) decisions.append(h('tr', {}, h('td', { colspan: '3', class: 'empty' }, t('schedules.no_decisions'))));
    return page.next_cursor;
  }

  load();
}
