// New task and new revision: one form over the definition endpoints. A recipe (environment
// and secret names) is created first with POST /api/v1/recipes when the form has one, then
// the revision naming it with PUT /api/v1/tasks/{task}/revisions/{n}, n the next number
// (1 for a new task). Revisions are append-only: "new revision" starts from the latest one.
//
// The command is one argument per line, never a shell string: only when the user writes
// /bin/sh (or /bin/bash) and -c on the first two lines is the rest one script argument.
// Environment values and secret values are never shown: a new revision keeps the recipe by
// default, and replacing it means typing the environment again.

import { ApiError, api, can, path, query } from '../api.js';
import { h, link, put, raw } from '../dom.js';
import { t } from '../i18n.js';
import { go } from '../main.js';
import { FormError, errorBox, numberOrNull, outOfScope, resultSlot } from './common.js';

const SHELLS = new Set(['/bin/sh', '/bin/bash']);
const RETRY_ON = ['failed', 'timed_out', 'lost'];
const RETRY_DEFAULTS = { max_attempts: 3, initial_delay_seconds: 10, factor: 2, max_delay_seconds: 600, jitter: false, on: ['failed'] };


/** argv from the text box: one argument per line; after "/bin/sh" and "-c" the rest is the script. */
export function parseArgv(text) {
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  while (lines.length && lines[lines.length - 1] === '') lines.pop();
  if (lines.length >= 2 && SHELLS.has(lines[0]) && lines[1] === '-c') {
    return [lines[0], '-c', lines.slice(2).join('\n')];
  }
  if (/^\/bin\/(ba)?sh\s/.test(lines[0] || '')) throw new FormError(t('define.err_shell_line'));
  return lines;
}

/** The text box for an argv, or null when an argument holds a line break outside the shell form. */
export function argvText(argv) {
  if (argv.length === 3 && SHELLS.has(argv[0]) && argv[1] === '-c') return argv.join('\n');
  return argv.some((a) => a.includes('\n')) ? null : argv.join('\n');
}

/** {KEY: value} from KEY=value lines; blank lines are skipped. */
export function parsePairs(text, label) {
  const out = {};
  text.replace(/\r\n?/g, '\n').split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    const eq = line.indexOf('=');
    if (eq <= 0) throw new FormError(t('define.err_pair', { field: label, n: i + 1 }));
    const key = line.slice(0, eq).trim();
    if (Object.prototype.hasOwnProperty.call(out, key)) throw new FormError(t('define.err_twice', { field: label, n: i + 1 }));
    out[key] = line.slice(eq + 1);
  });
  return out;
}

/** A labelled field; its help, when it has one, is the control's description too (a screen
 *  reader reads "Seconds; empty: none." with the timeout, not only when reading the page). */
function field(id, label, input, help) {
  if (help) input.setAttribute('aria-describedby', `${id}-help`);
  return h('div', { class: 'field' },
    h('label', { for: id }, label), input,
    help ? h('p', { class: 'help', id: `${id}-help` }, help) : null);
}

// A task's name (docs/api.md §4), as the field's pattern and as the check before a save.
const TASK_NAME = '[a-z0-9][a-z0-9._\\-]{0,127}';

function numberInput(id, value, attrs = {}) {
  return h('input', { id, name: id, type: 'number', inputmode: 'numeric', value: value === null || value === undefined ? '' : String(value), ...attrs });
}

/** #/new-task (task null) or #/tasks/{task}/new-revision. */
export function definePage(view, { args: [task], signal, ready }) {
  const isNew = !task;
  const heading = isNew ? t('define.new_task') : [t('define.new_revision'), ' ', raw(task)];
  // The form reads the task (a new revision's number and prefill; whether a new task's name
  // is taken) with definitions:read: without it a save could only fail, or land nowhere.
  if (outOfScope(view, heading, 'definitions:read definitions:write', ready)) return;
  const result = resultSlot();
  const problem = h('div');
  const name = h('input', { id: 'def-task', name: 'task', required: true, autocomplete: 'off', spellcheck: 'false', pattern: TASK_NAME });
  const argv = h('textarea', { id: 'def-argv', name: 'argv', rows: '5', required: true, spellcheck: 'false', autocomplete: 'off', class: 'mono' });
  const argvNote = h('p', { class: 'notice notice-warn', hidden: true }, t('define.argv_unshown'));
  const cwd = h('input', { id: 'def-cwd', name: 'cwd', spellcheck: 'false', autocomplete: 'off' });
  const timeout = numberInput('def-timeout', null, { min: '1', max: '604800' });
  const priority = numberInput('def-priority', 0, { min: '-100', max: '100' });
  const maxConcurrent = numberInput('def-max-concurrent', null, { min: '1', max: '1000' });
  const runAs = h('input', { id: 'def-run-as', name: 'run_as', spellcheck: 'false', autocomplete: 'off' });
  const leftovers = h('select', { id: 'def-leftovers', name: 'leftovers' },
    ['kill', 'keep'].map((v) => h('option', { value: v }, t(`define.leftovers_${v}`))));
  const retryOn = h('input', { id: 'def-retry', type: 'checkbox', on: { change: syncRetry } });
  const retryBox = h('fieldset', { class: 'retry-box', disabled: true });
  const retry = {
    max_attempts: numberInput('def-retry-max', RETRY_DEFAULTS.max_attempts, { min: '1', max: '20' }),
    initial_delay_seconds: numberInput('def-retry-delay', RETRY_DEFAULTS.initial_delay_seconds, { min: '0', max: '86400', step: 'any' }),
    factor: numberInput('def-retry-factor', RETRY_DEFAULTS.factor, { min: '1', max: '10', step: 'any' }),
    max_delay_seconds: numberInput('def-retry-cap', RETRY_DEFAULTS.max_delay_seconds, { min: '0', max: '86400', step: 'any' }),
    jitter: h('input', { id: 'def-retry-jitter', type: 'checkbox' }),
    on: Object.fromEntries(RETRY_ON.map((s) => [s, h('input', { id: `def-retry-on-${s}`, type: 'checkbox', checked: RETRY_DEFAULTS.on.includes(s) })])),
  };
  const keepRecipe = h('input', { id: 'def-keep-recipe', type: 'checkbox', 'aria-describedby': 'def-keep-help', on: { change: syncRecipe } });
  const keepBox = h('div', { class: 'field check', hidden: true },
    keepRecipe, ' ', h('label', { for: 'def-keep-recipe' }, t('define.keep_recipe')),
    h('p', { class: 'help', id: 'def-keep-help' }));
  const env = h('textarea', { id: 'def-env', name: 'env', rows: '3', spellcheck: 'false', autocomplete: 'off', class: 'mono', placeholder: t('define.env_placeholder') });
  const secrets = h('textarea', { id: 'def-secrets', name: 'secrets', rows: '2', spellcheck: 'false', autocomplete: 'off', class: 'mono', placeholder: t('define.secrets_placeholder') });
  const save = h('button', { type: 'submit', id: 'def-save' }, isNew ? t('define.create_task') : t('define.create_revision'));
  let current = null; // the latest revision (a new revision starts from it)

  retryBox.append(
    h('legend', { class: 'sr-only' }, t('define.retry')),
    h('div', { class: 'form-grid' },
      field('def-retry-max', t('define.retry_max'), retry.max_attempts, t('define.retry_max_help')),
      field('def-retry-delay', t('define.retry_delay'), retry.initial_delay_seconds),
      field('def-retry-factor', t('define.retry_factor'), retry.factor),
      field('def-retry-cap', t('define.retry_cap'), retry.max_delay_seconds)),
    h('div', { class: 'field check' }, retry.jitter, ' ', h('label', { for: 'def-retry-jitter' }, t('define.retry_jitter'))),
    h('fieldset', { class: 'checks-row' }, h('legend', {}, t('define.retry_on')),
      RETRY_ON.map((s) => h('span', { class: 'check' },
        retry.on[s], ' ', h('label', { for: `def-retry-on-${s}` }, t(`status.${s}`))))));

  put(view, h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', {}, heading)),
    problem,
    h('form', { class: 'card define-form', novalidate: true, on: { submit: onSave } },
      isNew ? field('def-task', t('define.task'), name, t('define.task_help')) : null,
      field('def-argv', t('tasks.argv'), argv, t('define.argv_help')),
      argvNote,
      h('div', { class: 'form-grid' },
        field('def-cwd', t('tasks.cwd'), cwd, t('define.cwd_help')),
        field('def-timeout', t('define.timeout'), timeout, t('define.empty_none')),
        field('def-priority', t('run.priority'), priority, t('define.priority_help')),
        field('def-max-concurrent', t('tasks.max_concurrent'), maxConcurrent, t('define.empty_no_limit')),
        field('def-run-as', t('tasks.run_as'), runAs, t('define.run_as_help')),
        field('def-leftovers', t('tasks.leftovers'), leftovers)),
      h('h2', {}, t('define.retry')),
      h('div', { class: 'field check' }, retryOn, ' ', h('label', { for: 'def-retry' }, t('define.retry_enable'))),
      retryBox,
      h('h2', {}, t('tasks.recipe')),
      keepBox,
      field('def-env', t('define.env'), env, t('define.env_help')),
      field('def-secrets', t('define.secrets'), secrets, t('define.secrets_help')),
      h('div', { class: 'actions' }, save,
        isNew ? link(['tasks'], t('define.back_tasks')) : link(['tasks', task], t('define.back_task'))),
      result.el)));

  function syncRetry() { retryBox.disabled = !retryOn.checked; }
  function syncRecipe() {
    const keep = !keepBox.hidden && keepRecipe.checked;
    env.disabled = keep;
    secrets.disabled = keep;
  }

  async function prefill() {
    if (isNew) return;
    const info = await api.get(path('tasks', task), { scope: 'definitions:read', signal });
    const rev = info.latest;
    current = rev;
    const text = argvText(rev.argv);
    argv.value = text === null ? '' : text;
    argvNote.hidden = text !== null;
    cwd.value = rev.cwd || '';
    timeout.value = rev.timeout_seconds ? String(rev.timeout_seconds) : '';
    priority.value = String(rev.priority);
    maxConcurrent.value = rev.max_concurrent ? String(rev.max_concurrent) : '';
    runAs.value = rev.run_as || '';
    leftovers.value = rev.leftovers;
    if (rev.retry) {
      retryOn.checked = true;
      for (const k of ['max_attempts', 'initial_delay_seconds', 'factor', 'max_delay_seconds']) retry[k].value = String(rev.retry[k]);
      retry.jitter.checked = rev.retry.jitter;
      for (const s of RETRY_ON) retry.on[s].checked = rev.retry.on.includes(s);
    }
    syncRetry();
    if (rev.recipe) {
      keepBox.hidden = false;
      keepRecipe.checked = true;
      const help = keepBox.querySelector('.help');
      try {
        const recipe = await api.get(path('recipes', rev.recipe), { scope: 'definitions:read', signal });
        // Keys and secret names only; the environment's values are never put on the page.
        const keys = Object.keys(recipe.env).sort();
        put(help, t('define.keep_recipe_help'), ' ',
          keys.length ? [t('tasks.env_keys'), ': ', raw(keys.join(', '), 'code'), '. '] : null,
          Object.keys(recipe.secrets).length ? [t('define.secrets'), ': ', raw(Object.keys(recipe.secrets).sort().join(', '), 'code'), '.'] : null);
        secrets.value = Object.entries(recipe.secrets).sort().map(([k, v]) => `${k}=${v}`).join('\n');
      } catch (err) {
        put(help, errorBox(err) || '');
      }
    }
    syncRecipe();
  }

  function body() {
    const out = { argv: parseArgv(argv.value) };
    if (!out.argv.length) throw new FormError(t('define.err_argv_empty'));
    if (cwd.value.trim()) out.cwd = cwd.value.trim();
    const numbers = { timeout_seconds: timeout, priority, max_concurrent: maxConcurrent };
    for (const [k, input] of Object.entries(numbers)) {
      const v = numberOrNull(input);
      if (v !== null) out[k] = v;
    }
    if (runAs.value.trim()) out.run_as = runAs.value.trim();
    out.leftovers = leftovers.value;
    if (retryOn.checked) {
      out.retry = {
        max_attempts: numberOrNull(retry.max_attempts),
        initial_delay_seconds: numberOrNull(retry.initial_delay_seconds),
        factor: numberOrNull(retry.factor),
        max_delay_seconds: numberOrNull(retry.max_delay_seconds),
        jitter: retry.jitter.checked,
        on: RETRY_ON.filter((s) => retry.on[s].checked),
      };
      for (const k of Object.keys(out.retry)) if (out.retry[k] === null) delete out.retry[k];
    }
    return out;
  }

  async function nextRevision(name) {
    try {
      const info = await api.get(path('tasks', name), { scope: 'definitions:read' });
      if (isNew) throw new FormError(t('define.err_exists', { task: name }));
      return info.latest_revision + 1;
    } catch (err) {
      if (isNew && err instanceof ApiError && err.code === 'TASK_NOT_FOUND') return 1;
      // A token that may write but not read definitions: revision 1 (an existing task
      // answers 409 REVISION_CONFLICT, or 200 for the very same body).
      if (isNew && err instanceof ApiError && err.status === 403) return 1;
      throw err;
    }
  }

  // The secrets a new recipe names that are not set yet: its runs would fail
  // SECRET_NOT_FOUND. Saving stays allowed (set them before or after); a token that may not
  // list secrets (secrets:write) gets no check.
  async function unsetSecrets(names) {
    if (!can('secrets:write')) return []; // not asked: the answer would be a 403
    const left = new Set(names);
    let cursor = null;
    try {
      for (let pages = 0; pages < 20 && left.size; pages += 1) {
        const page = await api.get(`${path('secrets')}${query({ limit: 200, cursor })}`, { scope: 'secrets:write' });
        for (const s of page.items) left.delete(s.name);
        cursor = page.next_cursor;
        if (!cursor) return [...left].sort();
      }
    } catch {
      return [];
    }
    return [];
  }

  async function onSave(ev) {
    ev.preventDefault();
    result.clear();
    save.disabled = true;
    const taskName = isNew ? name.value.trim() : task;
    try {
      if (isNew && !taskName) throw new FormError(t('define.err_task_empty'));
      if (isNew && !new RegExp(`^(?:${TASK_NAME})$`).test(taskName)) throw new FormError(t('define.err_task_name'));
      const revision = body();
      const n = await nextRevision(taskName);
      let recipe = null;
      let named = [];
      if (!keepBox.hidden && keepRecipe.checked) recipe = current.recipe;
      else {
        const envMap = parsePairs(env.value, t('define.env'));
        const secretMap = parsePairs(secrets.value, t('define.secrets'));
        if (Object.keys(envMap).length || Object.keys(secretMap).length) {
          recipe = (await api.post(path('recipes'), { env: envMap, secrets: secretMap }, { scope: 'definitions:write' })).id;
        }
        named = Object.values(secretMap);
      }
      if (recipe) revision.recipe = recipe;
      const saved = await api.put(path('tasks', taskName, 'revisions', n), revision, { scope: 'definitions:write' });
      const said = t('define.saved', { task: taskName, n: saved.revision });
      const unset = await unsetSecrets(named);
      go(`tasks/${encodeURIComponent(taskName)}`, null,
        unset.length ? `${said} ${t('define.secrets_unset', { names: unset.join(', ') })}` : said,
        unset.length ? 'warn' : 'ok');
    } catch (err) {
      if (err instanceof FormError) result.message(err.message);
      else result.fail(err);
      save.disabled = false;
    }
  }

  prefill().catch((err) => problem.replaceChildren(errorBox(err) || '')).finally(ready);
}
