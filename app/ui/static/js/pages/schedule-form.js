// New schedule and edit schedule: one form over PUT /api/v1/schedules/{name}. A schedule's
// body is its whole definition, so an edit starts from the stored one and sends it back with
// If-Match (the ETag read with it): a change made meanwhile elsewhere answers 412, never lost.
// Its bounds (start_at_ms, end_at_ms) are not edited here and are sent back as they are.
// Saving needs definitions:write and runs:write (a schedule starts runs).

import { ApiError, api, path, query } from '../api.js';
import { h, link, put, raw } from '../dom.js';
import { t } from '../i18n.js';
import { go } from '../main.js';
import { localTime } from '../format.js';
import { FormError, busy, errorBox, missing, numberOrNull, outOfScope, resultSlot } from './common.js';

const NAME = /^[a-z0-9][a-z0-9._-]{0,127}$/;
const OVERLAP = ['skip', 'allow', 'queue_one', 'replace'];
const CATCHUP = ['latest', 'all', 'none'];
const SCOPES = 'definitions:write runs:write';

function field(id, label, input, help) {
  if (help) input.setAttribute('aria-describedby', `${id}-help`);
  return h('div', { class: 'field' },
    h('label', { for: id }, label), input, said.get(input) || null,
    help ? h('p', { class: 'help', id: `${id}-help` }, help) : null);
}

// A policy's choices are sentences, cut off in a closed select at phone width ("skip a slot
// while the last run has not ende"): there the chosen one is also shown whole under it
// (.narrow; aria-hidden, the select itself says its value).
const said = new WeakMap();

function showChoice(select) {
  const option = select.selectedOptions[0];
  said.get(select).textContent = option ? option.textContent : '';
}

// The aliases the API reads (app/schedule/slots.py; @annually and @midnight are stored as
// @yearly and @daily). They are data, not words: in code elements, so zh-CN names them too.
const CRON_ALIASES = ['@hourly', '@daily', '@weekly', '@monthly', '@yearly'];

function cronHelp() {
  const [before, after] = t('schedule_form.cron_help').split('{aliases}');
  const sep = t('schedule_form.cron_alias_sep');
  return [before, CRON_ALIASES.map((a, i) => [i ? sep : null, raw(a, 'code')]), after];
}

function number(id, attrs = {}) {
  return h('input', { id, name: id, type: 'number', inputmode: 'numeric', ...attrs });
}

function choice(id, values, words) {
  const select = h('select', { id, name: id }, values.map((v) => h('option', { value: v }, words(v))));
  said.set(select, h('p', { class: 'narrow chosen', 'aria-hidden': 'true' }));
  select.addEventListener('change', () => showChoice(select));
  showChoice(select);
  return select;
}

function browserZone() {
  try { return Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC'; } catch { return 'UTC'; }
}

/** #/new-schedule (?task= fills the task) or #/schedules/{name}/edit. */
export function scheduleFormPage(view, { args: [name], params, signal, ready }) {
  const isNew = !name;
  const result = resultSlot();
  const problem = h('div');
  const heading = isNew ? t('schedule_form.new') : [t('schedule_form.edit'), ' ', raw(name)];
  // Saving a schedule makes runs start: it takes runs:write beside definitions:write; the
  // form reads the schedule (its version, so a save never overwrites a change it did not
  // see) and the task names with definitions:read.
  if (outOfScope(view, heading, 'definitions:read definitions:write runs:write', ready)) return;
  const nameInput = h('input', { id: 'sch-name', name: 'name', required: true, autocomplete: 'off', spellcheck: 'false' });
  const tasks = h('datalist', { id: 'sch-tasks' });
  const task = h('input', { id: 'sch-task', name: 'task', required: true, autocomplete: 'off', spellcheck: 'false', list: 'sch-tasks', value: params.get('task') || '' });
  const revision = number('sch-revision', { min: '1' });
  const kindCron = h('input', { type: 'radio', name: 'sch-kind', id: 'sch-kind-cron', value: 'cron', checked: true, on: { change: sync } });
  const kindEvery = h('input', { type: 'radio', name: 'sch-kind', id: 'sch-kind-every', value: 'every', on: { change: sync } });
  const cron = h('textarea', { id: 'sch-cron', name: 'cron', rows: '2', spellcheck: 'false', autocomplete: 'off', class: 'mono', placeholder: '0 3 * * *' });
  const everySeconds = number('sch-every', { min: '1' });
  const timezone = h('input', { id: 'sch-timezone', name: 'timezone', autocomplete: 'off', spellcheck: 'false', value: isNew ? browserZone() : '' });
  const overlap = choice('sch-overlap', OVERLAP, (v) => t(`overlap.${v}`));
  const maxConcurrent = number('sch-max-concurrent', { min: '1', max: '1000', value: '1' });
  const catchup = choice('sch-catchup', CATCHUP, (v) => t(`catchup.${v}`));
  const windowInput = number('sch-window', { min: '0', value: '3600' });
  const jitter = number('sch-jitter', { min: '0', max: '86400', value: '0' });
  const dstGap = choice('sch-dst-gap', ['shift', 'skip'], (v) => t(`schedule_form.dst_gap_${v}`));
  const dstFold = choice('sch-dst-fold', ['first', 'both'], (v) => t(`schedule_form.dst_fold_${v}`));
  const paused = h('input', { id: 'sch-paused', type: 'checkbox' });
  const boundsNote = h('p', { class: 'notice notice-info', hidden: true });
  const save = h('button', { type: 'submit', id: 'sch-save' }, isNew ? t('schedule_form.create') : t('schedule_form.save'));
  const cronBox = field('sch-cron', t('schedule_form.cron'), cron, cronHelp());
  const everyBox = field('sch-every', t('schedule_form.every'), everySeconds, t('schedule_form.every_help'));
  const windowBox = field('sch-window', t('schedule_form.window'), windowInput, t('schedule_form.window_help'));
  const maxBox = field('sch-max-concurrent', t('schedule_form.max_concurrent'), maxConcurrent, t('schedule_form.max_concurrent_help'));
  // The zone's help says what it means for the cadence chosen: a cron's times are the zone's,
  // an interval's instants are the same in every zone (docs/schedules-time.md §1).
  const zoneBox = field('sch-timezone', t('schedules.timezone'), timezone, t('schedule_form.timezone_help'));
  const dstBox = h('div', {},
    field('sch-dst-gap', t('schedule_form.dst_gap'), dstGap),
    field('sch-dst-fold', t('schedule_form.dst_fold'), dstFold));
  // The ETag the edit was read with, in the form: a draft the page keeps across a new
  // sign-in (main.js) brings back this one, so an edit typed against an older version still
  // answers 412 if the schedule changed meanwhile, never overwrites that change.
  const etag = h('input', { type: 'hidden', id: 'sch-etag' });
  let stored = null; // an edit's schedule as read: what the form does not show is sent back
  let bounds = { start_at_ms: null, end_at_ms: null };

  put(view, h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', {}, heading)),
    problem,
    h('form', { class: 'card define-form', novalidate: true, on: { submit: onSave } },
      etag,
      isNew ? field('sch-name', t('schedule_form.name'), nameInput, t('define.task_help')) : null,
      h('div', { class: 'form-grid' },
        field('sch-task', t('runs.task'), task),
        field('sch-revision', t('run.revision'), revision, t('schedule_form.revision_help'))),
      tasks,
      h('fieldset', { class: 'checks-row' }, h('legend', {}, t('schedules.cadence')),
        h('span', { class: 'check' }, kindCron, ' ', h('label', { for: 'sch-kind-cron' }, t('schedule_form.kind_cron'))),
        h('span', { class: 'check' }, kindEvery, ' ', h('label', { for: 'sch-kind-every' }, t('schedule_form.kind_every')))),
      cronBox, everyBox,
      zoneBox,
      dstBox,
      // The policies' choices are sentences: each select has a row of its own.
      field('sch-overlap', t('schedules.overlap'), overlap),
      field('sch-catchup', t('schedules.catchup'), catchup),
      h('div', { class: 'form-grid' },
        maxBox,
        windowBox,
        field('sch-jitter', t('schedule_form.jitter'), jitter, t('schedule_form.jitter_help'))),
      // A new schedule may start paused. An edit keeps the state: unticking here would be a
      // PUT paused:false, which starts from now without the catch-up Resume does.
      isNew ? h('div', { class: 'field check' }, paused, ' ', h('label', { for: 'sch-paused' }, t('schedule_form.paused'))) : null,
      boundsNote,
      h('div', { class: 'actions' }, save,
        isNew ? link(['schedules'], t('schedule_form.back_list')) : link(['schedules', name], t('schedule_form.back_schedule'))),
      result.el)));
  overlap.addEventListener('change', sync);
  catchup.addEventListener('change', sync);

  // Fields a choice makes meaningless are hidden, and not sent: max_concurrent acts under
  // "allow" only, the window bounds "latest" only, DST rules meet a cron's local times only.
  function sync() {
    for (const select of [overlap, catchup, dstGap, dstFold]) showChoice(select); // a prefill too
    const isCron = kindCron.checked;
    cronBox.hidden = !isCron;
    everyBox.hidden = isCron;
    dstBox.hidden = !isCron;
    // "Your browser's zone is filled in" is true of a new schedule only: an edit shows its own.
    zoneBox.querySelector('.help').textContent = t(isCron ? 'schedule_form.timezone_help' : 'schedule_form.timezone_help_every')
      + (isNew ? ` ${t('schedule_form.zone_filled')}` : '');
    maxBox.hidden = overlap.value !== 'allow';
    windowBox.hidden = catchup.value !== 'latest';
  }

  async function load() {
    try {
      await Promise.all([fillTasks(), isNew ? null : prefill()]);
    } catch (err) {
      if (!missing(view, err, 'schedules', heading)) problem.replaceChildren(errorBox(err) || '');
    } finally {
      sync();
      ready();
    }
  }

  // Suggestions only (a token without definitions:read still types the name): the tasks
  // listed, archived ones left out (a schedule of one could only be saved paused).
  async function fillTasks() {
    try {
      const page = await api.get(`${path('tasks')}${query({ limit: 200 })}`, { scope: 'definitions:read', signal });
      put(tasks, page.items.map((item) => h('option', { value: item.task })));
    } catch (err) {
      if (err.name === 'AbortError') throw err;
    }
  }

  async function prefill() {
    const r = await api.get(path('schedules', name), { scope: 'definitions:read', signal, raw: true });
    etag.value = r.headers.get('ETag') || '';
    const s = await r.json();
    stored = s;
    task.value = s.task;
    revision.value = s.revision ? String(s.revision) : '';
    kindCron.checked = Boolean(s.cron);
    kindEvery.checked = !s.cron;
    cron.value = s.cron ? s.cron.join('\n') : '';
    everySeconds.value = s.every_seconds ? String(s.every_seconds) : '';
    timezone.value = s.timezone;
    overlap.value = s.overlap;
    maxConcurrent.value = String(s.max_concurrent);
    catchup.value = s.catchup;
    windowInput.value = String(s.catchup_window_seconds);
    jitter.value = String(s.jitter_seconds);
    dstGap.value = s.dst_gap;
    dstFold.value = s.dst_fold;
    paused.checked = s.paused;
    bounds = { start_at_ms: s.start_at_ms, end_at_ms: s.end_at_ms };
    if (bounds.start_at_ms !== null || bounds.end_at_ms !== null) {
      boundsNote.hidden = false;
      put(boundsNote, t('schedule_form.bounds_kept', {
        from: bounds.start_at_ms === null ? '—' : localTime(bounds.start_at_ms),
        until: bounds.end_at_ms === null ? '—' : localTime(bounds.end_at_ms),
      }));
    }
  }

  // An edit starts from the stored definition, so a field the form hides (max_concurrent
  // under skip, the DST rules of an interval, the window under all) goes back unchanged: a
  // plain save must not reset what the API or the CLI set. A new schedule sends only what
  // the form shows (the API's defaults for the rest).
  function body() {
    const out = stored ? {
      max_concurrent: stored.max_concurrent,
      catchup_window_seconds: stored.catchup_window_seconds,
      dst_gap: stored.dst_gap,
      dst_fold: stored.dst_fold,
    } : {};
    Object.assign(out, { task: task.value.trim(), timezone: timezone.value.trim() || 'UTC' });
    if (!out.task) throw new FormError(t('schedule_form.err_task_empty'));
    const rev = numberOrNull(revision);
    if (rev !== null) out.revision = rev;
    if (kindCron.checked) {
      out.cron = cron.value.split('\n').map((line) => line.trim()).filter(Boolean);
      if (!out.cron.length) throw new FormError(t('schedule_form.err_cron_empty'));
      out.dst_gap = dstGap.value;
      out.dst_fold = dstFold.value;
    } else {
      out.every_seconds = numberOrNull(everySeconds);
      if (out.every_seconds === null) throw new FormError(t('schedule_form.err_every_empty'));
    }
    out.overlap = overlap.value;
    if (overlap.value === 'allow') {
      const n = numberOrNull(maxConcurrent);
      if (n !== null) out.max_concurrent = n;
    }
    out.catchup = catchup.value;
    if (catchup.value === 'latest') {
      const n = numberOrNull(windowInput);
      if (n !== null) out.catchup_window_seconds = n;
    }
    const j = numberOrNull(jitter);
    if (j !== null) out.jitter_seconds = j;
    if (bounds.start_at_ms !== null) out.start_at_ms = bounds.start_at_ms;
    if (bounds.end_at_ms !== null) out.end_at_ms = bounds.end_at_ms;
    out.paused = stored ? stored.paused : paused.checked;
    return out;
  }

  async function exists(schedule) {
    try {
      await api.get(path('schedules', schedule), { scope: 'definitions:read' });
      return true;
    } catch (err) {
      // Not there; or a token that may write but not read schedules (the PUT decides).
      if (err instanceof ApiError && (err.status === 404 || err.status === 403)) return false;
      throw err;
    }
  }

  async function onSave(ev) {
    ev.preventDefault();
    result.clear();
    const done = busy(save);
    const schedule = isNew ? nameInput.value.trim() : name;
    try {
      if (isNew && !schedule) throw new FormError(t('schedule_form.err_name_empty'));
      if (isNew && !NAME.test(schedule)) throw new FormError(t('problem.INVALID_NAME'));
      const sent = body();
      if (isNew && await exists(schedule)) throw new FormError(t('schedule_form.err_exists', { name: schedule }));
      // A new one is created only (one made meanwhile elsewhere answers 412, untouched); an
      // edit replaces the version read, or answers 412.
      const headers = isNew ? { 'If-None-Match': '*' } : etag.value ? { 'If-Match': etag.value } : undefined;
      await api.put(path('schedules', schedule), sent, { scope: SCOPES, headers });
      go(`schedules/${encodeURIComponent(schedule)}`, null, t('schedule_form.saved', { name: schedule }));
    } catch (err) {
      if (err instanceof FormError) result.message(err.message);
      else result.fail(err);
    } finally {
      done();
    }
  }

  load();
}
