// System: readiness (database, disk, worker), version, job isolation, and the storage
// figures of GET /api/v1/system/storage (admin: any other token is told so).

import { ApiError, call, features, session } from '../api.js';
import { h, put, raw } from '../dom.js';
import { has, t } from '../i18n.js';
import { bytes, timeEl } from '../format.js';
import { errorBox, every, facts, showProblem } from './common.js';

const CHECKS = ['database', 'disk', 'worker'];

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
    return body;
  }

  async function load() {
    let body = {};
    try { body = await readiness(); } catch (err) { put(ready, errorBox(err) || ''); }
    const f = await features();
    put(about, facts([
      [t('system.version'), f.version ? raw(f.version) : t('system.unknown')],
      [t('system.isolation'), body.isolation ? t(`system.isolation_${body.isolation}`) : t('system.unknown')],
      [t('system.api'), raw(session.base || location.origin)],
    ]));
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
