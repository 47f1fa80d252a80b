// Tasks: the list, one task with its revisions, a side-by-side diff of two revisions, the
// recipe as environment keys and secret names (never values), "start a run", links to the
// new-task and new-revision forms (./define.js), the task's retention policy, and archiving
// (an archived task leaves the list and starts no new run; #/tasks?archived=only lists them).

import { ApiError, api, can, path, query } from '../api.js';
import { h, link, put, raw } from '../dom.js';
import { t } from '../i18n.js';
import { archivedBadge, bytes, statusBadge, timeEl } from '../format.js';
import { recipesShown, revisionLines, sideBySide } from '../diff.js';
import { go } from '../main.js';
import { FormError, busy, errorBox, facts, loadMore, loadingRow, missing, numberOrNull, onEscape, outOfScope, resultSlot, scopeNote, settle } from './common.js';

export function tasksPage(view, { params, signal, ready }) {
  // Archived tasks are left out of the list; this page lists them alone when asked.
  const archived = params.get('archived') === 'only';
  const title = t(archived ? 'tasks.title_archived' : 'tasks.title');
  if (outOfScope(view, title, 'definitions:read', ready, 'common.scope_list')) return;
  const body = h('tbody', {}, loadingRow(3));
  const problem = h('div');
  const empty = h('p', { class: 'empty', hidden: true }, t(archived ? 'tasks.empty_archived' : 'tasks.empty'));
  const more = loadMore(async (cursor) => add(await fetchPage(cursor), cursor), body);
  const other = archived
    ? h('a', { class: 'button secondary', id: 'show-current', href: '#/tasks' }, t('tasks.show_current'))
    : h('a', { class: 'button secondary', id: 'show-archived', href: '#/tasks?archived=only' }, t('tasks.show_archived'));
  put(view, h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', {}, title),
      h('div', { class: 'actions' }, archived || !can('definitions:write') ? null : h('a', { class: 'button', id: 'new-task', href: '#/new-task' }, t('define.new_task')), other)),
    archived ? h('p', { class: 'help' }, t('tasks.archived_help')) : scopeNote('definitions:write'),
    problem,
    h('div', { class: 'table-wrap' }, h('table', {},
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, t('runs.task')),
        h('th', { scope: 'col' }, t('tasks.latest_revision')),
        h('th', { scope: 'col' }, t('tasks.last_run')))),
      body)),
    empty, more.el));

  function fetchPage(cursor) {
    return api.get(`${path('tasks')}${query({ archived: archived ? 'only' : null, limit: 50, cursor })}`, { scope: 'definitions:read', signal });
  }
  // A token without runs:read: its scopes, or one 403, say it for every row, every page.
  let refused = !can('runs:read');
  function add(page, cursor) {
    settle(body);
    const cells = [];
    for (const item of page.items) {
      const last = h('td', { class: 'last-run', 'aria-busy': 'true', dataset: { task: item.task } }, '…');
      cells.push(last);
      body.append(h('tr', {},
        h('td', {}, link(['tasks', item.task], raw(item.task))),
        h('td', {}, raw(item.latest_revision)),
        last));
    }
    lastRuns(cells);
    empty.hidden = body.rows.length > 0;
    if (!archived && !cursor && body.rows.length === 0) allArchived();
    return page.next_cursor;
  }
  // An empty list may be one whose every task is archived: one more request, then, to say
  // so and point at them rather than "No tasks yet".
  async function allArchived() {
    try {
      const page = await api.get(`${path('tasks')}${query({ archived: 'only', limit: 1 })}`, { scope: 'definitions:read', signal });
      if (page.items.length === 0) return;
      put(empty, t('tasks.empty_all_archived'), ' ', h('a', { id: 'empty-show-archived', href: '#/tasks?archived=only' }, t('tasks.show_archived')));
    } catch {
      // the plain "No tasks yet" stays: the list itself answered
    }
  }
  // Each task's newest run (GET /api/v1/runs?task=&limit=1), four at a time: what a person
  // asks first of a task list ("did last night's backup work?"). A token without runs:read
  // gets a dash (the runs are not its to read); the link to all of the task's runs stays.
  async function lastRuns(cells) {
    const queue = [...cells];
    const one = async () => {
      for (let cell = queue.shift(); cell; cell = queue.shift()) {
        const task = cell.dataset.task;
        const all = h('div', { class: 'muted' }, h('small', {}, h('a', { href: `#/runs?task=${encodeURIComponent(task)}` }, t('tasks.see_runs'))));
        try {
          if (refused) throw new ApiError(403, {}, 'runs:read');
          const page = await api.get(`${path('runs')}${query({ task, limit: 1 })}`, { scope: 'runs:read', signal });
          const run = page.items[0];
          put(cell, run
            ? [link(['runs', run.id], statusBadge(run.status)), ' ', timeEl(run.created_at_ms), all]
            : [h('span', { class: 'muted' }, t('tasks.never_run')), all]);
        } catch (err) {
          if (err.name === 'AbortError') return;
          refused = refused || err.status === 403;
          // Not the runs of this token's to read, or not read now: a dash, and why in words
          // for a screen reader (a title alone is not read reliably).
          const why = err.status === 403 ? t('tasks.last_run_hidden') : t('tasks.last_run_unread');
          put(cell, h('span', { 'aria-hidden': 'true', title: why }, '—'), h('span', { class: 'sr-only' }, why), all);
        }
        cell.removeAttribute('aria-busy');
      }
    };
    await Promise.all([one(), one(), one(), one()]);
  }
  fetchPage(null).then((page) => more.set(add(page))).catch((err) => problem.replaceChildren(errorBox(err) || '')).finally(ready);
}

export function taskPage(view, { args: [task], params, signal, ready }) {
  if (outOfScope(view, [t('tasks.task'), ' ', raw(task)], 'definitions:read', ready)) return;
  const problem = h('div');
  const result = resultSlot();
  // What the token may not do is not drawn even while the task loads (or if it fails to).
  const mayRun = can('runs:write');
  const mayRevise = can('definitions:write');
  const start = h('button', { type: 'button', id: 'start-run', hidden: !mayRun, on: { click: onStart } }, t('tasks.start_run'));
  const tag = h('span');
  const archivedNote = h('p', { class: 'notice notice-warn', id: 'archived-note', hidden: true }, t('tasks.archived_note'));
  const newRevision = h('a', { class: 'button secondary', id: 'new-revision', hidden: !mayRevise, href: `#/tasks/${encodeURIComponent(task)}/new-revision` }, t('define.new_revision'));
  const scheduleIt = h('a', { class: 'button secondary', id: 'schedule-task', hidden: !(mayRevise && mayRun), href: `#/new-schedule?task=${encodeURIComponent(task)}` }, t('schedule_form.schedule_task'));
  const archiving = archiveControls(task, result, (info) => drawState(info));
  const latestBox = h('div', { class: 'card' });
  const recipeBox = h('div', { class: 'card recipe' });
  const revBody = h('tbody', {}, loadingRow(3));
  const left = h('select', { id: 'diff-left', 'aria-label': t('tasks.diff_left') });
  const right = h('select', { id: 'diff-right', 'aria-label': t('tasks.diff_right') });
  const diffBox = h('div', { class: 'diff-box' });
  const revisions = new Map();
  let wanted = /^\d+-\d+$/.test(params.get('compare') || '') ? params.get('compare').split('-').map(Number) : null;
  const more = loadMore(async (cursor) => addRevisions(await fetchRevisions(cursor)), revBody);
  const retention = retentionForm(task, signal);
  put(view, h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', {}, t('tasks.task'), ' ', raw(task), ' ', tag),
      h('div', { class: 'actions' }, start, newRevision, scheduleIt,
        can('runs:read') && h('a', { class: 'button secondary', href: `#/runs?task=${encodeURIComponent(task)}` }, t('tasks.see_runs')),
        archiving.start)),
    // What the token may not do is not offered; the note names the scopes it lacks.
    scopeNote('runs:write definitions:write'),
    archiving.question, result.el, archivedNote, problem,
    h('section', {}, h('h2', {}, t('tasks.latest')), latestBox),
    h('section', {}, h('h2', {}, t('tasks.recipe')), recipeBox),
    h('section', {}, h('h2', {}, t('tasks.revisions')),
      h('div', { class: 'table-wrap' }, h('table', {},
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, t('run.revision')),
          h('th', { scope: 'col' }, t('runs.created')),
          h('th', { scope: 'col', class: 'wide' }, t('tasks.digest')))),
        revBody)),
      more.el),
    h('section', { id: 'compare', hidden: true }, h('h2', {}, t('tasks.diff')),
      h('form', { class: 'filters', on: { submit: (ev) => { ev.preventDefault(); keepCompare(); drawDiff(); } } },
        h('div', { class: 'field' }, h('label', { for: 'diff-left' }, t('tasks.diff_left')), left),
        h('div', { class: 'field' }, h('label', { for: 'diff-right' }, t('tasks.diff_right')), right),
        h('div', { class: 'field actions' }, h('button', { type: 'submit', class: 'secondary' }, t('tasks.compare')))),
      diffBox),
    h('section', { 'aria-labelledby': 'retention-title' }, h('h2', { id: 'retention-title' }, t('retention.title')), retention.el)));

  async function load() {
    try {
      const info = await api.get(path('tasks', task), { scope: 'definitions:read', signal });
      drawState(info);
      drawLatest(info.latest);
      more.set(addRevisions(await fetchRevisions(null)));
      await Promise.all([drawRecipe(info.latest.recipe), retention.load()]);
    } catch (err) {
      if (!missing(view, err, 'tasks', [t('tasks.task'), ' ', raw(task)])) problem.replaceChildren(errorBox(err) || '');
    } finally {
      ready();
    }
  }

  // Archived: a tag by the name, a note saying what that means, no start, revision or
  // schedule (the server refuses them with TASK_ARCHIVED), and unarchive in archive's place.
  function drawState(info) {
    put(tag, info.archived ? archivedBadge({ id: 'archived-tag' }) : null);
    archivedNote.hidden = !info.archived;
    start.disabled = info.archived;
    newRevision.hidden = info.archived || !mayRevise;
    scheduleIt.hidden = info.archived || !(mayRevise && mayRun);
    archiving.draw(info.archived);
  }

  function drawLatest(rev) {
    put(latestBox, facts([
      [t('run.revision'), raw(rev.revision)],
      [t('tasks.argv'), h('ol', { class: 'argv' }, rev.argv.map((a) => h('li', {}, raw(a, 'code'))))],
      [t('tasks.cwd'), rev.cwd ? raw(rev.cwd, 'code') : t('tasks.default')],
      [t('tasks.timeout'), rev.timeout_seconds ? t('time.seconds', { n: rev.timeout_seconds }) : t('tasks.none')],
      [t('run.priority'), raw(rev.priority)],
      [t('tasks.leftovers'), t(`leftovers.${rev.leftovers}`)],
      [t('tasks.max_concurrent'), rev.max_concurrent ? raw(rev.max_concurrent) : t('tasks.no_limit')],
      [t('define.retry'), rev.retry ? t('tasks.retry_summary', {
        n: rev.retry.max_attempts,
        on: rev.retry.on.map((s) => t(`status.${s}`)).join(', '),
        delay: rev.retry.initial_delay_seconds,
        factor: rev.retry.factor,
        cap: rev.retry.max_delay_seconds,
      }) : t('tasks.no_retry')],
      rev.run_as ? [t('tasks.run_as'), raw(rev.run_as)] : null,
      [t('runs.created'), timeEl(rev.created_at_ms)],
    ]));
  }

  async function drawRecipe(recipeId) {
    if (!recipeId) { put(recipeBox, h('p', { class: 'muted' }, t('tasks.no_recipe'))); return; }
    try {
      const recipe = await recipeOf(recipeId);
      // Keys and secret names only: the page never shows an environment value.
      const envKeys = Object.keys(recipe.env).sort();
      const secretKeys = Object.keys(recipe.secrets).sort();
      put(recipeBox,
        h('p', {}, t('tasks.recipe_id'), ' ', raw(recipe.id, 'code')),
        h('h3', {}, t('tasks.env_keys')),
        envKeys.length ? h('ul', { class: 'keys' }, envKeys.map((k) => h('li', {}, raw(k, 'code')))) : h('p', { class: 'muted' }, t('tasks.none')),
        h('h3', {}, t('tasks.secret_refs')),
        secretKeys.length
          ? h('ul', { class: 'keys' }, secretKeys.map((k) => h('li', {}, raw(k, 'code'), ' ← ', t('tasks.secret'), ' ', raw(recipe.secrets[k], 'code'))))
          : h('p', { class: 'muted' }, t('tasks.none')),
        h('p', { class: 'help' }, t('tasks.values_hidden')));
    } catch (err) {
      put(recipeBox, errorBox(err) || '');
    }
  }

  function fetchRevisions(cursor) {
    return api.get(`${path('tasks', task, 'revisions')}${query({ limit: 50, cursor })}`, { scope: 'definitions:read', signal });
  }

  function addRevisions(page) {
    settle(revBody);
    for (const rev of page.items) {
      revisions.set(rev.revision, rev);
      revBody.append(h('tr', {},
        h('td', {}, raw(rev.revision)),
        h('td', {}, timeEl(rev.created_at_ms)),
        h('td', { class: 'wide' }, raw(rev.digest, 'code'))));
    }
    const numbers = [...revisions.keys()].sort((x, y) => x - y);
    const pick = (select, value) => put(select, numbers.map((n) => h('option', { value: String(n), selected: n === value }, t('tasks.revision_n', { n }))));
    const newest = numbers[numbers.length - 1];
    // A compare in the address (?compare=3-5, a link someone sent) is drawn once its two
    // revisions are listed (a page of older ones may list them); else what was picked stays,
    // and at first the newest is compared with the one before.
    const chosen = [Number(left.value), Number(right.value)];
    const listed = ([x, y]) => revisions.has(x) && revisions.has(y);
    let pair = [numbers.length > 1 ? numbers[numbers.length - 2] : newest, newest];
    if (wanted && listed(wanted)) { pair = wanted; wanted = null; } else if (listed(chosen)) pair = chosen;
    const [a, b] = pair;
    pick(left, a);
    pick(right, b);
    // Shown from the second revision on: one revision has nothing to compare with.
    view.querySelector('#compare').hidden = numbers.length < 2;
    drawDiff();
    return page.next_cursor;
  }

  // Recipes are immutable: each is asked once (the compare and the latest revision's card).
  const recipes = new Map();
  function recipeOf(id) {
    if (!id) return Promise.resolve(null);
    if (!recipes.has(id)) {
      const asked = api.get(path('recipes', id), { scope: 'definitions:read', signal });
      asked.catch(() => recipes.delete(id)); // asked again next time
      recipes.set(id, asked);
    }
    return recipes.get(id);
  }

  let diffDrawn = 0; // the newest compare asked: an older one answering late is not drawn
  async function drawDiff() {
    const a = revisions.get(Number(left.value));
    const b = revisions.get(Number(right.value));
    if (!a || !b) { put(diffBox); return; }
    const mine = ++diffDrawn;
    // The recipes' keys and secret names, so a changed environment is the line that changed,
    // not only the recipe's digest (values are never shown: a word says one changed).
    let shown = [null, null];
    if (a.recipe !== b.recipe) {
      try {
        shown = recipesShown(await recipeOf(a.recipe), await recipeOf(b.recipe),
          { value: t('tasks.diff_env_value'), other: t('tasks.diff_env_other') });
      } catch (err) {
        if (err.name === 'AbortError') return; // else compared by the recipes' ids alone
      }
      if (mine !== diffDrawn) return;
    }
    const rows = sideBySide(revisionLines(a, shown[0]), revisionLines(b, shown[1]));
    const changed = rows.filter((r) => r.kind !== 'same').length;
    const leftMark = { changed: '~', removed: '−' };
    const rightMark = { changed: '~', added: '+' };
    // The mark and the colour are for the eye; a screen reader reads the kind in words.
    const cell = (side, text, mark, kind) => h('td', { class: side }, text === null ? '' : [
      h('span', { class: 'diff-mark', 'aria-hidden': 'true' }, mark || ' '),
      mark ? h('span', { class: 'sr-only' }, t(`tasks.diff_${kind}`), ' ') : null,
      raw(text, 'code')]);
    put(diffBox,
      h('p', { class: 'help' }, changed === 1 ? t('tasks.diff_count_one') : changed ? t('tasks.diff_count', { n: changed }) : t('tasks.diff_same')),
      h('div', { class: 'table-wrap' }, h('table', { class: 'diff' },
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, t('tasks.revision_n', { n: a.revision })),
          h('th', { scope: 'col' }, t('tasks.revision_n', { n: b.revision })))),
        h('tbody', {}, rows.map((r) => h('tr', { class: `diff-${r.kind}` },
          cell('old', r.left, leftMark[r.kind], r.kind),
          cell('new', r.right, rightMark[r.kind], r.kind)))))));
  }

  /** The compare asked goes into the address (not a new history entry), so it can be sent. */
  function keepCompare() {
    wanted = null; // the user's pick, not the link's, from now on
    const here = `#/tasks/${encodeURIComponent(task)}?compare=${left.value}-${right.value}`;
    history.replaceState(history.state, '', here);
  }

  async function onStart() {
    start.disabled = true;
    result.clear();
    try {
      const run = await api.post(path('runs'), { task }, { scope: 'runs:write' });
      go(`runs/${encodeURIComponent(run.id)}`);
    } catch (err) {
      result.fail(err);
      start.disabled = false;
    }
  }

  load();
}

/**
 * Archive after an in-page question (the keyboard on "Keep it", the answer that changes
 * nothing), as a schedule's delete asks; unarchive at once (it takes nothing away). A 409
 * TASK_HAS_SCHEDULES shows the server's detail: the schedules to pause or delete first.
 */
function archiveControls(task, result, drawn) {
  const keep = h('button', { type: 'button', class: 'secondary', on: { click: () => close() } }, t('secrets.keep'));
  const yes = h('button', { type: 'button', class: 'danger', id: 'archive-yes', on: { click: () => act('archive') } }, t('tasks.confirm_archive'));
  const question = h('p', { class: 'confirm-inline', role: 'group', 'aria-labelledby': 'archive-question', hidden: true, on: { keydown: onEscape(() => close()) } },
    h('span', { id: 'archive-question' }, t('tasks.archive_question')), ' ', h('span', { class: 'choices' }, yes, ' ', keep));
  const archive = h('button', { type: 'button', class: 'danger', id: 'archive-task', 'aria-expanded': 'false', hidden: !can('definitions:write'), on: { click: open } }, t('tasks.archive'));
  const unarchive = h('button', { type: 'button', class: 'secondary', id: 'unarchive-task', hidden: true, on: { click: () => act('unarchive') } }, t('tasks.unarchive'));
  const start = h('span', { class: 'archive-actions' }, archive, unarchive);
  function open() { question.hidden = false; archive.setAttribute('aria-expanded', 'true'); keep.focus(); }
  function close() { question.hidden = true; archive.setAttribute('aria-expanded', 'false'); archive.focus(); }
  function draw(archived) {
    const may = can('definitions:write');
    archive.hidden = archived || !may;
    unarchive.hidden = !archived || !may;
    question.hidden = true;
    archive.setAttribute('aria-expanded', 'false');
  }
  async function act(what) {
    result.clear();
    yes.disabled = true;
    unarchive.disabled = true;
    try {
      const info = await api.post(path('tasks', task, what), undefined, { scope: 'definitions:write' });
      drawn(info);
      result.ok(t(`tasks.done_${what}`, { name: task }));
      (info.archived ? unarchive : archive).focus(); // the keyboard stays on the action
    } catch (err) {
      question.hidden = true;
      archive.setAttribute('aria-expanded', 'false');
      result.fail(err);
    } finally {
      yes.disabled = false;
      unarchive.disabled = false;
    }
  }
  return { start, question, draw };
}

const RETENTION_FIELDS = ['keep_runs', 'keep_days', 'keep_rows', 'task_log_bytes'];

/**
 * The task's retention (GET/PUT /api/v1/tasks/{task}/retention): each field empty is null,
 * the global value; the help under it says what is in force.
 */
function retentionForm(task, signal) {
  const result = resultSlot();
  const inputs = {};
  const helps = {};
  // Offered once the stored policy is shown: a save of fields left empty because it could
  // not be read would set every value back to the global one.
  const save = h('button', { type: 'submit', id: 'retention-save', class: 'secondary', hidden: true }, t('retention.save'));
  const fields = RETENTION_FIELDS.map((k) => {
    inputs[k] = h('input', { id: `ret-${k}`, name: k, type: 'number', inputmode: 'numeric', min: '0', 'aria-describedby': `ret-${k}-help` });
    helps[k] = h('p', { class: 'help', id: `ret-${k}-help` });
    return h('div', { class: 'field' }, h('label', { for: `ret-${k}` }, t(`retention.${k}`)), inputs[k], helps[k]);
  });
  const problem = h('div');
  // Without definitions:write the policy is shown, not offered to change.
  const readOnly = scopeNote('definitions:write', 'retention.scope');
  if (readOnly) for (const k of RETENTION_FIELDS) inputs[k].readOnly = true;
  const form = h('form', { class: 'card retention-form', novalidate: true, on: { submit: onSave } },
    h('p', { class: 'help' }, t('retention.help')),
    problem,
    h('div', { class: 'form-grid' }, fields),
    readOnly || h('div', { class: 'actions' }, save),
    result.el);
  result.clearOkOnEdit(form);

  function draw(r) {
    save.hidden = false;
    for (const k of RETENTION_FIELDS) {
      const v = r.override[k];
      inputs[k].value = v === null || v === undefined ? '' : String(v);
      const e = r.effective[k];
      const shown = e === null ? t('tasks.no_limit') : k === 'task_log_bytes' ? bytes(e) : String(e);
      helps[k].textContent = t(v === null || v === undefined ? 'retention.global' : 'retention.own', { value: shown });
    }
  }

  async function load() {
    try {
      draw(await api.get(path('tasks', task, 'retention'), { scope: 'definitions:read', signal }));
    } catch (err) {
      problem.replaceChildren(errorBox(err) || '');
    }
  }

  async function onSave(ev) {
    ev.preventDefault();
    if (readOnly || save.hidden) return; // Enter submits a form whose button is not offered
    result.clear();
    const done = busy(save);
    const body = {};
    try {
      for (const k of RETENTION_FIELDS) body[k] = numberOrNull(inputs[k]);
      draw(await api.put(path('tasks', task, 'retention'), body, { scope: 'definitions:write' }));
      result.ok(t('retention.saved'));
    } catch (err) {
      if (err instanceof FormError) result.message(err.message);
      else result.fail(err);
    } finally {
      done();
    }
  }

  return { el: form, load };
}
