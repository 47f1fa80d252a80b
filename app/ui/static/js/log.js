// Follow an attempt's log over the SSE endpoint (GET .../log?follow=true).
//
// EventSource cannot send an Authorization header, so the stream is read with fetch and
// parsed here. Each `chunk` event's id is the byte offset after it; after a dropped
// connection the follower reconnects with `Last-Event-ID: <that offset>`, so no byte is shown
// twice or skipped. `end` carries the attempt's terminal status; `error` a refused token.

import { ApiError, call, path } from './api.js';

export class LogFollower {
  /** `tailBytes`: start that many bytes before the log's end (a reconnect resumes at its
   *  `Last-Event-ID` all the same). */
  constructor(runId, number, { onText, onState, onEnd, onError }, { tailBytes = null } = {}) {
    const tail = Number.isInteger(tailBytes) ? `&tail_bytes=${tailBytes}` : '';
    this.url = `${path('runs', runId, 'attempts', number, 'log')}?follow=true${tail}`;
    this.handlers = { onText, onState, onEnd, onError };
    this.offset = null; // the last event id seen: where a reconnect resumes
    this.stopped = false;
    this.connection = null;
    this.reconnects = 0;
  }

  start() {
    this.loop();
    return this;
  }

  stop() {
    this.stopped = true;
    if (this.connection) this.connection.abort();
  }

  /** Drop the current connection as a network failure would (the follower resumes). */
  drop() {
    if (this.connection) this.connection.abort('drop');
  }

  async loop() {
    while (!this.stopped) {
      const ended = await this.connect().catch((err) => {
        if (err instanceof ApiError && err.status >= 400 && err.status < 500) {
          this.handlers.onError(err);
          this.stopped = true;
        }
        return false;
      });
      if (ended || this.stopped) return;
      this.reconnects += 1;
      this.handlers.onState('reconnecting');
      await new Promise((resolve) => setTimeout(resolve, Math.min(5000, 500 * this.reconnects)));
    }
  }

  async connect() {
    this.connection = new AbortController();
    const headers = { Accept: 'text/event-stream' };
    if (this.offset !== null) headers['Last-Event-ID'] = String(this.offset);
    const r = await call('GET', this.url, { raw: true, headers, signal: this.connection.signal, scope: 'logs:read' });
    this.handlers.onState('live');
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return false;
        buffer += value.replace(/\r\n?/g, '\n');
        let cut;
        while ((cut = buffer.indexOf('\n\n')) >= 0) {
          const frame = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          if (this.frame(frame)) return true;
        }
      }
    } catch (err) {
      if (this.stopped) return true;
      return false; // dropped: the loop reconnects from this.offset
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  /** Handle one SSE frame; true when the stream is over. */
  frame(text) {
    let event = 'message';
    let id = null;
    const data = [];
    for (const line of text.split('\n')) {
      if (!line || line.startsWith(':')) continue; // heartbeat comment
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
      if (field === 'event') event = value;
      else if (field === 'id') id = value;
      else if (field === 'data') data.push(value);
    }
    if (!data.length) return false;
    const payload = JSON.parse(data.join('\n'));
    if (event === 'chunk') {
      // The text, the byte offset of its first byte and that after its last (the page finds
      // a truncated log's gap in it by these).
      this.handlers.onText(payload.text, payload.offset, id === null ? null : Number(id));
      if (id !== null) this.offset = Number(id);
      return false;
    }
    if (event === 'end') {
      this.handlers.onEnd(payload);
      this.stopped = true;
      return true;
    }
    if (event === 'error') {
      // The status the same refusal has as an answer; an unknown code is shown with its own
      // words (problem.CODE) or as itself, never as a signed-out token.
      const status = {
        UNAUTHENTICATED: 401, FORBIDDEN: 403, LOG_EXPIRED: 410, LOG_MISSING: 410,
        RUN_NOT_FOUND: 404, ATTEMPT_NOT_FOUND: 404,
      }[payload.code] || 400;
      this.handlers.onError(new ApiError(status, payload, 'logs:read'));
      this.stopped = true;
      return true;
    }
    return false;
  }
}
