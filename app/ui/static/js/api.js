// The one way the UI talks to the server: the public REST API with a bearer token.
// The token lives in sessionStorage only (never a cookie, never a URL); sign-out forgets it.

import { has, t } from './i18n.js';

const TOKEN_KEY = 'ql.token';
const BASE_KEY = 'ql.api';
// The token's own facts (GET /api/v1/token: name and scopes; never a secret), kept with it.
const SELF_KEY = 'ql.self';

export const session = {
  get token() { return sessionStorage.getItem(TOKEN_KEY); },
  // '' is this origin; another origin needs QL_CORS_ORIGINS on that server (docs/ui.md).
  get base() { return sessionStorage.getItem(BASE_KEY) || ''; },
  /** {name, scopes, expires_at_ms} of the token, or null when the server did not say. */
  get self() {
    try { return JSON.parse(sessionStorage.getItem(SELF_KEY)); } catch { return null; }
  },
  signIn(token, base) {
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.removeItem(SELF_KEY);
    if (base) sessionStorage.setItem(BASE_KEY, base.replace(/\/+$/, ''));
    else sessionStorage.removeItem(BASE_KEY);
  },
  /** Keep what GET /api/v1/token answered (its scopes never change while the token lives). */
  know(self) {
    if (self && Array.isArray(self.scopes)) sessionStorage.setItem(SELF_KEY, JSON.stringify(self));
  },
  signOut() {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(BASE_KEY);
    sessionStorage.removeItem(SELF_KEY);
  },
};

/** Whether the token holds every scope of a call ("definitions:write runs:write": both);
 *  admin implies all. True when the server did not say (a server without GET /api/v1/token):
 *  the control is offered, and a 403 names the scope, as before. */
export function can(scopes) {
  const self = session.self;
  if (!self) return true;
  const held = new Set(self.scopes);
  return held.has('admin') || scopes.split(' ').every((one) => held.has(one));
}

/** Ask the server who the token is (GET /api/v1/token) and keep it; null if it did not say. */
export async function learnSelf(opts = {}) {
  try {
    const self = await call('GET', '/api/v1/token', opts);
    session.know(self);
    return self;
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return null; // an older server
    throw err;
  }
}

export class ApiError extends Error {
  constructor(status, problem, scope) {
    super(problem.detail || problem.code || `HTTP ${status}`);
    this.status = status;
    this.code = problem.code || (status ? 'HTTP_ERROR' : 'NETWORK');
    this.detail = problem.detail || '';
    this.scope = scope || null;
  }

  /** The scope a 403 named (the server's detail says "lacks the X scope"), else the route's. */
  get missingScope() {
    const m = /lacks the (\S+) scope/.exec(this.detail);
    return m ? m[1] : this.scope;
  }
}

let unauthorized = () => {};
export function onUnauthorized(fn) { unauthorized = fn; }

// Called once at the next answer the server gives (any status: it was reached), then dropped.
const answered = new Set();
export function onNextAnswer(fn) { answered.add(fn); }

/** A request under /api/v1 (or any path of the server); JSON in and out unless raw. */
export async function call(method, path, { body, scope, headers, raw, signal, auth = true, signInCheck = false } = {}) {
  const sent = { ...(headers || {}) };
  if (auth && session.token) sent.Authorization = `Bearer ${session.token}`;
  if (body !== undefined) sent['Content-Type'] = 'application/json';
  let r;
  try {
    r = await fetch(session.base + path, {
      method,
      headers: sent,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: 'no-store',
      credentials: 'omit',
      referrerPolicy: 'no-referrer',
    });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(0, { code: 'NETWORK' }, scope);
  }
  const waiting = [...answered];
  answered.clear();
  for (const fn of waiting) fn();
  if (!r.ok && !(raw && r.status === 503 && path === '/readyz')) {
    let problem = {};
    try { problem = await r.json(); } catch { /* not problem+json */ }
    const err = new ApiError(r.status, problem, scope);
    if (r.status === 401 && auth && !signInCheck) unauthorized(err);
    throw err;
  }
  if (raw) return r;
  if (r.status === 204) return null;
  return r.json();
}

export const api = {
  get: (path, opts) => call('GET', path, opts),
  post: (path, body, opts) => call('POST', path, { ...opts, body }),
  put: (path, body, opts) => call('PUT', path, { ...opts, body }),
  del: (path, opts) => call('DELETE', path, opts),
};

/** Path of an API resource from segments, each encoded. */
export function path(...parts) {
  return '/api/v1/' + parts.map((p) => encodeURIComponent(String(p))).join('/');
}

/** A query string from an object, skipping empty values. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : '';
}

let featuresPromise = null;
/** What the server says of itself in its OpenAPI document (read once): its version. */
export function features() {
  if (!featuresPromise) {
    featuresPromise = call('GET', '/openapi.json', { auth: false })
      .then((doc) => ({ version: (doc.info && doc.info.version) || null }))
      .catch(() => ({ version: null }));
  }
  return featuresPromise;
}

/** Words for an error: a 403 names the missing scope; known codes have their own label. */
export function explainError(err) {
  if (!(err instanceof ApiError)) return t('error.unexpected');
  if (err.status === 403) {
    const scope = err.missingScope || '?';
    return t(scope === 'admin' ? 'error.forbidden_admin' : 'error.forbidden', { scope });
  }
  if (err.status === 401) return t('error.unauthenticated');
  if (err.status === 0) return t('error.network');
  const key = `problem.${err.code}`;
  if (has(key)) return t(key);
  // A 5xx is the server failing (a bug, an outage), not a refusal of what was asked.
  if (err.status >= 500) return t('error.server', { status: err.status, code: err.code });
  return t('error.status', { status: err.status, code: err.code });
}
