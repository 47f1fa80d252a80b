// System: readiness (database, disk, worker), version, job isolation and process limit, and
// the storage figures of GET /api/v1/system/storage (admin: any other token is told so).

import { ApiError, call, can, features, session } from '../api.js';
import { h, put, raw } from '../dom.js';
import { has, t, withNodes } from '../i18n.js';
import { bytes, timeEl } from '../format.js';
import { errorBox, every, facts, scopeNote, showProblem } from './common.js';

const CHECKS = ['database', 'disk', 'worker'];

// /readyz's process_limit.held_by (docs/job-user.md "Process limit"), each said in words as
// `qinglong system ready` says it (app/cli/client/render.py); the setting or kernel name in
// a code element, the same in both languages.
const HELD_BY = {
  pids_max: 'pids.max',
  rlimit_nproc: 'RLIMIT_NPROC',
  rlimit_nproc_run_as: 'RLIMIT_NPROC',
  none: null,
};

/** The signed-in token as GET /api/v1/token told it: its name, its scopes, its expiry. */
function tokenFacts() {
  const self = session.self;
  if (!self) return t('system.unknown');
  const scopes = self.scopes.map((one, i) => [i ? ', ' : '', raw(one, 'code')]);
  return [raw(self.name), ' · ', scopes,
    Number.isInteger(self.expires_at_ms) ? [' · ', t('system.token_expires'), ' ', timeEl(self.expires_at_ms)] : null];
}

/** How the worker holds the job process limit: null or absent (no worker answer, an older
 *  one, a 503) is "not reported"; `off`; a number with one of HELD_BY; a word this UI does
 *  not know yet, shown as the API spells it. */
function processLimit(limit) {
  if (!limit || typeof limit !== 'object') return t('system.unknown');
  const { held_by: how, max_processes: most } = limit;
  if (how === 'off') return withNodes('system.process_limit_off', { setting: raw('QL_JOB_MAX_PROCESSES=off', 'code') });
  if (!Number.isInteger(most)) return how ? raw(how, 'code') : t('system.unknown');
  if (!Object.hasOwn(HELD_BY, how)) return [String(most), how ? [' (', raw(how, 'code'), ')'] : null];
  const nodes = { n: String(most), setting: raw(HELD_BY[how], 'code'), run_as: raw('run_as', 'code') };
  const said = withNodes(`system.process_limit_${how}`, nodes);
  // Not enforced: a job can start processes without bound (the worker's start-up warning).
  return how === 'none' ? [h('span', { class: 'tag warn' }, t('system.process_limit_unenforced')), ' ', said] : said;
}

export function systemPage(view, { signal, ready: drawn }) {
  const ready = h('div', { class: 'card' });
  const about = h('div', { class: 'card' });
  const storage = h('div', { class: 'card' });
  put(view, h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', {}, t('system.title'))),
    h('section', {}, h('h2', {}, t('system.readiness')), ready),
    h('section', {}, h('h2', {}, t('system.about')), about),
    h('section', {}, h('h2', {}, t('system.storage')), storage)));

  async function readiness() {
    const r = await call('GET', '/readyz', { raw: true, auth: false, signal });
    const body = await r.json();
    // 200: {"checks": {...}}; 503 NOT_READY: the detail names each failing check.
    const checks = {};
    if (r.ok) Object.assign(checks, body.checks || {});
    else {
      for (const part of (body.detail || '').split(', ')) {
        const i = part.indexOf(': ');
        if (i > 0) checks[part.slice(0, i)] = part.slice(i + 2);
      }
    }
    const names = [...new Set([...CHECKS, ...Object.keys(checks)])];
    put(ready,
      h('p', {}, r.ok
        ? h('span', { class: 'status status-succeeded' }, h('span', { class: 'mark', 'aria-hidden': 'true' }, '✓'), ' ', t('system.ready'))
        : h('span', { class: 'status status-failed' }, h('span', { class: 'mark', 'aria-hidden': 'true' }, '✗'), ' ', t('system.not_ready'))),
      h('ul', { class: 'checks' }, names.map((name) => {
        const value = checks[name];
        const ok = r.ok ? value === 'ok' || value === undefined : value === undefined;
        return h('li', { dataset: { check: name } },
          h('span', { class: `status ${ok ? 'status-succeeded' : 'status-failed'}` },
            h('span', { class: 'mark', 'aria-hidden': 'true' }, ok ? '✓' : '✗'), ' ', ok ? t('system.ok') : t('system.failing')),
          ' ', has(`system.check_${name}`) ? t(`system.check_${name}`) : raw(name),
          !ok && value ? [' — ', raw(value)] : null);
      })));
    // A 503 carries no facts: the last ready answer's stay (they are settings, not health).
    if (r.ok) drawAbout(body);
    return body;
  }

  let version = null;
  let told = {};
  function drawAbout(body) {
    told = body;
    if (version === null) return; // load() draws it once the version is known
    put(about, facts([
      [t('system.version'), version ? raw(version) : t('system.unknown')],
      [t('system.isolation'), told.isolation ? t(`system.isolation_${told.isolation}`) : t('system.unknown')],
      [t('system.process_limit'), h('span', { id: 'process-limit' }, processLimit(told.process_limit))],
      [t('system.api'), raw(session.base || location.origin)],
      [t('system.token'), h('span', { id: 'token-self' }, tokenFacts())],
    ]));
  }

  async function load() {
    try { await readiness(); } catch (err) { put(ready, errorBox(err) || ''); }
    version = (await features()).version || '';
    drawAbout(told);
    try {
      await storageFigures();
    } catch (err) {
      put(storage, errorBox(err) || '');
      return true;
    }
    return false;
  }

  // The storage figures are asked again every 30 s, and every 5 s while they fail (the
  // service stopped), so an error gives way to the figures without a reload. A token
  // without `admin` is not asked again.
  let forbidden = false;
  function pollStorage(failed) {
    if (signal.aborted || forbidden) return;
    const timer = setTimeout(async () => {
      let again = false;
      try { await storageFigures(); } catch (err) {
        if (err.name === 'AbortError') return;
        showProblem(storage, err);
        again = true;
      }
      pollStorage(again);
    }, failed ? 5000 : 30000);
    signal.addEventListener('abort', () => clearTimeout(timer), { once: true });
  }

  async function storageFigures() {
    if (forbidden) return;
    const note = scopeNote('admin', 'system.storage_scope');
    if (note) { // not asked: the answer would be a 403
      forbidden = true;
      put(storage, note);
      return;
    }
    let figures;
    try {
      figures = await call('GET', '/api/v1/system/storage', { scope: 'admin', signal });
    } catch (err) {
      forbidden = err instanceof ApiError && err.status === 403;
      throw err;
    }
    // Each host's last sweep, newest first (several hosts); an older server sends one.
    const sweeps = figures.sweeps || (figures.last_sweep ? [figures.last_sweep] : []);
    delete figures.last_sweep;
    delete figures.sweeps;
    const parts = [figureList(figures)];
    if (!sweeps.length) parts.push(h('h3', {}, t('storage.last_sweep')), h('p', { class: 'muted' }, t('storage.no_sweep')));
    for (const sweep of sweeps) {
      const { host, instance_id: instance, ...rest } = sweep;
      const who = host || instance;
      const several = sweeps.length > 1 && who;
      parts.push(h('h3', {}, several ? t('storage.last_sweep_of', { host: who }) : t('storage.last_sweep')),
        figureList(several || !who ? rest : { host: who, ...rest }));
    }
    put(storage, ...parts);
  }

  // Known figures have a label; one the UI does not know yet is shown by its name.
  function figureList(figures) {
    return facts(Object.entries(figures).map(([k, v]) => [
      has(`storage.${k}`) ? t(`storage.${k}`) : raw(k),
      renderFigure(k, v),
    ]));
  }

  function renderFigure(key, value) {
    if (value === null || value === undefined) return key === 'total_log_bytes_budget' ? t('tasks.no_limit') : '—';
    if (typeof value === 'boolean') return value ? t('storage.yes') : t('storage.no');
    if (typeof value === 'number' && /bytes/.test(key)) return bytes(value);
    if (typeof value === 'number' && key === 'at_ms') return timeEl(value);
    if (typeof value === 'number' && /_ms$/.test(key)) return t('storage.ms', { n: value });
    if (typeof value === 'object') return raw(JSON.stringify(value), 'code');
    return raw(value);
  }

  load().then(pollStorage).finally(drawn);
  every(5000, signal, readiness, (err) => showProblem(ready, err));
}
