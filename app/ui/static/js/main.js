// Start-up, the hash router and the frame (navigation, language switch, sign-out).

import { can, learnSelf, onUnauthorized, session } from './api.js';
import { h, put } from './dom.js';
import { LANGUAGES, language, loadLanguage, preferredLanguage, t } from './i18n.js';
import { runsPage } from './pages/runs.js';
import { runPage } from './pages/run.js';
import { tasksPage, taskPage } from './pages/tasks.js';
import { definePage } from './pages/define.js';
import { schedulesPage, schedulePage } from './pages/schedules.js';
import { scheduleFormPage } from './pages/schedule-form.js';
import { secretsPage } from './pages/secrets.js';
import { systemPage } from './pages/system.js';
import { signInPage } from './pages/signin.js';
import { settle } from './pages/common.js';

const ROUTES = [
  [/^runs$/, runsPage, 'runs'],
  [/^runs\/([^/]+)$/, runPage, 'runs'],
  [/^tasks$/, tasksPage, 'tasks'],
  [/^tasks\/([^/]+)$/, taskPage, 'tasks'],
  [/^new-task$/, definePage, 'tasks'],
  [/^tasks\/([^/]+)\/new-revision$/, definePage, 'tasks'],
  [/^schedules$/, schedulesPage, 'schedules'],
  [/^schedules\/([^/]+)$/, schedulePage, 'schedules'],
  [/^new-schedule$/, scheduleFormPage, 'schedules'],
  [/^schedules\/([^/]+)\/edit$/, scheduleFormPage, 'schedules'],
  [/^secrets$/, secretsPage, 'secrets'],
  [/^system$/, systemPage, 'system'],
];
const NAV = ['runs', 'tasks', 'schedules', 'secrets', 'system'];

/** Where a sign-in with no page asked for lands: the first page the token may read (a token
 *  for secrets alone landed on a refused runs list). */
function home() {
  if (can('runs:read')) return 'runs';
  if (can('definitions:read')) return 'tasks';
  return can('secrets:write') ? 'secrets' : 'system';
}

let stopPage = () => {};
let signInMessage = null;
let pendingNotice = null;
let rendered = false;
// What the page's forms held when a 401 sent the user to sign in again ({route, fields}: each
// field's id and value), in this module only (never stored: an environment value may be in
// it), put back once that page is drawn again: a revoked token must not cost a typed script.
// The language switch draws the page again too, and keeps what was typed the same way
// (quiet: it says nothing, as nothing happened to the user's typing).
let draft = null;

function takeDraft(route, quiet = false) {
  const fields = {};
  // A password field (a secret's value) is never kept, as the page itself never keeps one.
  for (const el of document.querySelectorAll('#view form :is(input, textarea, select)[id]:not([type=password])')) {
    fields[el.id] = el.matches('[type=checkbox], [type=radio]') ? el.checked : el.value;
  }
  draft = Object.keys(fields).length ? { route, fields, quiet } : null;
}

/** Put a draft of this route back (then the page's own listeners see each change); true if so. */
function restoreDraft(view, route) {
  if (!draft || draft.route !== route) return false;
  const { fields } = draft;
  const found = Object.keys(fields).map((id) => view.querySelector(`#${CSS.escape(id)}`)).filter(Boolean);
  // Signed in again with a token that may not use this form (the page says which scope it
  // lacks): the draft is kept for a token that may, until the user goes elsewhere.
  if (!found.length) return false;
  draft = null;
  const changed = [];
  for (const [id, value] of Object.entries(fields)) {
    const el = view.querySelector(`#${CSS.escape(id)}`);
    if (!el || el.readOnly || el.disabled) continue; // shown only: never what was typed
    const key = typeof value === 'boolean' ? 'checked' : 'value';
    if (el[key] === value) continue;
    el[key] = value;
    changed.push(el);
  }
  for (const el of changed) {
    const type = el.matches('[type=checkbox], [type=radio], select') ? 'change' : 'input';
    el.dispatchEvent(new Event(type, { bubbles: true }));
  }
  return changed.length > 0;
}

function parseHash() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [p, q] = hash.split('?', 2);
  return { path: p, params: new URLSearchParams(q || '') };
}

/** Go to a route of the UI, e.g. go('runs', {task: 'x'}); notice is shown on the new page. */
export function go(where, params, notice, kind = 'ok') {
  pendingNotice = notice ? [notice, kind] : null;
  const q = params ? new URLSearchParams(Object.entries(params).filter(([, v]) => v)).toString() : '';
  const target = `#/${where}${q ? `?${q}` : ''}`;
  if (location.hash === target) render();
  else location.hash = target;
}

export function notify(text, kind = 'info') {
  const box = document.getElementById('notice');
  put(box, text ? h('p', { class: `notice notice-${kind}` }, text) : null);
}

function frame(active) {
  const nav = document.getElementById('nav');
  const signedIn = Boolean(session.token);
  nav.hidden = !signedIn;
  nav.setAttribute('aria-label', t('nav.label'));
  put(nav, NAV.map((name) => h('a', {
    href: `#/${name}`,
    class: name === active ? 'active' : null,
    'aria-current': name === active ? 'page' : null,
  }, t(`nav.${name}`))));
  const out = document.getElementById('signout');
  out.hidden = !signedIn;
  out.textContent = t('signin.signout');
  document.getElementById('skip-link').textContent = t('nav.skip');
  document.getElementById('lang-label').textContent = t('nav.language');
  const select = document.getElementById('lang');
  select.setAttribute('aria-label', t('nav.language'));
  put(select, Object.entries(LANGUAGES).map(([code, name]) =>
    h('option', { value: code, selected: code === language(), lang: code }, name)));
}

function render() {
  stopPage();
  stopPage = () => {};
  const view = document.getElementById('view');
  const { path, params } = parseHash();
  if (!session.token || path === 'signin') {
    frame(null);
    document.title = `${t('signin.title')} · qinglong-control`;
    const message = signInMessage;
    signInMessage = null;
    // Back to where the user was headed: the page asked for, or ?next= of #/signin.
    const next = path === 'signin' ? params.get('next') : location.hash.replace(/^#\/?/, '');
    view.setAttribute('aria-busy', 'false');
    rendered = true;
    signInPage(view, {
      message,
      onDone: () => {
        const target = `#/${next || home()}`;
        if (location.hash === target) render();
        else location.hash = target;
      },
    });
    return;
  }
  for (const [re, page, section] of ROUTES) {
    const m = re.exec(path);
    if (!m) continue;
    frame(section);
    document.title = `${t(`nav.${section}`)} · qinglong-control`;
    notify(...(pendingNotice || [null]));
    pendingNotice = null;
    const controller = new AbortController();
    const args = m.slice(1).map((s) => decodeURIComponent(s));
    put(view, h('p', { class: 'loading' }, t('common.loading')));
    // aria-busy until the page drew its first data (the browser tests wait for it too).
    view.setAttribute('aria-busy', 'true');
    const route = location.hash.replace(/^#\/?/, '');
    if (draft && draft.route !== route) draft = null; // signed in and gone elsewhere: dropped
    let drawn = false;
    let held = [];
    const ready = () => {
      if (controller.signal.aborted) return;
      drawn = true;
      view.setAttribute('aria-busy', 'false');
      for (const form of held) form.inert = false;
      for (const body of view.querySelectorAll('tbody')) settle(body); // a call that failed too
      for (const item of view.querySelectorAll('li.loading-row')) { item.closest('[aria-busy]')?.setAttribute('aria-busy', 'false'); item.remove(); }
      const quiet = Boolean(draft && draft.quiet);
      if (restoreDraft(view, route) && !quiet) notify(t('signin.draft_restored'));
    };
    const stop = page(view, { args, params, signal: controller.signal, ready });
    // The page's forms take no typing until its first data is drawn: a value typed meanwhile
    // was overwritten by the stored one arriving (a task's retention, a new revision's
    // prefill) and the save then sent what the user had not typed.
    if (!drawn) {
      held = [...view.querySelectorAll('form')];
      for (const form of held) form.inert = true;
    }
    // A table still waiting for its first answer is busy (its row says "Loading…").
    for (const row of view.querySelectorAll('tr.loading-row')) row.closest('table').setAttribute('aria-busy', 'true');
    stopPage = () => { controller.abort(); if (typeof stop === 'function') stop(); };
    // After a navigation the keyboard (and a screen reader) starts at the new content, and
    // the new page is seen from its top (its heading, a notice), not at the old offset.
    if (rendered) {
      view.focus({ preventScroll: true });
      window.scrollTo(0, 0);
    }
    rendered = true;
    return;
  }
  go(home());
}

async function start() {
  await loadLanguage(preferredLanguage());
  onUnauthorized(() => {
    session.signOut();
    signInMessage = t('signin.expired');
    // Back to the very page after signing in again, its filters (?task=, ?status=) included.
    // A page's other requests answered 401 too: the first one's ?next= is kept.
    const { path } = parseHash();
    if (path === 'signin') return;
    const here = location.hash.replace(/^#\/?/, '');
    takeDraft(here);
    location.hash = `#/signin${path ? `?next=${encodeURIComponent(here)}` : ''}`;
  });
  document.getElementById('lang').addEventListener('change', async (ev) => {
    if (session.token && parseHash().path !== 'signin') takeDraft(location.hash.replace(/^#\/?/, ''), true);
    await loadLanguage(ev.target.value, true);
    render();
    // The same page in the other language: no navigation, so the keyboard stays on the switch
    // (an arrow key changes it at once; the focus must not jump into the page meanwhile).
    ev.target.focus();
  });
  document.getElementById('signout').addEventListener('click', () => {
    session.signOut();
    draft = null;
    stopPage();
    stopPage = () => {};
    notify(null);
    location.hash = '#/signin';
  });
  // "Skip to content" moves the focus to the page's content. Its href="#view" is for a
  // browser without scripts: followed, it would be a route the router does not know.
  document.getElementById('skip-link').addEventListener('click', (ev) => {
    ev.preventDefault();
    document.getElementById('view').focus();
  });
  // Escape hides a time's UTC box shown on hover (WCAG 1.4.13: hover content can be
  // dismissed without moving the pointer); leaving the time lets it show again.
  const root = document.documentElement;
  document.addEventListener('keydown', (ev) => {
    if (ev.key === 'Escape') root.classList.add('utc-dismissed');
  });
  document.addEventListener('mouseout', (ev) => {
    if (ev.target instanceof Element && ev.target.closest('time')) root.classList.remove('utc-dismissed');
  });
  window.addEventListener('hashchange', render);
  // A tab signed in before the server said what a token may do (or while it could not
  // answer) learns it once, before the first page is drawn from it. A 401 here is left to the
  // page's own first call (one sign-in view, with its notice), and a server that does not
  // answer within 3 s does not hold the page blank.
  if (session.token && !session.self) {
    try {
      await learnSelf({ signInCheck: true, signal: AbortSignal.timeout(3000) });
    } catch { /* the page's own calls say what is wrong */ }
  }
  render();
}

start();
