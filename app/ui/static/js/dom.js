// DOM building without HTML parsing: every string becomes a Text node or an attribute
// value, so a task name, a log line or an error detail can never become markup or script.
// No module of the UI uses innerHTML, outerHTML, insertAdjacentHTML or document.write
// (tests/unit/test_ui_static.py checks it).

const FORBIDDEN_ATTR = /^on/i;

/** Create an element: h('a', {href: '#/runs', class: 'x', on: {click: fn}}, 'text', child). */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'on') for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (FORBIDDEN_ATTR.test(key)) throw new Error(`no inline handlers: ${key}`);
    else if (key === 'value') el.value = value;
    else if (key === 'checked' || key === 'disabled' || key === 'selected') el[key] = Boolean(value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  add(el, children);
  return el;
}

/** Append children: nodes as they are, anything else as text. */
export function add(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace all children of el. */
export function put(el, ...children) {
  el.replaceChildren();
  return add(el, children);
}

/** Data from the API or the user (names, ids, codes, log text): shown as is, never translated. */
export function raw(text, tag = 'span') {
  return h(tag, { class: 'raw' }, text === null || text === undefined ? '' : String(text));
}

/** A link inside the UI; path segments are encoded, so a name cannot leave its segment. */
export function link(parts, ...children) {
  const href = '#/' + parts.map((p) => encodeURIComponent(String(p))).join('/');
  return h('a', { href }, ...children);
}
