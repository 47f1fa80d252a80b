// Sign-in: the token is pasted once and kept in sessionStorage for this tab only.

import { ApiError, api, explainError, learnSelf, session } from '../api.js';
import { h, put } from '../dom.js';
import { t } from '../i18n.js';

export function signInPage(view, { message, onDone }) {
  const token = h('input', {
    id: 'token', name: 'token', type: 'password', autocomplete: 'off', spellcheck: 'false',
    required: true, 'aria-describedby': 'token-help',
  });
  const base = h('input', { id: 'api-base', name: 'api-base', type: 'url', placeholder: location.origin, autocomplete: 'url', 'aria-describedby': 'api-base-help' });
  const error = h('p', { class: 'form-error', role: 'alert' });
  const submit = h('button', { type: 'submit' }, t('signin.submit'));
  // novalidate: an empty token is told in the page's own words (signin.empty).
  const form = h('form', { class: 'card signin', novalidate: true, on: { submit: onSubmit } },
    h('h1', {}, t('signin.title')),
    message ? h('p', { class: 'notice notice-warn' }, message) : null,
    h('label', { for: 'token' }, t('signin.token')),
    token,
    h('p', { id: 'token-help', class: 'help' }, t('signin.token_help')),
    h('details', {},
      h('summary', {}, t('signin.advanced')),
      h('label', { for: 'api-base' }, t('signin.api_base')),
      base,
      h('p', { id: 'api-base-help', class: 'help' }, t('signin.api_base_help'))),
    error,
    h('div', { class: 'actions' }, submit));
  put(view, form);
  token.focus();

  async function onSubmit(ev) {
    ev.preventDefault();
    error.textContent = '';
    const value = token.value.trim();
    if (!value) {
      error.textContent = t('signin.empty');
      token.focus();
      return;
    }
    submit.disabled = true;
    session.signIn(value, base.value.trim());
    try {
      // Any answer but 401 proves the token. Its scopes are kept, so that each page offers
      // only what the token may do. An older server answers 404 without looking at the token:
      // then a route every version has checks it (a token without runs:read gets a 403).
      if (await learnSelf({ signInCheck: true }) === null) {
        await api.get('/api/v1/runs?limit=1', { signInCheck: true, scope: 'runs:read' });
      }
    } catch (err) {
      if (!(err instanceof ApiError) || err.status === 401 || err.status === 0) {
        session.signOut();
        error.textContent = err instanceof ApiError && err.status === 401 ? t('signin.refused') : explainError(err);
        submit.disabled = false;
        token.focus();
        return;
      }
    }
    token.value = '';
    onDone();
  }
}
