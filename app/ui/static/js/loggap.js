// Where a truncated log's gap (docs/api.md, `log.dropped_at`, a byte offset) falls in the
// text of one SSE chunk of that log.
//
// Each chunk is the log's bytes [start, end) decoded on their own (app/api/routes_logs.py:
// `offset` is its first byte, the event's id the byte after its last; a chunk ends on a
// character's boundary). A character that is its own UTF-8 form stands for as many bytes as
// TextEncoder makes of it; a U+FFFD may stand for 1 to 3 bytes that were no UTF-8, so nothing
// is counted across one. The log's head and its tail are cut at any byte: a character's first
// bytes before the gap and another's last bytes after it decode, joined, to replacement
// characters, or even to a third, valid character across the gap. Such a few characters are
// the gap's `window`: to be decoded again from the log's bytes, each side on its own.

const REPLACEMENT = '\uFFFD';
const encoder = new TextEncoder();

/**
 * Where byte `gap` (start <= gap < end) falls in `text`, the log's bytes [start, end):
 * `{ at }`, the index of the gap's first character after it; or `{ window: [from, to],
 * bytes: [fromByte, toByte] }` when the characters [from, to), decoded from the bytes
 * [fromByte, toByte), hold bytes from both sides of it; null if `end` is not known.
 */
export function locateGap(text, start, end, gap) {
  // From the chunk's start, up to its first replacement character.
  const bad = text.indexOf(REPLACEMENT);
  const head = bad < 0 ? text : text.slice(0, bad);
  const fit = encoder.encodeInto(head, new Uint8Array(gap - start));
  if (fit.written === gap - start) return { at: fit.read };
  if (!Number.isInteger(end)) return null;
  // From the chunk's end, back to its last replacement character.
  const last = text.lastIndexOf(REPLACEMENT);
  const tail = text.slice(last + 1);
  const tailStart = end - encoder.encode(tail).length;
  let to = last + 1;
  let toByte = tailStart;
  if (gap >= tailStart) {
    // The tail's first characters that fit before the gap: all of its bytes there, or the
    // gap falls inside the next one.
    const before = encoder.encodeInto(tail, new Uint8Array(gap - tailStart));
    if (before.written === gap - tailStart) return { at: last + 1 + before.read };
    // A valid character across the gap: the window ends after it.
    if (before.read >= tail.length) return null; // the bytes and the text disagree
    const across = String.fromCodePoint(tail.codePointAt(before.read));
    to = last + 1 + before.read + across.length;
    toByte = tailStart + before.written + encoder.encode(across).length;
  }
  return { window: [fit.read, to], bytes: [start + fit.written, toByte] };
}
