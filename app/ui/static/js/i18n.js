// One dictionary per language (../i18n/<lang>.json, the same keys in each); every label of
// the UI goes through t(). The language comes from the browser unless the user chose one.

export const LANGUAGES = { en: 'English', 'zh-CN': '简体中文' };
const STORE_KEY = 'ql.lang';
let dict = {};
let current = 'en';

export function preferredLanguage() {
  const saved = localStorage.getItem(STORE_KEY);
  if (saved && saved in LANGUAGES) return saved;
  for (const tag of navigator.languages || [navigator.language || 'en']) {
    if (/^zh\b/i.test(tag)) return 'zh-CN';
    if (/^en\b/i.test(tag)) return 'en';
  }
  return 'en';
}

export async function loadLanguage(lang, remember = false) {
  const r = await fetch(new URL(`../i18n/${lang}.json`, import.meta.url), { cache: 'no-cache' });
  if (!r.ok) throw new Error(`dictionary ${lang}: ${r.status}`);
  dict = await r.json();
  current = lang;
  document.documentElement.lang = lang;
  if (remember) localStorage.setItem(STORE_KEY, lang);
}

export function language() {
  return current;
}

export function has(key) {
  return Object.prototype.hasOwnProperty.call(dict, key);
}

/** The label for key, with {name} placeholders filled from params. */
export function t(key, params) {
  let text = dict[key];
  if (text === undefined) {
    console.error(`missing label ${key}`);
    text = key;
  }
  return text.replace(/\{(\w+)\}/g, (m, name) =>
    params && name in params ? String(params[name]) : m);
}

/** A label whose {placeholders} are nodes (code elements), not text: an array for h(). */
export function withNodes(key, nodes) {
  return t(key).split(/\{(\w+)\}/).map((part, i) => (i % 2 ? nodes[part] ?? `{${part}}` : part));
}

/** t(prefix + value) when the dictionary has it, else the value itself (shown raw). */
export function tOr(prefix, value) {
  return has(prefix + value) ? t(prefix + value) : null;
}
