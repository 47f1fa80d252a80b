// A line diff (longest common subsequence) for the side-by-side view of two revisions.

/** Rows [{left, right, kind}] with kind 'same', 'changed', 'removed' or 'added'. */
export function sideBySide(a, b) {
  const n = a.length;
  const m = b.length;
  const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i -= 1) {
    for (let j = m - 1; j >= 0; j -= 1) {
      lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const ops = [];
  let i = 0;
  let j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { ops.push({ left: a[i], right: b[j], kind: 'same' }); i += 1; j += 1; }
    else if (i < n && (j >= m || lcs[i + 1][j] >= lcs[i][j + 1])) { ops.push({ left: a[i], right: null, kind: 'removed' }); i += 1; }
    else { ops.push({ left: null, right: b[j], kind: 'added' }); j += 1; }
  }
  // Pair a run of removals with the additions right after it: one "changed" row each.
  const rows = [];
  for (let k = 0; k < ops.length;) {
    if (ops[k].kind !== 'removed') { rows.push(ops[k]); k += 1; continue; }
    const removed = [];
    while (k < ops.length && ops[k].kind === 'removed') { removed.push(ops[k].left); k += 1; }
    const added = [];
    while (k < ops.length && ops[k].kind === 'added') { added.push(ops[k].right); k += 1; }
    for (let x = 0; x < Math.max(removed.length, added.length); x += 1) {
      const left = x < removed.length ? removed[x] : null;
      const right = x < added.length ? added[x] : null;
      rows.push({ left, right, kind: left !== null && right !== null ? 'changed' : left !== null ? 'removed' : 'added' });
    }
  }
  return rows;
}

/** Two recipes (either may be null) as the compare shows them: environment keys with a word
 *  for their value, never the value itself (words.value; words.other on the new side for a
 *  key whose value differs from the old side's), and the secret each key is read from.
 *  A changed value is then one changed line, where the recipe's digest alone said only that
 *  something in it changed. */
export function recipesShown(a, b, words) {
  const side = (r, old) => {
    if (!r) return null;
    const env = {};
    for (const k of Object.keys(r.env || {}).sort()) {
      const differs = old && k in (old.env || {}) && old.env[k] !== r.env[k];
      env[k] = differs ? words.other : words.value;
    }
    const secrets = {};
    for (const k of Object.keys(r.secrets || {}).sort()) secrets[k] = r.secrets[k];
    return { env, secrets };
  };
  return [side(a, null), side(b, a)];
}

/** The lines a revision is compared by: its body as indented JSON, fields in a fixed order;
 *  with shown (recipesShown), its recipe's keys and secret names. */
export function revisionLines(rev, shown = null) {
  const keep = ['executor', 'argv', 'cwd', 'recipe', 'timeout_seconds', 'priority', 'leftovers', 'run_as', 'max_concurrent'];
  const body = {};
  for (const k of keep) if (k in rev) body[k] = rev[k];
  // After the fields both sides have: an environment that one side lacks is then lines
  // added (or removed) of their own, not paired with the next field as "changed".
  if (shown) { body.env = shown.env; body.secrets = shown.secrets; }
  for (const k of Object.keys(rev).sort()) {
    if (!(k in body) && !['task', 'revision', 'digest', 'created_at_ms'].includes(k)) body[k] = rev[k];
  }
  return JSON.stringify(body, null, 2).split('\n');
}
