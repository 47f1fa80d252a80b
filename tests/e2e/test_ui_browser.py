"""The web UI in a real browser against a real ``qinglong serve`` (docs/ui.md §4).

One SQLite service and one chromium, so one test that walks the flows in turn: pytest-xdist
would spread separate tests over workers, each paying for its own service and browser (its
``loadgroup`` mode does not group under pytest 9.2). Each flow opens a fresh browser context,
so nothing of one sign-in leaks into the next. Screenshots of every page go to a pytest tmp dir (and to ``QL_UI_SCREENSHOTS_DIR``
when set: that is how docs/ui/*.png are refreshed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

import httpx
import pytest

from app.api.api_docs import SWAGGER_UI
from app.domain.artifacts import log_head_bytes, log_tail_bytes
from app.domain.ids import now_ms
from app.domain.tokens import new_api_token
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.runs_repo import RunRepository
from app.storage.tokens_repo import TokenRepository
from app.supervisor.stop_jobs import SERVICE_STOP_REASON
from tests.browser import ZH_AS_IS_WORDS, browser_or_skip
from tests.e2e.conftest import Served, ServeFactory, wait_until
from tests.e2e.kit import TERMINAL, enqueue, get_run, put_task, read_log, wait_status
from tests.kit import web
from tests.kit.partition import network_unchanged

XSS = "<img src=x onerror=alert(1)>"
STATIC = Path(__file__).resolve().parents[2] / "app" / "ui" / "static"
WAIT_MS = 20_000


@dataclass
class Site:
    served: Served
    browser: Any
    read_only: str
    gate: Path
    shots: Path
    finished_run: str
    schedule: str
    expiring_run: str

    @property
    def ui(self) -> str:
        return f"{self.served.base_url}/ui/"

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return web.request(method, f"{self.served.base_url}{path}", headers=self.served.auth, **kw)

    def page(
        self, *, locale: str = "en-US", width: int = 1280, timezone_id: str | None = None
    ) -> Any:
        """A page in a new context; ``timezone_id`` its zone (else this machine's, UTC)."""
        context = self.browser.new_context(
            viewport={"width": width, "height": 800}, locale=locale, accept_downloads=True,
            timezone_id=timezone_id,
        )  # fmt: skip
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        page.errors = []
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        return page

    def sign_in(self, page: Any, token: str | None = None, *, path: str = "") -> None:
        page.goto(self.ui + (f"#/{path}" if path else ""))
        page.fill("#token", token or self.served.token)
        page.click("form.signin button[type=submit]")
        page.wait_for_selector("#signout:visible")

    def visit(self, page: Any, route: str) -> None:
        """Open ``#/route`` and wait until the page drew its first data (``aria-busy``)."""
        url = self.ui + f"#/{route}"
        if page.url != url:
            # Marked busy first: a hash change renders the new page only on the next task.
            page.evaluate("document.getElementById('view').setAttribute('aria-busy', 'true')")
            page.goto(url)
        page.wait_for_selector("main[aria-busy=false]")

    def visit_by(self, page: Any, action: Any) -> None:
        """Do ``action`` (a click that changes the route) and wait for the new page's data."""
        page.evaluate("document.getElementById('view').setAttribute('aria-busy', 'true')")
        action()
        page.wait_for_selector("main[aria-busy=false]")

    def shot(self, page: Any, name: str) -> None:
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        extra = os.environ.get("QL_UI_SCREENSHOTS_DIR")
        if extra:
            shutil.copyfile(path, Path(extra) / path.name)


def _token(served: Served, *scopes: str) -> str:
    engine = make_engine(Settings.from_env(served.env).database_url)
    try:
        token = new_api_token()
        TokenRepository(engine).create(
            name=f"ui-{time.time_ns()}", scopes=frozenset(scopes), token=token
        )
    finally:
        engine.dispose()
    return token


@pytest.fixture
def site(serve_factory: ServeFactory, tmp_path: Path) -> Iterator[Site]:
    executable = browser_or_skip()
    from playwright.sync_api import sync_playwright

    # A 3 s retention cadence besides the kick of each ending: an ending the reconciler
    # recorded kicks nothing, and the "fleeting" log must still expire within the flows.
    served = serve_factory(stop_jobs_on_exit=True, extra_env={"QL_RETENTION_INTERVAL_S": "3"})
    gate_dir = Path(tempfile.mkdtemp(prefix="ql-ui"))
    gate = gate_dir / "go"
    auth = served.auth
    base = served.base_url
    recipe = web.post(
        f"{base}/api/v1/recipes",
        json={"env": {"GREETING": "hello-value"}, "secrets": {"API_KEY": "demo-key"}},
        headers=auth,
    ).json()["id"]
    assert web.put(
        f"{base}/api/v1/secrets/demo-key", json={"value": "never-shown"}, headers=auth
    ).is_success
    put_task(served, "hello", "echo hello")
    second = {"argv": ["/bin/sh", "-c", "echo hello; echo world"], "recipe": recipe}
    second["timeout_seconds"] = 60
    r = web.put(f"{base}/api/v1/tasks/hello/revisions/2", json=second, headers=auth)
    assert r.status_code == 201, r.text
    put_task(
        served,
        "ticker",
        f"echo line 1; echo line 2; while [ ! -e {gate} ]; do sleep 0.05; done; "
        "echo line 3; echo line 4; echo line 5",
    )
    put_task(served, "sleeper", "exec sleep 300")
    put_task(served, "chatty", f"head -c {64 * 1024 * 1024} /dev/zero; exec sleep 300")
    put_task(served, "xss", f"echo '{XSS}'")
    put_task(served, "overlap", "sleep 2")
    finished = enqueue(served, "hello")
    wait_status(served, finished, {"succeeded"})
    # Retention keeps one log of "fleeting": the older run's log expires (the sweep is kicked
    # by the newer run's ending) while the flows before the run page's check go on.
    put_task(served, "fleeting", "echo fleeting")
    r = web.put(
        f"{base}/api/v1/tasks/fleeting/retention",
        json={"keep_runs": 1, "keep_days": 0},
        headers=auth,
    )
    assert r.status_code == 201, r.text
    expiring = enqueue(served, "fleeting")
    wait_status(served, expiring, {"succeeded"})
    enqueue(served, "fleeting")
    schedule = "every-second"
    r = web.put(
        f"{base}/api/v1/schedules/{schedule}",
        json={"task": "overlap", "every_seconds": 1, "catchup_window_seconds": 60, "paused": True},
        headers=auth,
    )
    assert r.status_code == 201, r.text
    shots = tmp_path / "ui-screenshots"
    shots.mkdir()
    # No network partition is built meanwhile (tests/kit/partition.py): Chromium would drop
    # its page loads on the interface change.
    with network_unchanged(), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield Site(
                served=served,
                browser=browser,
                read_only=_token(served, "runs:read", "definitions:read", "logs:read"),
                gate=gate,
                shots=shots,
                finished_run=finished,
                schedule=schedule,
                expiring_run=expiring,
            )
        finally:
            try:
                browser.close()
                if served.exit_code is None:  # the last flow stops the service itself
                    web.post(f"{base}/api/v1/schedules/{schedule}/pause", headers=auth)
            finally:  # the gate's temp dir goes whatever failed above
                shutil.rmtree(gate_dir, ignore_errors=True)


# How far each table's box scrolls sideways (0: every column in sight).
_TABLES_OVER = (
    "[...document.querySelectorAll('.table-wrap')].map((w) => w.scrollWidth - w.clientWidth)"
)

# How many lines the first 10 characters of an element's text (an ISO date) are drawn on.
_DATE_LINES = """(e) => {
  const walk = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  let seen = 0;
  for (let n = walk.nextNode(); n && seen < 10; n = walk.nextNode()) {
    if (seen === 0) range.setStart(n, 0);
    const take = Math.min(n.length, 10 - seen);
    seen += take;
    range.setEnd(n, take);
  }
  return range.getClientRects().length;
}"""

# The form controls whose help text (the ``p.help`` of their field, or right after them) is
# not their description: a screen reader would not read it with the control.
_UNTIED_HELP = """() => [...document.querySelectorAll('main input, main select, main textarea')]
  .filter((c) => {
    const field = c.closest('.field');
    const next = c.nextElementSibling;
    const help = (field && field.querySelector(':scope > p.help'))
      || (next && next.matches('p.help') ? next : null);
    const described = (c.getAttribute('aria-describedby') || '').split(' ');
    return help && !(help.id && described.includes(help.id));
  }).map((c) => c.id)"""


def _run_id(page: Any) -> str:
    page.wait_for_url(re.compile(r"#/runs/[0-9a-f-]{36}$"))
    return str(page.url.rsplit("/", 1)[1])


def _badge(page: Any, status: str) -> None:
    page.wait_for_selector(f".page-head .status[data-status={status}]")


def _sign_in_see_runs_and_watch_a_started_run_stream_its_log_live_to_succeeded(
    site: Site,
) -> None:
    page = site.page()
    page.goto(site.ui)
    page.wait_for_selector("#token:focus")
    site.shot(page, "signin-desktop")
    assert page.evaluate(_UNTIED_HELP) == []
    # By keyboard: the token field has the focus, Enter submits (an empty field is told so),
    # the new page has the focus and Tab reaches its first control.
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Paste a token first.")
    page.keyboard.type(site.served.token)
    page.keyboard.press("Enter")
    page.wait_for_selector("#signout:visible")
    assert page.evaluate("document.activeElement.id") == "view"
    # The focused content draws no ring round the whole page; a control's ring stays.
    outline = "getComputedStyle(document.activeElement).outlineStyle"
    assert page.evaluate(outline) == "none"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.getAttribute('href')") == "#/tasks"
    assert page.evaluate(outline) == "solid"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "filter-task"
    row = page.wait_for_selector(f"tr[data-run='{site.finished_run}']")
    assert row.query_selector(".status[data-status=succeeded]") is not None
    assert "succeeded" in row.inner_text()  # the colour also reads as a word
    # Live: a run enqueued elsewhere appears and ends without a reload.
    other = enqueue(site.served, "hello")
    page.wait_for_selector(f"tr[data-run='{other}'] .status[data-status=succeeded]")

    page.goto(site.ui + "#/tasks/ticker")
    page.click("#start-run")
    run_id = _run_id(page)
    page.wait_for_function("() => document.getElementById('log').textContent.includes('line 2')")
    # Streaming before the end: the job waits for the gate, so the run is not over yet.
    assert page.get_attribute(".page-head .status", "data-status") not in TERMINAL
    assert page.get_attribute(".log-state", "class") == "log-state log-live"
    # The log box takes the keyboard (arrow keys scroll it) and is named by its heading: a
    # <pre> as such may carry no aria-label (axe aria-prohibited-attr).
    assert page.get_by_role("region", name="Log (attempt 1)").get_attribute("id") == "log"
    box = "e => [e.offsetTop, e.getBoundingClientRect().height]"
    streaming = page.eval_on_selector("#log", box)
    # A dropped connection resumes from the last offset: no byte twice, none skipped.
    page.evaluate("window.qlLogFollower.drop()")
    page.wait_for_function("() => window.qlLogFollower.reconnects >= 1")
    page.wait_for_selector(".log-state.log-live")
    assert page.get_attribute(".log-state", "aria-live") == "polite"
    site.gate.touch()
    page.wait_for_selector(".log-state.log-ended")
    _badge(page, "succeeded")
    # The ending is read out once, by the status region: the log's "Ended" stays quiet.
    assert page.get_attribute(".log-state", "aria-live") == "off"
    assert page.inner_text(".page-head [role=status]").split()[-1] == "succeeded"
    assert page.eval_on_selector("#log", box) == streaming  # no layout jump as it streamed
    expected = "line 1\nline 2\nline 3\nline 4\nline 5\n"
    assert page.text_content("#log") == expected
    assert read_log(site.served, run_id).decode() == expected
    with page.expect_download() as download:
        page.click("text=Download whole log")
    assert Path(download.value.path()).read_text() == expected
    # Disabled while it fetched, the button gets the keyboard back (not the page's top).
    page.wait_for_selector("button:has-text('Download whole log'):focus")
    assert "Exited with code 0 (success)." in page.inner_text("table.attempts")
    site.shot(page, "run-desktop")
    assert page.errors == []


def _cancel_a_long_run_ends_cancelled(site: Site) -> None:
    page = site.page()
    site.sign_in(page, path="tasks/sleeper")
    page.click("#start-run")
    run_id = _run_id(page)
    _badge(page, "running")
    # The service unreachable for a while: an action says so, and once the server answers
    # again (the page's next poll) that sentence goes, as it no longer holds.
    page.route("**/api/v1/**", lambda route: route.abort())
    page.click("#pin")
    page.wait_for_selector(".result .error-box >> text=The server could not be reached")
    page.wait_for_timeout(2500)  # polls fail meanwhile: the error stays while it is true
    assert "could not be reached" in page.inner_text(".result")
    page.unroute("**/api/v1/**")
    page.wait_for_selector(".result .notice-info >> text=The server answers again")
    # The error had the focus: the notice in its place has it now, not the page's <body>.
    assert page.evaluate("document.activeElement.classList.contains('notice-info')")
    site.shot(page, "run-reachable-again")
    assert page.query_selector(".result .error-box") is None
    assert get_run(site.served, run_id)["pinned"] is False  # the pin never arrived
    # Cancel asks first, focused on the safe answer; "No" leaves the run alone.
    page.click("#cancel")
    assert page.evaluate("document.activeElement.id") == "cancel-keep"
    assert "Its job is stopped" in page.inner_text("#cancel-question")
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "cancel"
    assert page.query_selector("#cancel-yes") is None
    assert get_run(site.served, run_id)["status"] == "running"
    assert get_run(site.served, run_id)["cancel_requested"] is None
    # Escape answers "No" too, as it closes a dialog: the keyboard is back on Cancel.
    page.click("#cancel")
    page.keyboard.press("Escape")
    assert page.evaluate("document.activeElement.id") == "cancel"
    assert page.query_selector("#cancel-yes") is None
    page.click("#cancel")
    site.shot(page, "run-cancel-question")
    page.click("#cancel-yes")
    page.wait_for_selector("#rerun:focus")  # the answered question is gone: not the page's top
    _badge(page, "cancelled")
    # "Cancel requested: the run ends once ..." spoke of a run still going: gone once it ended.
    assert "Cancel requested" not in page.inner_text(".result")
    assert wait_status(site.served, run_id, {"cancelled"})["status"] == "cancelled"
    page.wait_for_selector("table.attempts .status[data-status=cancelled]")
    ending = page.inner_text("table.attempts")
    assert "Stopped by signal" in ending or "Exited with code" in ending, ending
    assert "Cancelled on request: the service stopped it." in ending  # not a signal from who knows where
    assert page.query_selector("#cancel") is None
    # The runs filter: by status, then by task.
    site.visit(page, "runs?status=cancelled")
    rows = page.query_selector_all("tbody tr[data-run]")
    assert [r.get_attribute("data-run") for r in rows] == [run_id]
    site.visit(page, "runs?task=ticker")
    tasks = {c.inner_text() for c in page.query_selector_all("tbody tr td:nth-child(2)")}
    assert tasks == {"ticker"}
    # A run that ends (cancelled elsewhere) while the keyboard is on Cancel: the focus goes
    # on from Run again, not from the page's top.
    other = enqueue(site.served, "sleeper")
    site.visit(page, f"runs/{other}")
    page.wait_for_selector("#cancel:enabled")
    page.focus("#cancel")
    assert site.api("POST", f"/api/v1/runs/{other}/cancel").is_success
    _badge(page, "cancelled")
    page.wait_for_selector("#rerun:focus")
    assert page.errors == []


def _a_running_log_past_its_head_says_what_it_keeps_not_0_bytes_dropped(site: Site) -> None:
    # Past its head (the 64 MiB quota less 64 KiB) the job runs on: what is dropped is only
    # counted when it ends, so the page says what the log keeps, not "0 B dropped".
    run_id = enqueue(site.served, "chatty")

    def past_its_head() -> bool:
        attempt = get_run(site.served, run_id)["latest_attempt"] or {}
        return bool((attempt.get("log") or {}).get("truncated"))

    wait_until("the log past its head", past_its_head, 30)
    for locale, said, not_said in (
        ("en-US", "The log holds the output's first 63.9 MiB. Of the output past", "dropped"),
        ("zh-CN", "日志保存了输出的前 63.9 MiB。此后的输出只保留最后的部分", "丢弃"),
    ):
        page = site.page(locale=locale)
        # The log box is not checked here: 64 MiB streamed into it would only cost time.
        page.route("**/attempts/*/log*", lambda route: route.abort())
        site.sign_in(page, path=f"runs/{run_id}")
        page.locator(".truncation", has_text=said).wait_for()
        assert not_said not in page.inner_text(".truncation")
        if locale == "en-US":
            site.shot(page, "run-log-past-its-head")
        page.context.close()
    assert site.api("POST", f"/api/v1/runs/{run_id}/cancel").is_success
    wait_status(site.served, run_id, {"cancelled"})


# The served profile's log quota (standalone: 64 MiB), as the step above reads it.
_QUOTA = 64 * 1024 * 1024
# The follower's stream (its reconnects send their own Last-Event-ID).
_FOLLOW = re.compile(r"/attempts/\d+/log\?follow=true(&tail_bytes=\d+)?$")

# The two sides of the log box's gap marker, the marker's name and its drawn words.
_GAP_SIDES = """(log) => {
  const marks = log.querySelectorAll('.log-gap');
  const sides = ['', ''];
  let side = 0;
  for (const n of log.childNodes) {
    if (n === marks[0]) side = 1;
    else sides[side] += n.textContent;
  }
  return { marks: marks.length, before: sides[0], after: sides[1], text: log.textContent,
    label: marks[0].getAttribute('aria-label'), role: marks[0].getAttribute('role'),
    drawn: getComputedStyle(marks[0], '::before').content };
}"""


def _gappy_task(site: Site, name: str, *, at: int, gate: Path | None) -> None:
    """A task whose output passes its log's quota, in lines of 21 bytes with "日" at bytes
    14-16: its head ends ``at`` bytes into a line, and its tail starts ``at`` bytes into one."""
    head, tail = log_head_bytes(_QUOTA), log_tail_bytes(_QUOTA)
    first = (head - at) % 21  # a first line of this many bytes puts the head's end there
    last = (at + tail) % 21  # and a last one of this many, the tail's start
    script = [f"printf '{'#' * (first - 1)}\\n'"] if first else []
    script.append(f"seq -f 'line %08.0f 日志' 1 {_QUOTA // 21 + 100_000}")  # 2 MiB past it
    if gate is not None:
        script.append(f"while [ ! -e {gate} ]; do sleep 0.05; done")
    if last:
        script.append(f"printf '{'=' * (last - 1)}\\n'")
    put_task(site.served, name, "; ".join(script))


def _log_bytes(site: Site, run_id: str, start: int, end: int) -> bytes:
    """The bytes [start, end) of the run's log, as it is now."""
    url = f"{site.served.base_url}/api/v1/runs/{run_id}/attempts/1/log"
    r = web.get(url, headers={**site.served.auth, "Range": f"bytes={start}-{end - 1}"})
    assert r.status_code == 206, r.text
    return r.content


def _line_start_near(site: Site, run_id: str, offset: int) -> int:
    """The offset of the first line that starts at or after ``offset`` in the run's log."""
    return offset + _log_bytes(site, run_id, offset, offset + 100).index(b"\n") + 1


def _follow_from(page: Any, start: int) -> list[str]:
    """The page's follower starts at byte ``start`` (as after a reconnect), not where it asks
    (``tail_bytes``, the part the page shows: 2 MB, cut from a chunk's middle at best). The
    follow URLs the page asked for, as it asks."""
    asked: list[str] = []

    def handler(route: Any) -> None:
        asked.append(route.request.url)
        route.continue_(headers={"last-event-id": str(start)} | route.request.headers)

    page.route(_FOLLOW, handler)
    return asked


def _a_truncated_logs_gap_is_marked_in_the_log_box_where_its_bytes_were_dropped(
    site: Site,
) -> None:
    # A log over its quota keeps its head and the output's last bytes, joined in the file: the
    # log box marks the gap at its byte, log.dropped_at, known once the attempt ended. Cut
    # 15 bytes into a line (the first byte of its "日") and the tail 15 bytes into another,
    # the log reads "日" across the gap: a line that seems whole, made of two.
    gate = site.gate.with_name("gap")
    _gappy_task(site, "gap-cut", at=15, gate=gate)
    run_id = enqueue(site.served, "gap-cut")
    head = log_head_bytes(_QUOTA)

    def head_full() -> bool:
        attempt = get_run(site.served, run_id)["latest_attempt"] or {}
        return (attempt.get("log") or {}).get("bytes") == head

    wait_until("the log's head written", head_full, 60)
    # Followed while the job runs: the gap is marked once it ended (the end's refresh).
    start = _line_start_near(site, run_id, head - 100_000)
    page = site.page()
    _follow_from(page, start)
    site.sign_in(page, path=f"runs/{run_id}")
    # All of it but the first byte of the head's last "日", held back until the rest follows.
    so_far = _log_bytes(site, run_id, start, head - 1).decode()
    page.wait_for_function("(t) => document.getElementById('log').textContent === t", arg=so_far)
    assert page.query_selector("#log .log-gap") is None  # nothing is known while it runs
    gate.touch()
    _badge(page, "succeeded")
    page.wait_for_selector("#log .log-gap")
    log = read_log(site.served, run_id)
    gap = get_run(site.served, run_id)["latest_attempt"]["log"]["dropped_at"]
    assert gap == head and log[gap - 1 : gap + 2] == "日".encode()  # a character of two
    seen = page.eval_on_selector("#log", _GAP_SIDES)
    assert seen["marks"] == 1
    assert seen["before"] == log[start:gap].decode("utf-8", "replace")
    assert seen["after"] == log[gap:].decode("utf-8", "replace")
    assert seen["before"].endswith(" \ufffd") and seen["after"].startswith("\ufffd\ufffd志\n")
    # Its words are drawn, not text of the log: the box's text is the log's own.
    assert seen["text"] == seen["before"] + seen["after"]
    assert re.fullmatch(r"… 2\.\d MiB dropped here …", seen["label"]), seen["label"]
    assert seen["drawn"] == json.dumps(seen["label"], ensure_ascii=False)
    assert seen["role"] == "separator"
    said = page.inner_text(".truncation")
    assert "and its last 64.0 KiB: the bytes between them were dropped" in said, said
    page.eval_on_selector("#log .log-gap", "(m) => m.scrollIntoView({ block: 'center' })")
    site.shot(page, "run-log-gap")
    assert page.errors == []
    page.context.close()

    # Opened after it ended (dropped_at known before the first chunk): the chunk that holds
    # the gap is split inside.
    start = _line_start_near(site, run_id, gap - 150_000)
    assert (gap - start) % (64 * 1024), "the gap would start a chunk"
    page = site.page()
    asked = _follow_from(page, start)
    site.sign_in(page, path=f"runs/{run_id}")
    page.wait_for_selector(".log-state.log-ended")
    page.wait_for_selector("#log .log-gap")
    # A log longer than the page shows is asked for from there (streamed from byte 0, a 64 MiB
    # log took minutes to draw), and the page says it shows only the end.
    assert [u.rpartition("?")[2] for u in asked] == ["follow=true&tail_bytes=2000000"], asked
    assert "Only the end of the log is shown here" in page.inner_text(".truncation")
    seen = page.eval_on_selector("#log", _GAP_SIDES)
    assert seen["marks"] == 1
    assert seen["before"] == log[start:gap].decode("utf-8", "replace")
    assert seen["after"] == log[gap:].decode("utf-8", "replace")
    assert page.errors == []
    page.context.close()

    # A gap between two lines, in the middle of a chunk, in both languages.
    _gappy_task(site, "gap-clean", at=0, gate=None)
    run_id = enqueue(site.served, "gap-clean")
    wait_status(site.served, run_id, {"succeeded"}, timeout=60)
    log = read_log(site.served, run_id)
    gap = get_run(site.served, run_id)["latest_attempt"]["log"]["dropped_at"]
    assert gap == head and log[gap - 1 : gap + 5] == b"\nline "
    start = _line_start_near(site, run_id, gap - 100_000)
    assert (gap - start) % (64 * 1024), "the gap would start a chunk"
    for locale, words in (("en-US", " dropped here …"), ("zh-CN", "…… 此处丢弃了 ")):
        page = site.page(locale=locale)
        _follow_from(page, start)
        site.sign_in(page, path=f"runs/{run_id}")
        page.wait_for_selector(".log-state.log-ended")
        page.wait_for_selector("#log .log-gap")
        seen = page.eval_on_selector("#log", _GAP_SIDES)
        assert seen["marks"] == 1
        assert seen["before"] == log[start:gap].decode()
        assert seen["after"] == log[gap:].decode()
        assert words in seen["label"]
        assert page.errors == []
        page.context.close()


def _markup_in_a_definition_and_a_log_line_renders_as_text_and_runs_no_script(
    site: Site,
) -> None:
    # Names cannot carry markup at all: the API refuses them before any page shows one.
    refused = site.api("PUT", f"/api/v1/tasks/{quote(XSS, safe='')}/revisions/1", json={})
    assert refused.status_code == 422
    page = site.page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    site.sign_in(page, path="tasks/xss")
    page.wait_for_selector("ol.argv li")
    assert XSS in page.inner_text("ol.argv")
    page.click("#start-run")
    _run_id(page)
    page.wait_for_selector(".log-state.log-ended")
    assert page.text_content("#log") == XSS + "\n"
    # The same string as a task filter from the URL: kept as an input value, refused as text.
    page.goto(site.ui + "#/runs?task=" + quote(XSS, safe=""))
    page.wait_for_selector(".error-box")
    assert page.input_value("#filter-task") == XSS
    page.wait_for_timeout(300)
    assert page.locator("img").count() == 0
    assert dialogs == []
    assert page.errors == []


def _the_api_docs_page_runs_no_swagger_bytes_but_the_pinned_ones(site: Site) -> None:
    """/docs loads Swagger UI from a CDN (docs/ui.md §3): bytes other than the pinned
    release's, as a compromised CDN would serve, are refused before they run."""
    page = site.page()
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "integrity" in m.text else None)
    kinds = {".js": "application/javascript", ".css": "text/css"}

    def tampered(route: Any) -> None:
        url = route.request.url
        body = "window.tampered = true;" if url.endswith(".js") else "body { color: red }"
        cors = {"Access-Control-Allow-Origin": "*"}
        route.fulfill(status=200, body=body, content_type=kinds[url[url.rindex(".") :]],
                      headers=cors)  # fmt: skip

    page.route(f"{SWAGGER_UI}/**", tampered)
    page.goto(f"{site.served.base_url}/docs")
    for _ in range(100):  # the console's events arrive while Playwright waits
        if len(refused) >= 2:
            break
        page.wait_for_timeout(100)
    assert page.evaluate("window.tampered === undefined && window.ui === undefined")
    assert page.inner_html("#swagger-ui") == ""
    assert [m for m in refused if "swagger-ui-bundle.js" in m or "swagger-ui.css" in m] == refused
    page.context.close()


def _define_a_task_and_a_revision_then_start_rerun_and_pin_its_run(site: Site) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = site.page()
    site.sign_in(page, path="tasks")
    page.click("#new-task")
    page.wait_for_selector("main[aria-busy=false] #def-argv")
    assert page.evaluate(_UNTIED_HELP) == []  # "Seconds; empty: none." is the timeout's too
    # A name the field's pattern refuses is said in the page's words, before any request.
    page.fill("#def-task", "Made In UI")
    page.fill("#def-argv", "/bin/true")
    page.click("#def-save")
    refused = page.inner_text("form.define-form .result .error-box")
    assert "A task's name is lower-case letters" in refused, refused
    # A bad argv: the API's 422 problem detail is shown next to the form; nothing is stored.
    page.fill("#def-task", "made-in-ui")
    page.fill("#def-argv", "echo\nhi")
    page.click("#def-save")
    refused = page.inner_text("form.define-form .result .error-box")
    assert "argv[0] must be an absolute path" in refused, refused
    assert site.api("GET", "/api/v1/tasks/made-in-ui").status_code == 404
    # One argument per line; a shell only because the user wrote /bin/sh and -c.
    script = 'echo "made $GREETING"\necho "key ${#API_KEY}"'
    page.fill("#def-argv", "/bin/sh\n-c\n" + script)
    page.fill("#def-timeout", "30")
    page.fill("#def-env", "GREETING=in the ui")
    page.fill("#def-secrets", "API_KEY=demo-key")
    page.click("#def-save")
    page.wait_for_url(re.compile(r"#/tasks/made-in-ui$"))
    page.wait_for_selector("#notice .notice-ok")
    rev1 = site.api("GET", "/api/v1/tasks/made-in-ui/revisions/1").json()
    assert rev1["argv"] == ["/bin/sh", "-c", script]
    assert (rev1["timeout_seconds"], rev1["retry"]) == (30, None)
    recipe = site.api("GET", f"/api/v1/recipes/{rev1['recipe']}").json()
    assert recipe["env"] == {"GREETING": "in the ui"}
    assert recipe["secrets"] == {"API_KEY": "demo-key"}
    # The task page shows the script as written: its two lines, not one ("... echo ...") that
    # reads as another script.
    assert page.inner_text("ol.argv li:nth-child(3)") == script
    # A new revision starts from the latest, keeps its recipe (values never on the page).
    page.click("#new-revision")
    page.wait_for_selector("main[aria-busy=false] #def-keep-recipe:checked")
    assert page.input_value("#def-argv") == "/bin/sh\n-c\n" + script
    assert page.evaluate(_UNTIED_HELP) == []
    assert "in the ui" not in page.content()
    page.check("#def-retry")
    page.fill("#def-retry-max", "2")
    page.check("#def-retry-on-timed_out")
    page.fill("#def-max-concurrent", "2")
    # The task page's stored retention held back: until it is drawn the form takes no typing
    # (a value typed meanwhile was overwritten by the one arriving, and a save sent that).
    held: list[Any] = []
    retention_url = re.compile(r"/api/v1/tasks/made-in-ui/retention$")
    page.route(retention_url, lambda route: held.append(route))
    page.click("#def-save")
    page.wait_for_selector("#notice .notice-ok")
    deadline = time.monotonic() + 20
    while not held:  # Playwright calls its route handlers only inside its own calls
        assert time.monotonic() < deadline, "the task page never asked for its retention"
        page.wait_for_timeout(50)
    with pytest.raises(PlaywrightTimeout):
        page.fill("#ret-keep_runs", "7", timeout=500)
    held[0].continue_()
    page.unroute(retention_url)
    rev2 = site.api("GET", "/api/v1/tasks/made-in-ui/revisions/2").json()
    assert (rev2["recipe"], rev2["argv"]) == (rev1["recipe"], rev1["argv"])
    assert rev2["max_concurrent"] == 2
    assert rev2["retry"]["max_attempts"] == 2 and rev2["retry"]["on"] == ["failed", "timed_out"]
    # Retention: the API's 422 (keep_rows must exceed keep_runs), then saved.
    page.fill("#ret-keep_runs", "5")
    page.fill("#ret-keep_rows", "3")
    page.click("#retention-save")
    assert "keep_rows" in page.inner_text(".retention-form .result .error-box")
    page.fill("#ret-keep_rows", "50")
    page.click("#retention-save")
    page.wait_for_selector(".retention-form .result .notice-ok")
    assert page.evaluate("document.activeElement.id") == "retention-save"  # not the page's top
    override = site.api("GET", "/api/v1/tasks/made-in-ui/retention").json()["override"]
    assert override == {"keep_runs": 5, "keep_days": None, "keep_rows": 50, "task_log_bytes": None}
    # Start it, re-run it, pin and unpin the new run.
    page.click("#start-run")
    first = _run_id(page)
    page.wait_for_selector(".log-state.log-ended")
    assert page.text_content("#log") == "made in the ui\nkey 11\n"
    page.click("#rerun")
    page.wait_for_url(lambda url: re.search(r"#/runs/[0-9a-f-]{36}$", url) and first not in url)
    second = _run_id(page)
    assert site.api("GET", f"/api/v1/runs/{second}").json()["trigger"]["rerun_of"] == first
    page.click("#pin")
    page.wait_for_selector("#pin:focus:text-is('Unpin')")
    assert page.get_attribute("#pin", "aria-pressed") is None  # its words say what it does
    assert site.api("GET", f"/api/v1/runs/{second}").json()["pinned"] is True
    page.keyboard.press("Enter")  # the same control, still focused, now unpins
    page.wait_for_selector("#pin:focus:text-is('Pin (keep)')")
    assert site.api("GET", f"/api/v1/runs/{second}").json()["pinned"] is False
    # A log that retention removed reads "expired", not an error.
    wait_until(
        "the older fleeting log expired",
        lambda: site.api("GET", f"/api/v1/runs/{site.expiring_run}").json()["latest_attempt"][
            "log"
        ]["expired"],
        20,
    )
    site.visit(page, f"runs/{site.expiring_run}")
    page.wait_for_selector(".log-state.log-expired")
    assert page.is_visible("#log-expired") and page.query_selector(".error-box") is None
    site.shot(page, "run-expired-desktop")
    # The storage figures (an admin token here).
    site.visit(page, "system")
    page.wait_for_selector("text=Logs expired")
    # With several hosts (PostgreSQL), each host's last sweep under its name: one whose
    # sweeps stopped shows as the oldest (docs/retention.md §5). The answer is this server's
    # own, with a second host's sweep added.
    figures = site.api("GET", "/api/v1/system/storage").json()
    sweep = {"at_ms": 1_700_000_000_000, "duration_ms": 3, "expired_logs": 2,
             "finished_expiring": 0, "deleted_runs": 0, "freed_bytes": 20}  # fmt: skip
    figures["sweeps"] = [sweep | {"host": "nas-b", "instance_id": "i-b", "at_ms": now_ms()},
                         sweep | {"host": "nas-a", "instance_id": "i-a"}]  # fmt: skip
    figures["last_sweep"] = figures["sweeps"][0]
    # A failed answer gives way to the figures without a reload: they are asked again every
    # 5 s while they fail.
    page.route("**/api/v1/system/storage", lambda route: route.abort())
    page.reload()
    site.visit(page, "system")
    page.wait_for_selector("section:has(> h2:text-is('Storage')) .error-box")
    page.unroute("**/api/v1/system/storage")
    page.route("**/api/v1/system/storage", lambda route: route.fulfill(
        status=200, content_type="application/json", body=json.dumps(figures)))  # fmt: skip
    headings = page.locator("h3:has-text('Last retention sweep of host')")
    headings.first.wait_for(timeout=15_000)
    assert page.query_selector("main .error-box") is None
    assert headings.all_inner_texts() == [
        "Last retention sweep of host nas-b", "Last retention sweep of host nas-a",
    ]  # fmt: skip
    assert "i-a" not in page.inner_text("main") and "[object" not in page.inner_text("main")
    site.shot(page, "system-sweeps-per-host-desktop")
    page.unroute("**/api/v1/system/storage")
    assert page.errors == []


# /readyz's process_limit as the System page says it ("Job process limit"), each shape the
# api can send (app/api/schemas.py ProcessLimit; null: no worker answer or an older one), a
# word of a newer build as it is, and the words `qinglong system ready` uses (render.py).
_PROCESS_LIMITS: list[tuple[Any, str]] = [
    ({"max_processes": 4096, "held_by": "pids_max"},
     "4096 processes per job, by its cgroup's pids.max"),
    ({"max_processes": 4096, "held_by": "rlimit_nproc"},
     "4096 processes per job user, by RLIMIT_NPROC across that user's running jobs"),
    ({"max_processes": 512, "held_by": "rlimit_nproc_run_as"},
     "512 processes per job user of run_as jobs, by RLIMIT_NPROC; other jobs have no limit"),
    ({"max_processes": 4096, "held_by": "none"},
     "not enforced 4096 set, but a job can start any number of processes on this host"),
    ({"max_processes": None, "held_by": "off"}, "off (QL_JOB_MAX_PROCESSES=off)"),
    ({"max_processes": 64, "held_by": "pids_max_v9"}, "64 (pids_max_v9)"),
    (None, "not reported"),
    ("absent", "not reported"),
]  # fmt: skip


def _the_system_page_says_how_the_worker_holds_the_job_process_limit(site: Site) -> None:
    """Beside who jobs run as: this server's own answer, then each shape of /readyz's
    process_limit in words (both languages), kept while a 503 says nothing of it."""
    said = {json.dumps(shape): words for shape, words in _PROCESS_LIMITS}
    real = site.api("GET", "/readyz").json()
    page = site.page()
    site.sign_in(page, path="system")
    page.wait_for_selector("#process-limit")
    expected = said[json.dumps(real.get("process_limit"))]
    assert page.inner_text("#process-limit") == expected, real
    facts = page.eval_on_selector_all("section:has(> h2:text-is('This server')) dt",
                                      "ds => ds.map((d) => d.textContent)")  # fmt: skip
    assert facts.index("Job process limit") == facts.index("Jobs run as") + 1, facts
    answer: dict[str, Any] = {"status": 200, "body": dict(real)}

    def fulfil(route: Any) -> None:
        route.fulfill(status=answer["status"], content_type="application/json",
                      body=json.dumps(answer["body"]))  # fmt: skip

    page.route("**/readyz", fulfil)
    for shape, words in _PROCESS_LIMITS:
        answer["body"] = {k: v for k, v in real.items() if k != "process_limit"}
        if shape != "absent":
            answer["body"]["process_limit"] = shape
        page.reload()
        site.visit(page, "system")
        assert page.inner_text("#process-limit") == words, shape
        if shape and shape != "absent" and shape["held_by"] == "none":
            site.shot(page, "system-process-limit-none-desktop")
    # A 503 names the failing check and carries no facts: the last ready answer's stay.
    answer["body"]["process_limit"] = _PROCESS_LIMITS[1][0]
    page.reload()
    site.visit(page, "system")
    answer.update(status=503, body={"type": "about:blank", "title": "Service Unavailable",
                                    "status": 503, "code": "NOT_READY",
                                    "detail": "worker: not answering"})  # fmt: skip
    page.wait_for_selector("li[data-check=worker] .status-failed", timeout=15_000)
    assert page.inner_text("#process-limit") == _PROCESS_LIMITS[1][1]
    assert page.inner_text("#process-limit").count("RLIMIT_NPROC") == 1
    assert page.errors == []
    page.context.close()
    # zh-CN: the words translated, the kernel's names in code elements as they are.
    page = site.page(locale="zh-CN", width=360)
    page.route("**/readyz", fulfil)
    answer["status"] = 200
    labels = json.loads((STATIC / "i18n" / "zh-CN.json").read_text("utf-8"))
    zh = {
        "rlimit_nproc_run_as": labels["system.process_limit_rlimit_nproc_run_as"].format(
            n=512, setting="RLIMIT_NPROC", run_as="run_as"
        ),
        "none": labels["system.process_limit_unenforced"]
        + " "
        + labels["system.process_limit_none"].format(n=4096),
    }
    site.sign_in(page, path="system")
    for shape, _ in _PROCESS_LIMITS[2:4]:
        answer["body"] = {**real, "process_limit": shape}
        page.reload()
        site.visit(page, "system")
        assert page.inner_text("#process-limit") == zh[shape["held_by"]], shape
        assert not _english_words(page.evaluate(_SCAN), set(ZH_AS_IS_WORDS))
        width_px = page.evaluate("document.documentElement.scrollWidth")
        assert width_px <= 360, width_px
        site.shot(page, f"system-process-limit-{shape['held_by']}-360-zh")
    assert page.errors == []
    page.context.close()


def _the_tasks_list_says_each_tasks_last_run(site: Site) -> None:
    put_task(site.served, "never-ran", "true")
    newest = site.api("GET", "/api/v1/runs", params={"task": "hello", "limit": 1}).json()
    page = site.page()
    site.sign_in(page, path="tasks")
    cell = page.wait_for_selector("td.last-run[data-task=hello] .status")
    assert cell.get_attribute("data-status") == newest["items"][0]["status"]
    link = page.get_attribute("td.last-run[data-task=hello] a:has(.status)", "href")
    assert link == f"#/runs/{newest['items'][0]['id']}"
    page.wait_for_selector("td.last-run[data-task=never-ran]:has-text('never run')")
    assert page.errors == []
    page.context.close()


def _archive_a_task_after_a_question_and_find_it_among_the_archived(site: Site) -> None:
    """A task retired in the UI: refused while a schedule fires it (the detail names the
    schedule), archived after the in-page question, gone from the list, found among the
    archived ones, and unarchived."""
    put_task(site.served, "retired", "true")
    schedule = {"task": "retired", "every_seconds": 86_400}
    assert site.api("PUT", "/api/v1/schedules/retired-daily", json=schedule).status_code == 201
    page = site.page()
    site.sign_in(page, path="tasks/retired")
    page.wait_for_selector("main[aria-busy=false] #archive-task")
    page.click("#archive-task")  # "Keep it" has the keyboard; Escape keeps the task
    assert page.evaluate("document.activeElement.textContent") == "Keep it"
    site.shot(page, "task-archive-question-desktop")
    tops = page.evaluate(
        "[...document.querySelectorAll('.confirm-inline .choices button')]"
        ".map((b) => b.getBoundingClientRect().top)"
    )
    assert len(tops) == 2 and tops[0] == tops[1], tops  # "Keep it" wrapped alone before
    page.keyboard.press("Escape")
    assert page.evaluate("document.activeElement.id") == "archive-task"
    assert not page.is_visible("#archive-yes")
    page.click("#archive-task")
    page.click("#archive-yes")
    page.wait_for_selector(".result .error-box")
    refused = page.inner_text(".result .error-box")
    assert "pause or delete them first" in refused and "retired-daily" in refused, refused
    site.shot(page, "task-archive-refused-desktop")
    assert site.api("POST", "/api/v1/schedules/retired-daily/pause").is_success
    page.click("#archive-task")
    page.click("#archive-yes")
    page.wait_for_selector("#archived-tag")
    assert "Archived task “retired”." in page.inner_text(".result")
    assert page.is_visible("#archived-note") and page.is_disabled("#start-run")
    assert not page.is_visible("#new-revision") and not page.is_visible("#archive-task")
    assert site.api("GET", "/api/v1/tasks/retired").json()["archived"] is True
    site.shot(page, "task-archived-desktop")
    _schedules_of_an_archived_task_are_marked_and_it_is_not_suggested(site, page)
    site.visit(page, "tasks")
    page.wait_for_selector("td.last-run[data-task=hello]")
    assert not page.query_selector("td.last-run[data-task=retired]")
    # Every task archived: the empty list points at the archived ones (it said "No tasks yet").
    listed = site.api("GET", "/api/v1/tasks", params={"limit": 100}).json()["items"]
    others = [quote(item["task"], safe="") for item in listed]
    for name in others:
        assert site.api("POST", f"/api/v1/tasks/{name}/archive").status_code == 200, name
    site.visit(page, "schedules")  # away and back: the list is read anew
    site.visit(page, "tasks")
    page.wait_for_selector("#empty-show-archived")
    assert page.inner_text("p.empty") == "No tasks listed: every task is archived. Archived tasks"
    site.shot(page, "tasks-all-archived-desktop")
    for name in others:
        assert site.api("POST", f"/api/v1/tasks/{name}/unarchive").status_code == 200, name
    site.visit(page, "schedules")
    site.visit(page, "tasks")
    page.wait_for_selector("td.last-run[data-task=hello]")
    page.click("#show-archived")
    page.wait_for_selector("td.last-run[data-task=retired]")
    assert not page.query_selector("td.last-run[data-task=hello]")
    assert page.inner_text("h1") == "Archived tasks"
    site.shot(page, "tasks-archived-desktop")
    page.click("a[href='#/tasks/retired']")
    page.wait_for_selector("#unarchive-task")
    page.click("#unarchive-task")
    page.wait_for_selector("#archive-task")
    assert not page.query_selector("#archived-tag") and not page.is_disabled("#start-run")
    assert site.api("GET", "/api/v1/tasks/retired").json()["archived"] is False
    assert site.api("DELETE", "/api/v1/schedules/retired-daily").status_code == 204
    assert page.errors == []
    page.context.close()


def _schedules_of_an_archived_task_are_marked_and_it_is_not_suggested(
    site: Site, page: Any
) -> None:
    """Task "retired" is archived and its schedule paused: the schedules list marks each of
    its schedules with the Tasks page's badge, from one list of the archived tasks (not one
    call per schedule), and says a resume would not do; the schedule's page says why; the
    schedule form suggests the tasks listed, the archived one left out."""
    paused = {"task": "retired", "every_seconds": 604_800, "paused": True}
    assert site.api("PUT", "/api/v1/schedules/retired-weekly", json=paused).status_code == 201
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/api/v1/tasks" in r.url else None)
    site.visit(page, "schedules")
    marked = page.eval_on_selector_all(
        "tr[data-schedule]:has(td.wide .status-archived)", "rs => rs.map((r) => r.dataset.schedule)"
    )
    assert sorted(marked) == ["retired-daily", "retired-weekly"], marked
    assert len(asked) == 1 and "archived=only" in asked[0], asked
    row = page.locator("tr[data-schedule=retired-daily]")
    assert row.locator("td.wide .status-archived").inner_text() == "▪ archived"
    assert "only if its task is unarchived and it is resumed" in row.inner_text()
    assert page.query_selector(f"tr[data-schedule={site.schedule}] .status-archived") is None
    site.shot(page, "schedules-task-archived-desktop")
    site.visit(page, "schedules/retired-daily")
    assert page.is_visible("#task-archived-note")
    assert page.inner_text("dl.facts dd .status-archived") == "▪ archived"
    site.shot(page, "schedule-task-archived-desktop")
    site.visit(page, f"schedules/{site.schedule}")
    assert not page.is_visible("#task-archived-note")
    assert page.query_selector(".status-archived") is None
    site.visit(page, "new-schedule")
    suggested = page.eval_on_selector_all("#sch-tasks option", "os => os.map((o) => o.value)")
    assert "hello" in suggested and "retired" not in suggested and "" not in suggested, suggested
    # At phone width, in zh-CN: the badge under the schedule's name, where its task is shown.
    phone = site.page(locale="zh-CN", width=360)
    site.sign_in(phone, path="schedules")
    narrow = phone.locator("tr[data-schedule=retired-daily] td:first-child .narrow .status")
    assert narrow.inner_text() == "▪ 已归档"
    assert phone.evaluate("document.documentElement.scrollWidth") <= 360
    assert phone.evaluate(_TABLES_OVER) == [0]
    site.shot(phone, "schedules-task-archived-360-zh")
    assert phone.errors == []
    phone.context.close()
    assert site.api("DELETE", "/api/v1/schedules/retired-weekly").status_code == 204


def _create_edit_and_delete_a_schedule_in_the_ui(site: Site) -> None:
    """Issue 17's new-user suggestion: schedules made in the UI, not only paused there."""
    page = site.page()
    site.sign_in(page, path="tasks/hello")
    page.click("#schedule-task")
    page.wait_for_selector("main[aria-busy=false] #sch-name")
    assert page.input_value("#sch-task") == "hello"
    page.fill("#sch-name", "ui-made")
    page.fill("#sch-cron", "61 3 * * *")
    page.fill("#sch-timezone", "Asia/Shanghai")
    # The policies' own fields show only where they act.
    assert page.is_hidden("#sch-max-concurrent") and page.is_visible("#sch-window")
    page.click("#sch-save")
    page.wait_for_selector(".result .error-box")
    assert "The schedule is not valid" in page.inner_text(".result .error-box")  # and its detail
    assert site.api("GET", "/api/v1/schedules/ui-made").status_code == 404
    page.fill("#sch-cron", "0 3 * * *\n30 12 * * 1-5")
    page.click("#sch-save")
    page.wait_for_selector("#edit-schedule")
    assert "Saved schedule “ui-made”." in page.inner_text("#notice")
    # An action's own result replaces the notice the page arrived with (it stood above
    # "Paused." as if both were news).
    page.click("#pause")
    page.wait_for_selector("#resume:focus")
    assert page.inner_text("#notice") == "" and "Paused" in page.inner_text(".result")
    page.click("#resume")
    page.wait_for_selector("#pause:focus")
    made = site.api("GET", "/api/v1/schedules/ui-made").json()
    assert (made["task"], made["cron"], made["timezone"]) == (
        "hello", ["0 3 * * *", "30 12 * * 1-5"], "Asia/Shanghai"
    )
    assert (made["revision"], made["overlap"], made["paused"]) == (None, "skip", False)
    # An edit starts from the stored definition; a change made elsewhere meanwhile is not
    # overwritten (If-Match): 412, said in words.
    page.click("#edit-schedule")
    page.wait_for_selector("main[aria-busy=false] #sch-save")
    assert page.input_value("#sch-cron") == "0 3 * * *\n30 12 * * 1-5"
    # What the form hides (max_concurrent under skip, the window under all) or does not edit
    # (the bounds, paused) goes back as stored, not reset by a plain save.
    until = int(time.time() * 1000) + 10 * 86_400_000
    elsewhere = made | {"jitter_seconds": 5, "max_concurrent": 4, "end_at_ms": until}
    for key in ("name", "version", "created_at_ms", "updated_at_ms", "next_fires"):
        del elsewhere[key]
    assert site.api("PUT", "/api/v1/schedules/ui-made", json=elsewhere).status_code == 200
    page.select_option("#sch-catchup", "all")
    page.click("#sch-save")
    page.wait_for_selector(".result .error-box")
    assert "The schedule changed meanwhile" in page.inner_text(".result .error-box")
    page.reload()
    page.wait_for_selector("main[aria-busy=false] #sch-save")
    assert page.input_value("#sch-jitter") == "5" and page.is_hidden("#sch-max-concurrent")
    assert page.query_selector("#sch-paused") is None  # pause and resume are the page's
    page.fill("#sch-window", "120")
    page.select_option("#sch-catchup", "all")
    page.fill("#sch-jitter", "7")
    page.click("#sch-save")
    page.wait_for_selector("#edit-schedule")
    edited = site.api("GET", "/api/v1/schedules/ui-made").json()
    assert (edited["catchup"], edited["jitter_seconds"], edited["max_concurrent"]) == ("all", 7, 4)
    assert (edited["catchup_window_seconds"], edited["end_at_ms"]) == (3600, until)  # hidden: kept
    assert not edited["paused"] and edited["cron"] == made["cron"]
    assert edited["overlap"] == "skip"
    # An edit typed, the token refused meanwhile and the schedule changed elsewhere: signed
    # in again, the typed draft comes back with the version it was typed against, so saving
    # it answers 412 as before, never overwrites the change made meanwhile.
    page.click("#edit-schedule")
    page.wait_for_selector("main[aria-busy=false] #sch-save")
    page.fill("#sch-jitter", "9")
    later = {k: v for k, v in edited.items() if k not in (
        "name", "version", "created_at_ms", "updated_at_ms", "next_fires")} | {"jitter_seconds": 11}
    assert site.api("PUT", "/api/v1/schedules/ui-made", json=later).status_code == 200
    page.evaluate("sessionStorage.setItem('ql.token', 'ql_' + 'z'.repeat(43))")
    page.click("#sch-save")
    page.wait_for_selector("form.signin .notice-warn")
    page.fill("#token", site.served.token)
    page.click("form.signin button[type=submit]")
    page.wait_for_selector("main[aria-busy=false] #sch-save")
    page.wait_for_function("() => document.getElementById('sch-jitter').value === '9'")
    page.click("#sch-save")
    page.wait_for_selector(".result .error-box")
    assert "The schedule changed meanwhile" in page.inner_text(".result .error-box")
    assert site.api("GET", "/api/v1/schedules/ui-made").json()["jitter_seconds"] == 11
    page.goto(site.ui + "#/schedules/ui-made")
    page.wait_for_selector("main[aria-busy=false] #delete-schedule")
    # Delete after the in-page question; "Keep it" first keeps it.
    page.click("#delete-schedule")
    assert page.evaluate("document.activeElement.textContent") == "Keep it"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "delete-schedule"
    assert site.api("GET", "/api/v1/schedules/ui-made").status_code == 200
    page.click("#delete-schedule")  # Escape keeps it as well
    page.keyboard.press("Escape")
    assert page.evaluate("document.activeElement.id") == "delete-schedule"
    assert not page.is_visible("#delete-yes")
    page.click("#delete-schedule")
    page.click("#delete-yes")
    page.wait_for_selector("#new-schedule")
    assert "Deleted schedule “ui-made”." in page.inner_text("#notice")
    assert site.api("GET", "/api/v1/schedules/ui-made").status_code == 404
    assert page.errors == []
    page.context.close()


def _a_read_only_token_is_offered_no_write_and_told_which_scope_it_lacks(site: Site) -> None:
    """GET /api/v1/token at sign-in: what the token may not do is not drawn (a button that
    the server refuses after a click), and each page names the scope it lacks."""
    page = site.page()
    asked: list[str] = []
    page.on("request", lambda r: asked.append(f"{r.method} {r.url.split('?')[0]}"))
    site.sign_in(page, site.read_only, path="tasks/hello")
    page.wait_for_selector("main[aria-busy=false] #ret-keep_runs")
    for control in ("#start-run", "#new-revision", "#schedule-task", "#archive-task"):
        assert not page.is_visible(control), control
    note = page.inner_text(".page > .scope-note")
    assert "runs:write" in note and "definitions:write" in note, note
    # The retention policy is shown, read-only, with no save.
    assert page.query_selector("#retention-save") is None
    assert page.get_attribute("#ret-keep_runs", "readonly") is not None
    assert "definitions:write" in page.inner_text(".retention-form .scope-note")
    site.shot(page, "task-read-only")
    site.visit(page, "tasks/hello/new-revision")
    assert page.query_selector("form.define-form") is None
    assert "definitions:write" in page.inner_text(".scope-note")
    site.visit(page, f"runs/{site.finished_run}")
    page.wait_for_selector(".log-state.log-ended")  # logs:read: the log is shown
    assert page.query_selector_all(".run-actions button") == []
    assert "runs:write" in page.inner_text(".run-actions .scope-note")
    site.shot(page, "run-read-only")
    site.visit(page, f"schedules/{site.schedule}")
    for control in ("#pause", "#resume", "#edit-schedule", "#delete-schedule"):
        assert page.query_selector(control) is None, control
    assert "runs:write" in page.inner_text(".scope-note")
    site.visit(page, "schedules")
    assert page.query_selector("#new-schedule") is None
    assert "definitions:write" in page.inner_text(".scope-note")
    site.visit(page, "tasks")
    assert page.query_selector("#new-task") is None
    assert "definitions:write" in page.inner_text(".scope-note")
    # A tab that holds a token but not its scopes (signed in before) asks once as it opens.
    page.evaluate("sessionStorage.removeItem('ql.self')")
    page.reload()
    page.wait_for_selector("main[aria-busy=false] .scope-note")
    assert page.query_selector("#new-task") is None
    assert page.evaluate("JSON.parse(sessionStorage.getItem('ql.self')).scopes").count("runs:read") == 1
    site.visit(page, "secrets")
    assert page.query_selector("form.secret-form") is None
    assert "secrets:write" in page.inner_text(".scope-note")
    site.visit(page, "system")
    assert "admin" in page.inner_text(".scope-note")
    assert "runs:read" in page.inner_text("#token-self")
    site.shot(page, "system-read-only")
    # Nothing was asked that the token's scopes refuse: no 403 to click through.
    refused = [a for a in asked if "/api/v1/secrets" in a or "/api/v1/system/storage" in a]
    assert refused == [], refused
    # A token without logs:read: no empty log box, no download; the note names the scope.
    runs_only = _token(site.served, "runs:read")
    page.click("#signout")
    site.sign_in(page, runs_only, path=f"runs/{site.finished_run}")
    page.wait_for_selector("main[aria-busy=false] .log-section .scope-note")
    assert "logs:read" in page.inner_text(".log-section .scope-note")
    assert not page.is_visible("#log") and not page.is_visible(".log-section button")
    # Nor may it read tasks: the task page says so once and asks nothing (its retention form,
    # left empty, would have saved every value back to the global one).
    asked.clear()
    site.visit(page, "tasks/hello")
    assert "definitions:read" in page.inner_text(".scope-note")
    assert page.query_selector("#retention-save") is None
    assert not [a for a in asked if "/api/v1/tasks" in a], asked
    # A token for secrets alone lands on the secrets, not on a refused runs list.
    page.click("#signout")
    site.sign_in(page, _token(site.served, "secrets:write"))
    page.wait_for_url(re.compile(r"#/secrets$"))
    page.wait_for_selector("main[aria-busy=false] form.secret-form")
    # A server that does not say (no GET /api/v1/token: an older one) gets the controls, and
    # each refusal names the missing scope, as before.
    page.click("#signout")
    page.route("**/api/v1/token", lambda route: route.fulfill(
        status=404, content_type="application/problem+json", body='{"code": "NOT_FOUND"}'))
    # There an unknown token is still refused: the older server's 404 proves nothing.
    page.goto(site.ui + "#/tasks/hello")
    page.fill("#token", "ql_" + "z" * 43)
    page.click("form.signin button[type=submit]")
    page.wait_for_selector("form.signin .form-error:has-text('does not know this token')")
    site.sign_in(page, site.read_only, path="tasks/hello")
    page.wait_for_selector("main[aria-busy=false] #ret-keep_runs")
    assert page.evaluate("sessionStorage.getItem('ql.self')") is None
    page.click("#start-run")
    assert "runs:write" in page.inner_text(".result .error-box")
    page.click("#retention-save")
    assert "definitions:write" in page.inner_text(".retention-form .result .error-box")
    site.visit(page, f"runs/{site.finished_run}")
    page.click("#pin")
    assert "runs:write" in page.inner_text(".result .error-box")
    site.visit(page, "secrets")
    assert "secrets:write" in page.inner_text(".error-box")
    page.fill("#secret-name", "new-one")
    page.fill("#secret-value", "x")
    page.click("form.secret-form button[type=submit]")
    assert "secrets:write" in page.inner_text(".result .error-box")
    assert len(page.query_selector_all(".error-box")) == 1  # the list's refusal is not repeated
    page.unroute("**/api/v1/token")
    assert site.api("GET", "/api/v1/tasks/hello").json()["latest_revision"] == 2
    assert site.api("GET", "/api/v1/secrets").json()["items"][0]["name"] == "demo-key"
    # Sign-out forgets the token; a token the server refuses returns to the sign-in view.
    page.click("#signout")
    page.wait_for_selector("#token")
    assert page.evaluate("sessionStorage.getItem('ql.token')") is None
    page.evaluate("sessionStorage.setItem('ql.token', 'ql_' + 'x'.repeat(43))")
    page.goto(site.ui + "#/runs?task=hello&status=succeeded")
    page.wait_for_selector("form.signin .notice-warn")
    # Signed in again, the user is back on the page they were on, its filters included.
    page.fill("#token", site.served.token)
    page.click("form.signin button[type=submit]")
    page.wait_for_url(re.compile(r"#/runs\?task=hello&status=succeeded$"))
    # A token refused while a form is filled in (revoked meanwhile): signed in again, the form
    # holds what was typed, not a blank one (a script typed for minutes), and saves as it is.
    page.goto(site.ui + "#/new-task")
    page.wait_for_selector("main[aria-busy=false] #def-argv")
    typed = "/bin/sh\n-c\necho one\necho two"
    page.fill("#def-task", "typed-before-401")
    page.fill("#def-argv", typed)
    page.check("#def-retry")
    page.fill("#def-retry-max", "4")
    page.fill("#def-env", "TYPED=yes")
    page.evaluate("sessionStorage.setItem('ql.token', 'ql_' + 'y'.repeat(43))")
    page.click("#def-save")
    page.wait_for_selector("form.signin .notice-warn")
    page.fill("#token", site.served.token)
    page.click("form.signin button[type=submit]")
    page.wait_for_url(re.compile(r"#/new-task$"))
    page.wait_for_selector("main[aria-busy=false] #def-argv")
    assert (page.input_value("#def-task"), page.input_value("#def-argv")) == (
        "typed-before-401", typed)  # fmt: skip
    assert page.is_checked("#def-retry") and page.is_enabled("#def-retry-max")
    assert (page.input_value("#def-retry-max"), page.input_value("#def-env")) == ("4", "TYPED=yes")
    assert "what you had typed" in page.inner_text("#notice")
    page.click("#def-save")
    page.wait_for_url(re.compile(r"#/tasks/typed-before-401$"))
    latest = site.api("GET", "/api/v1/tasks/typed-before-401").json()["latest"]
    assert (latest["argv"][2], latest["retry"]["max_attempts"]) == ("echo one\necho two", 4)
    assert page.errors == []


_SCAN = """() => {
  const texts = [];
  const skip = (el) => !el || el.closest('.raw, code, pre, script, style, option[lang]');
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!skip(n.parentElement) && n.data.trim()) texts.push(n.data.trim());
  }
  for (const el of document.querySelectorAll('[placeholder], [aria-label], [title]')) {
    if (skip(el)) continue;
    for (const a of ['placeholder', 'aria-label', 'title']) if (el.getAttribute(a)) texts.push(el.getAttribute(a));
  }
  texts.push(document.title.replace('qinglong-control', ''));
  return texts;
}"""


def _english_words(texts: list[str], allowed: set[str]) -> list[str]:
    found = []
    for text in texts:
        for word in re.findall(r"[A-Za-z][A-Za-z_:]+", text):
            if word not in allowed and not re.fullmatch(r"SIG[A-Z0-9]+", word):
                found.append(f"{word!r} in {text!r}")
    return found


def _zh_cn_pages_show_no_untranslated_label_and_every_page_is_captured(site: Site) -> None:
    # Scope names (runs:write) and other data are in .raw / code elements, skipped by the scan.
    allowed = set(ZH_AS_IS_WORDS)
    # A fired and a skipped slot for the schedule page; then it stays paused.
    assert site.api("POST", f"/api/v1/schedules/{site.schedule}/resume").is_success
    wait_until(
        "a fired and a skipped slot",
        lambda: {"fired", "skipped_overlap"} <= {d["decision"] for d in _decisions(site)},
        20,
    )
    assert site.api("POST", f"/api/v1/schedules/{site.schedule}/pause").is_success

    pages = {
        "runs": "runs",
        "run": f"runs/{site.finished_run}",
        "tasks": "tasks",
        "task": "tasks/hello",
        "new-task": "new-task",
        "new-revision": "tasks/hello/new-revision",
        "schedules": "schedules",
        "schedule": f"schedules/{site.schedule}",
        "new-schedule": "new-schedule",
        "edit-schedule": f"schedules/{site.schedule}/edit",
        "secrets": "secrets",
        "system": "system",
    }
    leaks: dict[str, list[str]] = {}
    passes = [("zh-CN", 360, "360-zh")]
    if os.environ.get("QL_UI_SCREENSHOTS_DIR"):  # refreshing docs/ui: the desktop views too
        passes.append(("en-US", 1280, "desktop"))
    for locale, width, suffix in passes:
        page = site.page(locale=locale, width=width)
        site.sign_in(page)
        assert page.evaluate("document.documentElement.lang") == locale.replace("-US", "")
        for name, route in pages.items():
            site.visit(page, route)
            if name == "run":
                page.wait_for_selector(".log-state.log-ended")
            site.shot(page, f"{name}-{suffix}")
            if locale == "zh-CN":
                words = _english_words(page.evaluate(_SCAN), allowed)
                if words:
                    leaks[name] = words
                width_px = page.evaluate("document.documentElement.scrollWidth")
                assert width_px <= width, f"{name} is {width_px} px wide at {width} px"
            if name == "new-schedule" and locale == "zh-CN":  # a policy's chosen sentence is
                # whole under its select, which cuts it off at phone width
                chosen = page.eval_on_selector_all("main select", """ss => ss.map((s) => {
                  const n = s.nextElementSibling;
                  const shown = Boolean(n) && n.matches('.chosen') && n.getClientRects().length;
                  return [s.selectedOptions[0].textContent, shown && n.textContent];
                })""")
                assert len(chosen) == 4 and all(a == b for a, b in chosen), chosen
            if name == "schedule":  # an instant's date is never cut ("2026-12-" / "07T...")
                page.wait_for_selector("tr[data-decision] td:first-child small")
                instants = "tr[data-decision] td:first-child small, tbody tr td:nth-child(2) code"
                dates = page.eval_on_selector_all(instants, f"es => es.map({_DATE_LINES})")
                assert dates and set(dates) == {1}, (locale, dates)
                over = page.evaluate(_TABLES_OVER)
                assert set(over) == {0}, f"{name} in {locale}: {over} px too wide"
        if locale == "zh-CN":  # the switch, by keyboard: English at once, and remembered
            page.focus("#lang")
            page.keyboard.press("ArrowUp")
            page.wait_for_selector("#nav a[href='#/runs']:text-is('Runs')")
            assert page.evaluate("localStorage.getItem('ql.lang')") == "en"
            assert page.evaluate("document.activeElement.id") == "lang"  # not the page's
        assert page.errors == []
        page.context.close()
    assert not leaks, leaks
    assert site.shots.joinpath("schedule-360-zh.png").stat().st_size > 0


def _the_keyboard_bad_numbers_unknown_ids_and_a_stopped_service_are_told_truthfully(
    site: Site,
) -> None:
    # The findings of an outside review in a real browser (session 25); each failed before.
    page = site.page()
    site.sign_in(page, path="tasks/hello")
    page.wait_for_selector("main[aria-busy=false] #ret-keep_runs")
    # "Skip to content" moves the focus to the content and stays on the page.
    before = page.url
    page.focus("#skip-link")
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement && document.activeElement.id === 'view'")
    assert page.url == before
    # A number field the browser cannot read is refused in the page, not saved as empty;
    # the refusal takes the focus.
    kept = site.api("GET", "/api/v1/tasks/hello/retention").json()["override"]
    page.fill("#ret-keep_runs", "")
    page.click("#ret-keep_runs")
    page.keyboard.type("1e")
    page.click("#retention-save")
    refused = page.wait_for_selector(".retention-form .result .error-box:focus")
    assert "not a number" in refused.inner_text()
    site.shot(page, "number-refused-desktop")
    assert site.api("GET", "/api/v1/tasks/hello/retention").json()["override"] == kept
    # Below the field's own bound: said in the page's words, before any request (the API's
    # 422 detail read "Input should be greater than or equal to 0", in English in zh-CN too).
    page.fill("#ret-keep_runs", "")
    page.fill("#ret-keep_days", "-1")
    page.click("#retention-save")
    page.wait_for_selector(".retention-form .result .error-box:focus >> text=a number of at least 0")
    page.fill("#ret-keep_days", "1.5")
    page.click("#retention-save")
    page.wait_for_selector(".retention-form .result .error-box:focus >> text=a whole number")
    assert site.api("GET", "/api/v1/tasks/hello/retention").json()["override"] == kept
    # An unknown run or task is the 404 and a way back, no controls that act on nothing,
    # under the page's heading (a page without a heading has nothing in a screen reader's
    # list of headings).
    site.visit(page, "runs/01900000-0000-7000-8000-000000000000")
    assert "Back to Runs" in page.inner_text("main")
    assert page.inner_text("main h1") == "Run 01900000-0000-7000-8000-000000000000"
    assert page.query_selector("main .error-box") and page.query_selector("#log") is None
    site.shot(page, "run-unknown-desktop")
    site.visit(page, "tasks/no-such-task")
    assert page.query_selector("main .error-box") and page.query_selector("#start-run") is None
    assert page.inner_text("main h1") == "Task no-such-task"
    # A run whose program is not there says so in words beside the code (from its ending
    # event; the attempt itself only has EXECUTOR_START_FAILED).
    put = site.api("PUT", "/api/v1/tasks/ghost/revisions/1", json={"argv": ["/nonexistent/ql"]})
    assert put.status_code == 201, put.text
    ghost = site.api("POST", "/api/v1/runs", json={"task": "ghost"}).json()["id"]
    site.visit(page, f"runs/{ghost}")
    page.wait_for_selector("table.attempts .status[data-status=failed]")
    ending = page.inner_text("table.attempts")
    assert "The program, or the interpreter its #! line names, was not found" in ending, ending
    assert "EXEC_FAILED ENOENT" in ending, ending
    # A run whose recipe names a secret nobody set says which one.
    recipe = site.api("POST", "/api/v1/recipes", json={"secrets": {"K": "never-set"}}).json()
    body = {"argv": ["/bin/true"], "recipe": recipe["id"]}
    assert site.api("PUT", "/api/v1/tasks/needs-secret/revisions/1", json=body).is_success
    needs = site.api("POST", "/api/v1/runs", json={"task": "needs-secret"}).json()["id"]
    site.visit(page, f"runs/{needs}")
    page.wait_for_selector("table.attempts .status[data-status=failed]")
    ending = page.inner_text("table.attempts")
    assert "Set this secret on the Secrets page: never-set" in ending, ending
    # A task saved with a secret nobody set is saved, with a warning that names it.
    site.visit(page, "new-task")
    page.wait_for_selector("main[aria-busy=false] #def-argv")
    page.fill("#def-task", "unset-secret")
    page.fill("#def-argv", "/bin/true")
    page.fill("#def-secrets", "K=not-set-here")
    page.click("#def-save")
    warned = page.wait_for_selector("#notice .notice-warn")
    assert "Not set yet" in warned.inner_text() and "not-set-here" in warned.inner_text()
    assert site.api("GET", "/api/v1/tasks/unset-secret").status_code == 200
    # Resume and pause keep the keyboard on the control that replaced the one pressed (the
    # schedule was left paused, and is again).
    site.visit(page, f"schedules/{site.schedule}")
    page.focus("#resume")
    page.keyboard.press("Enter")
    page.wait_for_selector("#pause:focus")
    page.keyboard.press("Enter")
    page.wait_for_selector("#resume:focus")
    # A secret's delete asks in a row of its own (no column moves), the keyboard on "Keep it";
    # "Yes, delete" removes it and the keyboard goes on from a remaining row's "Delete…".
    for secret in ("gone-soon", "stays"):
        assert site.api("PUT", f"/api/v1/secrets/{secret}", json={"value": "v"}).is_success
    site.visit(page, "secrets")
    row = "tr[data-secret='gone-soon']"
    page.wait_for_selector(row)
    assert page.evaluate(_UNTIED_HELP) == []
    # What the secret form lacks is said in the page (not a browser bubble) and nothing is sent.
    page.click("form.secret-form button[type=submit]")
    said = page.wait_for_selector(".result .error-box:focus")
    assert "needs a name" in said.inner_text()
    page.fill("#secret-name", "Bad Name")
    page.fill("#secret-value", "v")
    page.click("form.secret-form button[type=submit]")
    page.wait_for_selector(".result .error-box:focus:has-text('lower-case letters')")
    page.fill("#secret-name", "no-value")
    page.fill("#secret-value", "")
    page.click("form.secret-form button[type=submit]")
    page.wait_for_selector(".result .error-box:focus:has-text('Type the value')")
    names = {s["name"] for s in site.api("GET", "/api/v1/secrets").json()["items"]}
    assert not names & {"no-value", "Bad Name"}, names
    # Saved: the button, disabled while it saved, has the keyboard again.
    page.fill("#secret-name", "via-form")
    page.fill("#secret-value", "v")
    page.click("form.secret-form button[type=submit]")
    page.wait_for_selector(".result .notice-ok")
    page.wait_for_selector("form.secret-form button[type=submit]:focus")
    columns = "[...document.querySelectorAll('thead th')].map((th) => th.getBoundingClientRect().x)"
    before_x = page.evaluate(columns)
    page.click(f"{row} .row-actions button")
    page.wait_for_selector("tr.confirm-row button.secondary:focus")
    after_x = page.evaluate(columns)
    assert all(abs(a - b) < 1 for a, b in zip(after_x, before_x, strict=True)), (before_x, after_x)
    site.shot(page, "secret-delete-question-desktop")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"{row} .row-actions button:focus")
    assert page.query_selector("tr.confirm-row") is None
    page.click(f"{row} .row-actions button")  # Escape keeps it as well
    page.wait_for_selector("tr.confirm-row button.secondary:focus")
    page.keyboard.press("Escape")
    page.wait_for_selector(f"{row} .row-actions button:focus")
    assert page.query_selector("tr.confirm-row") is None
    page.click(f"{row} .row-actions button")
    page.click("tr.confirm-row button.danger")
    page.wait_for_selector(row, state="detached")
    focused = page.evaluate("document.activeElement.closest('tr[data-secret]')?.dataset.secret")
    names = {s["name"] for s in site.api("GET", "/api/v1/secrets").json()["items"]}
    assert "gone-soon" not in names and focused in names, (focused, names)
    # "Load more" by keyboard: the focus goes on from the first row it added (the button is
    # gone after the last page), not from the page's top.
    many = [f"zz-more-{n:02d}" for n in range(50)]
    for secret in many:
        assert site.api("PUT", f"/api/v1/secrets/{secret}", json={"value": "v"}).is_success
    page.reload()  # the same address: site.visit would not draw the page again
    page.wait_for_selector("main[aria-busy=false] .load-more:visible")
    shown = len(page.query_selector_all("tr[data-secret]"))
    page.focus(".load-more")
    page.keyboard.press("Enter")
    page.wait_for_selector(".load-more", state="hidden")
    page.wait_for_selector("tr[data-secret]:focus")
    secret_rows = "[...document.querySelectorAll('tr[data-secret]')]"
    assert page.evaluate(f"{secret_rows}.indexOf(document.activeElement)") == shown
    for secret in many:
        assert site.api("DELETE", f"/api/v1/secrets/{secret}").is_success
    # A poll that keeps failing shows its error once: the same alert put again at each tick
    # (2 s) would be read out again and again by a screen reader.
    site.visit(page, "runs")
    runs_list = re.compile(r"/api/v1/runs\?")
    page.route(runs_list, lambda route: route.abort())
    said = page.wait_for_selector("main .error-box")
    page.wait_for_timeout(4_500)
    assert said.evaluate("(e) => e.isConnected") and len(page.query_selector_all(".error-box")) == 1
    page.unroute(runs_list)
    page.wait_for_selector("main .error-box", state="detached")  # and gone once it answers
    # A 5xx is the server failing, not refusing: the guard's bare 500 (app/api/asgi.py) reads
    # as such.
    internal = {"type": "about:blank", "title": "Internal Server Error", "status": 500,
                "code": "INTERNAL_ERROR", "detail": "an internal error occurred"}  # fmt: skip
    page.route(runs_list, lambda route: route.fulfill(
        status=500, content_type="application/problem+json", body=json.dumps(internal)))  # fmt: skip
    said = page.wait_for_selector("main .error-box").inner_text()
    assert "The server failed to answer (HTTP 500, INTERNAL_ERROR)" in said, said
    assert "refused" not in said, said
    page.unroute(runs_list)
    page.wait_for_selector("main .error-box", state="detached")
    # The system page does not keep saying "Ready" once the service is gone.
    site.visit(page, "system")
    page.wait_for_selector("ul.checks")
    site.served.stop()
    page.wait_for_selector("text=The server could not be reached", timeout=15_000)
    assert page.query_selector("ul.checks") is None
    site.shot(page, "system-unreachable-desktop")
    assert page.errors == []


def _a_waiting_retry_and_an_ended_schedule_are_said_as_such(site: Site) -> None:
    """A run between attempts says until when its retry waits; a schedule past its
    ``end_at_ms`` says ``ended``, not ``active`` (no slot is left); one changed line of two
    revisions reads in the singular."""
    body = {"argv": ["/bin/sh", "-c", "echo first try; exit 1"],
            "retry": {"max_attempts": 2, "initial_delay_seconds": 300, "jitter": False}}  # fmt: skip
    assert site.api("PUT", "/api/v1/tasks/flaky/revisions/1", json=body).status_code == 201
    run_id = enqueue(site.served, "flaky")
    wait_until("the retry waits", lambda: get_run(site.served, run_id)["next_attempt_at_ms"], 30)
    page = site.page()
    site.sign_in(page, path=f"runs/{run_id}")
    page.wait_for_selector("text=Retry waits until")
    # The waiting attempt 2 has no output: the log shown is attempt 1's.
    page.wait_for_selector("text=first try")
    assert "attempt 1" in page.inner_text("h2:has-text('Log')")
    assert "A retry, not started yet." in page.inner_text("table.attempts")
    # The waiting attempt's status is a word a user reads ("waiting", not "claimed"), and
    # the retry's instant in the events reads as a time, not 13 digits.
    assert "waiting" in page.inner_text("table.attempts")
    events = page.inner_text(".timeline")
    assert "not_before=" in events and "not_before_ms" not in events, events
    assert "signal=null" not in events
    site.shot(page, "run-retry-waits")
    assert site.api("POST", f"/api/v1/runs/{run_id}/cancel").is_success
    ended = {"task": "hello", "every_seconds": 60, "end_at_ms": int(time.time() * 1000) - 60_000}
    assert site.api("PUT", "/api/v1/schedules/ended-one", json=ended).status_code == 201
    site.visit(page, "schedules")
    row = page.locator("tr", has_text="ended-one")
    assert "ended" in row.inner_text() and "active" not in row.inner_text()
    site.shot(page, "schedules-ended")
    assert site.api("DELETE", "/api/v1/schedules/ended-one").is_success
    # Two revisions one line apart: the compare section says so in the singular.
    for n, timeout in ((1, 5), (2, 6)):
        body = {"argv": ["/bin/true"], "timeout_seconds": timeout}
        assert site.api("PUT", f"/api/v1/tasks/one-line/revisions/{n}", json=body).is_success
    site.visit(page, "tasks/one-line")
    page.wait_for_selector("text=1 line differs.")
    # Its marks and colours are hidden from a screen reader, which reads the kind in words.
    assert page.text_content("tr.diff-changed td.new .sr-only") == "changed: "
    # An environment value changed: the key's line says so (its recipe's digest alone did
    # not say what changed), and no value is on the page.
    for n, value in ((1, "first-value-x"), (2, "second-value-y")):
        env = {"CHANGED": value, "KEPT": "kept-value-z"}
        recipe = site.api("POST", "/api/v1/recipes", json={"env": env}).json()["id"]
        body = {"argv": ["/bin/true"], "recipe": recipe}
        assert site.api("PUT", f"/api/v1/tasks/env-change/revisions/{n}", json=body).is_success
    site.visit(page, "tasks/env-change")
    page.wait_for_selector("text=2 lines differ.")  # the recipe's id, and CHANGED
    changed = [row.inner_text() for row in page.query_selector_all("tr.diff-changed")]
    assert any("CHANGED" in row and "another value" in row for row in changed), changed
    assert not any("KEPT" in row for row in changed), changed
    html = page.content()
    assert not any(v in html for v in ("first-value-x", "second-value-y", "kept-value-z"))
    # A compare is in the address, so a link to it shows the same two revisions.
    page.click("#compare button[type=submit]")
    assert page.url.endswith("#/tasks/env-change?compare=1-2"), page.url
    third = {"argv": ["/bin/false"], "recipe": recipe}
    assert site.api("PUT", "/api/v1/tasks/env-change/revisions/3", json=third).is_success
    site.visit(page, "tasks/env-change?compare=1-3")
    page.wait_for_function("document.querySelector('#diff-right').value === '3'")
    assert page.input_value("#diff-left") == "1"
    assert page.errors == []


def _the_runs_and_schedules_tables_fit_a_phone_in_both_languages(site: Site) -> None:
    """English status words are wider than Chinese ones: at 360 and 390 px the runs, the
    schedules and a run's attempts tables fit their box in both (a run's id, a schedule's task
    and cadence move under the name, the attempts' headers wrap), no column scrolled out (a
    table without a link in it could not even be scrolled by keyboard); a cron expression
    stays on one line."""
    cron = {"task": "hello", "cron": ["*/15 9-17 * * 1-5"], "paused": True}
    assert site.api("PUT", "/api/v1/schedules/office-hours", json=cron).status_code == 201
    fits = _TABLES_OVER
    lines = "e => e.getClientRects().length"  # an inline element: one box a line it spans
    for locale in ("en-US", "zh-CN"):
        page = site.page(locale=locale, width=390)
        site.sign_in(page, path="runs")
        page.wait_for_selector("tbody tr[data-run] td:nth-child(2) .narrow a:visible")
        routes = {"runs": "runs", "schedules": "schedules", "run": f"runs/{site.finished_run}"}
        for name, route in routes.items():
            site.visit(page, route)
            for width in (390, 360):
                page.set_viewport_size({"width": width, "height": 800})
                over = page.evaluate(fits)
                assert over == [0], f"{name} in {locale} at {width} px: {over} px too wide"
            if name == "schedules":
                assert page.eval_on_selector(".narrow .cron code", lines) == 1
            if locale == "en-US":  # the zh-CN ones are taken with every page below
                site.shot(page, f"{name}-360-en")
            page.set_viewport_size({"width": 390, "height": 800})
        assert page.errors == []
        page.context.close()
    assert site.api("DELETE", "/api/v1/schedules/office-hours").is_success


def _a_paused_schedules_next_fires_say_they_wait_for_a_resume(site: Site) -> None:
    """Listed next fire times of a paused schedule do not read as runs to come."""
    page = site.page()
    site.sign_in(page, path="schedules")
    row = page.locator("tr", has_text=site.schedule)
    assert "only if resumed" in row.inner_text()
    site.visit(page, f"schedules/{site.schedule}")
    note = "Paused: none of these fires until the schedule is resumed."
    assert page.locator(f"text={note}").is_visible()
    page.click("#resume")
    page.wait_for_selector("#pause:focus")
    assert not page.locator(f"text={note}").is_visible()
    page.click("#pause")
    page.wait_for_selector("#resume:focus")
    assert page.locator(f"text={note}").is_visible()
    assert page.errors == []
    page.context.close()


# A datetime-local value (the browser's local time, to the second) ``minutes`` from now.
_LOCAL_IN = """(minutes) => {
  const at = new Date(Date.now() + minutes * 60000);
  const pad = (n) => String(n).padStart(2, '0');
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}T${pad(at.getHours())}:${pad(at.getMinutes())}:${pad(at.getSeconds())}`;
}"""


def _the_runs_page_filters_by_schedule_and_by_a_window_of_created_time(site: Site) -> None:
    """A schedule's page links to the runs it started; the runs page narrows them to a
    window typed in local time, kept in the address as instants, and refuses a window that
    ends before it starts without asking the server."""
    every = {"task": "hello", "every_seconds": 1}
    assert site.api("PUT", "/api/v1/schedules/ui-window", json=every).status_code == 201
    started: list[str] = []

    def fired() -> bool:
        page = site.api("GET", "/api/v1/runs", params={"schedule": "ui-window"}).json()
        started[:] = [r["id"] for r in page["items"]]
        return bool(started)

    wait_until("a run of schedule ui-window", fired, 20)
    assert site.api("POST", "/api/v1/schedules/ui-window/pause").status_code == 200
    fired()  # every run it started before the pause
    # In Berlin, not this machine's UTC: the local time typed is not the instant sent.
    page = site.page(timezone_id="Europe/Berlin")
    site.sign_in(page, path="schedules/ui-window")
    page.click("#schedule-runs")
    page.wait_for_url(re.compile(r"#/runs\?schedule=ui-window$"))
    page.wait_for_selector("main[aria-busy=false] tbody tr[data-run]")
    shown = page.eval_on_selector_all("tbody tr[data-run]", "rs => rs.map((r) => r.dataset.run)")
    assert shown == started
    assert page.input_value("#filter-schedule") == "ui-window"
    # A window that ends before it starts is said at the form; nothing is asked.
    page.fill("#filter-since", page.evaluate(_LOCAL_IN, 5))
    page.fill("#filter-until", page.evaluate(_LOCAL_IN, -5))
    page.click("form.filters button[type=submit]")
    said = page.wait_for_selector("#filter-error:visible").inner_text()
    assert said == "“Created from” must be earlier than “Created before”."
    assert page.url.endswith("#/runs?schedule=ui-window")
    # A time half typed has no value (validity.badInput): said, never listed unfiltered. So
    # is a local time the clock skips (Berlin's 02:00 to 03:00 on 2026-03-29).
    page.fill("#filter-until", "")
    page.fill("#filter-since", "")
    page.focus("#filter-since")
    page.keyboard.type("12312030")
    page.click("form.filters button[type=submit]")
    page.wait_for_function(
        "() => document.getElementById('filter-error').textContent.startsWith('“Created from” is not')"
    )
    assert page.url.endswith("#/runs?schedule=ui-window")
    assert page.get_attribute("#filter-since", "aria-invalid") == "true"
    page.fill("#filter-since", "")
    site.visit_by(page, lambda: page.click("form.filters button[type=submit]"))  # cleared
    assert not page.is_visible("#filter-error")
    page.fill("#filter-until", "10000-01-01T00:00")  # a year past 9999
    page.click("form.filters button[type=submit]")
    page.wait_for_function(
        "() => document.getElementById('filter-error').textContent.startsWith('“Created before” is not')"
    )
    assert page.url.endswith("#/runs?schedule=ui-window")
    page.fill("#filter-until", "2026-03-29T02:30:00")
    page.fill("#filter-since", "")
    page.click("form.filters button[type=submit]")
    page.wait_for_function(
        "() => document.getElementById('filter-error').textContent.includes('the clock skips')"
    )
    assert page.url.endswith("#/runs?schedule=ui-window")
    # From five minutes ahead: nothing yet. The address holds the instant, in UTC.
    page.fill("#filter-until", "")
    ahead = page.evaluate(_LOCAL_IN, 5)
    page.fill("#filter-since", ahead)
    site.visit_by(page, lambda: page.click("form.filters button[type=submit]"))
    utc = datetime.fromisoformat(ahead).replace(tzinfo=ZoneInfo("Europe/Berlin")).astimezone(UTC)
    assert page.url.endswith(utc.strftime("since=%Y-%m-%dT%H%%3A%M%%3A%S.000Z")), page.url
    assert page.locator("text=No runs match.").is_visible()
    assert not page.is_visible("#filter-error")
    # A window from a link keeps its milliseconds when another filter changes.
    site.visit(page, "runs?schedule=ui-window&since=2000-01-01T00%3A00%3A00.750Z")
    page.select_option("#filter-status", "succeeded")
    site.visit_by(page, lambda: page.click("form.filters button[type=submit]"))
    assert "since=2000-01-01T00%3A00%3A00.750Z" in page.url, page.url
    # Up to five minutes ahead: every run it started.
    page.fill("#filter-since", "")
    page.fill("#filter-until", page.evaluate(_LOCAL_IN, 5))
    site.visit_by(page, lambda: page.click("form.filters button[type=submit]"))
    assert "until=" in page.url and "since=" not in page.url
    shown = page.eval_on_selector_all("tbody tr[data-run]", "rs => rs.map((r) => r.dataset.run)")
    assert shown == started
    site.shot(page, "runs-filtered")
    # The filter bar's labels line up: its controls are one height, in rows of columns.
    tops = page.eval_on_selector_all(
        "form.runs-filters .field > :is(input, select)",
        "es => es.map((e) => [e.getBoundingClientRect().top, e.getBoundingClientRect().height])",
    )
    assert [t[1] for t in tops] == [tops[0][1]] * 5 and tops[0][0] == tops[1][0] == tops[2][0], tops
    assert tops[3][0] == tops[4][0], tops
    assert page.errors == []
    page.context.close()
    assert site.api("DELETE", "/api/v1/schedules/ui-window").is_success


# Tab order against the order seen: rows top to bottom, left to right within a row (two
# boxes whose vertical extents overlap by half the smaller height share a row).
_HEADER_ORDERS = """() => {
  const seen = (e) => e.getClientRects().length > 0;
  const controls = [...document.querySelectorAll('header.top a, header.top select, header.top button')].filter(seen);
  const name = (e) => e.id || e.getAttribute('href') || e.tagName;
  const box = (e) => e.getBoundingClientRect();
  const visual = [...controls].sort((a, b) => {
    const [p, q] = [box(a), box(b)];
    const overlap = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
    if (overlap < Math.min(p.height, q.height) / 2) return p.top - q.top;
    return p.left - q.left;
  });
  const positive = [...document.querySelectorAll('[tabindex]')].filter((e) => e.tabIndex > 0);
  return [controls.map(name), visual.map(name), positive.map(name)];
}"""

_FOCUSED = "(e => e.id || e.getAttribute('href') || e.tagName)(document.activeElement)"


def _the_headers_tab_order_is_the_order_it_is_seen_in_at_any_width(site: Site) -> None:
    """At phone width the header wraps onto rows: its Tab order (the document's, no positive
    tabindex) must read as the rows do, in both languages."""
    for locale in ("en-US", "zh-CN"):
        page = site.page(locale=locale, width=1280)
        site.sign_in(page, path="runs")
        for width in (1280, 640, 390, 360, 320):
            page.set_viewport_size({"width": width, "height": 800})
            tab, seen, positive = page.evaluate(_HEADER_ORDERS)
            assert positive == [], positive
            assert tab == seen, f"{locale} at {width} px: Tab {tab}, seen {seen}"
            width_px = page.evaluate("document.documentElement.scrollWidth")
            assert width_px <= width, f"header in {locale} is {width_px} px wide at {width} px"
            if width == 360:
                site.shot(page, f"header-360-{locale}")
        # The keyboard itself: from the skip link, Tab walks the header in that order.
        page.focus("#skip-link")
        walked = []
        for _ in range(len(tab)):
            page.keyboard.press("Tab")
            walked.append(page.evaluate(_FOCUSED))
        assert walked == tab, walked
        assert page.errors == []
        page.context.close()


def _a_slow_page_says_it_is_loading_until_its_first_answer(site: Site) -> None:
    """A table whose first answer has not come is busy and says "Loading…" in a row of its
    own (it was an empty table under its headings), in English and zh-CN."""
    for locale, loading in (("en-US", "Loading…"), ("zh-CN", "加载中…")):
        _the_runs_page_while_its_list_is_held(site, locale, loading)


def _the_runs_page_while_its_list_is_held(site: Site, locale: str, loading: str) -> None:
    page = site.page(locale=locale)
    site.sign_in(page, path="system")
    held: list[Any] = []
    holding = [True]

    def hold(route: Any) -> None:
        if holding[0]:
            held.append(route)
        else:
            route.continue_()

    page.route("**/api/v1/runs?*", hold)
    page.goto(site.ui + "#/runs")
    row = page.wait_for_selector("table.runs[aria-busy=true] tbody tr.loading-row")
    assert row.inner_text().strip() == loading
    assert page.get_attribute("main", "aria-busy") == "true"
    assert held, "the runs list was not asked for"
    if locale == "en-US":
        site.shot(page, "runs-loading")
    holding[0] = False
    for route in held:
        route.continue_()
    page.wait_for_selector("table.runs[aria-busy=false] tbody tr[data-run]")
    page.wait_for_selector("main[aria-busy=false]")
    assert page.query_selector("tr.loading-row") is None
    page.unroute("**/api/v1/runs?*")
    # A run's event timeline (a list, not a table) says it too until its events come.
    run_id = site.api("GET", "/api/v1/runs", params={"limit": 1}).json()["items"][0]["id"]
    held.clear()
    holding[0] = True
    page.route("**/events*", hold)
    page.goto(site.ui + f"#/runs/{run_id}")
    item = page.wait_for_selector("ol.timeline[aria-busy=true] li.loading-row")
    assert item.inner_text().strip() == loading
    holding[0] = False
    for route in held:
        route.continue_()
    page.wait_for_selector("ol.timeline[aria-busy=false] li:not(.loading-row)")
    assert page.query_selector("li.loading-row") is None
    page.unroute("**/events*")
    assert page.errors == []
    page.context.close()


def _a_run_the_service_stopped_on_exit_says_so_not_a_user(site: Site) -> None:
    """``serve --stop-jobs-on-exit`` records its cancel under the reason ``user`` (older
    builds read no other); its event says the service asked, and so does the run's page."""
    run_id = enqueue(site.served, "sleeper")
    wait_status(site.served, run_id, {"running"})
    engine = make_engine(Settings.from_env(site.served.env).database_url)
    try:  # as app/supervisor/stop_jobs.py asks, on the serve's own database
        RunRepository(engine).request_cancel(
            run_id=run_id, reason=SERVICE_STOP_REASON, service_stop=True
        )
    finally:
        engine.dispose()
    for locale, width, words in (
        ("en-US", 1280, "by the service, as it exited (--stop-jobs-on-exit)"),
        ("zh-CN", 360, "由服务在退出时发起"),
    ):
        page = site.page(locale=locale, width=width)
        site.sign_in(page, path=f"runs/{run_id}")
        page.wait_for_selector(".facts >> text=" + words.split(" (")[0])
        site.shot(page, f"run-service-stop-{locale}")
        facts = page.inner_text(".facts")
        assert words in facts, facts
        assert "by a user" not in facts and "由用户" not in facts
        assert page.errors == []
        page.context.close()
    assert wait_status(site.served, run_id, TERMINAL)["status"] == "cancelled"


def _a_runs_status_change_is_announced_once(site: Site) -> None:
    """The run page's status is a polite live region that stays in place: a status the poll
    sees change (here a run cancelled while queued, before any attempt started) is read out,
    and a poll that sees the same status changes nothing in it, so nothing is read again."""
    body = {"argv": ["/bin/sh", "-c", "exec sleep 300"], "max_concurrent": 1}
    r = site.api("PUT", "/api/v1/tasks/one-at-a-time/revisions/1", json=body)
    assert r.status_code in (200, 201), r.text
    first = enqueue(site.served, "one-at-a-time")
    wait_status(site.served, first, {"running"})
    queued = enqueue(site.served, "one-at-a-time")
    page = site.page()
    site.sign_in(page, path=f"runs/{queued}")
    _badge(page, "queued")
    # Why it waits, in words: its task allows one run at once, and one is running.
    facts = page.inner_text(".facts")
    assert "for its task: 1 of its runs is active, its revision allows 1 at once" in facts
    region = ".page-head [role=status]"
    assert page.get_attribute(region, "aria-live") == "polite"
    assert page.get_attribute(region, "aria-atomic") == "true"
    page.evaluate(f"document.querySelector('{region}').qlKept = true")
    page.evaluate(f"document.querySelector('{region} .status').qlKept = true")
    page.wait_for_timeout(2500)  # two polls that see the same status
    assert page.evaluate(f"document.querySelector('{region} .status').qlKept === true")
    assert site.api("POST", f"/api/v1/runs/{queued}/cancel").is_success
    page.wait_for_selector(f"{region} .status[data-status=cancelled]")
    assert page.evaluate(f"document.querySelector('{region}').qlKept === true")
    assert get_run(site.served, queued)["started_at_ms"] is None  # no attempt ever ran
    assert page.inner_text(region).split() == ["Status", "⊘", "cancelled"]
    assert site.api("POST", f"/api/v1/runs/{first}/cancel").is_success
    wait_status(site.served, first, {"cancelled"})
    assert page.errors == []
    page.context.close()


_TIMES = """() => [...document.querySelectorAll('main time')].map((e) => {
  const utc = e.getAttribute('datetime').replace(/\\.\\d{3}Z$/, 'Z');
  const hidden = e.querySelector('.utc');
  return [utc, e.textContent, hidden ? hidden.getBoundingClientRect().width : null, e.title];
})"""


def _a_times_utc_form_is_in_its_text_not_only_a_title(site: Site) -> None:
    """A title reaches neither the keyboard, a touch screen nor (reliably) a screen reader:
    each time carries its UTC form as text, hidden until hovered, in both languages, and no
    title besides (Chromium reads a title as the time's description: the UTC form twice)."""
    for locale in ("en-US", "zh-CN"):
        page = site.page(locale=locale)
        site.sign_in(page, path=f"runs/{site.finished_run}")
        page.wait_for_selector("main[aria-busy=false] .timeline time")
        times = page.evaluate(_TIMES)
        assert times, "no time on the run page"
        for utc, text, hidden_width, title in times:
            assert utc in text, (utc, text)
            assert hidden_width is not None and hidden_width <= 1, (utc, hidden_width)
            assert title == "", (utc, title)
        page.hover(".facts time")
        width = "e => e.getBoundingClientRect().width"
        shown = page.eval_on_selector(".facts time .utc", width)
        assert shown > 50, shown
        if locale == "en-US":
            site.shot(page, "time-hover-desktop")
        # WCAG 1.4.13: Escape hides it without moving the pointer; it shows again once the
        # pointer has left the time and come back.
        page.keyboard.press("Escape")
        assert page.eval_on_selector(".facts time .utc", width) <= 1
        page.hover("h1")
        page.hover(".facts time")
        assert page.eval_on_selector(".facts time .utc", width) > 50
        assert page.errors == []
        page.context.close()


_SCROLLS_UNREACHABLY = """() => [...document.querySelectorAll('.table-wrap')]
  .filter((w) => w.scrollWidth > w.clientWidth
    && w.tabIndex < 0 && !w.querySelector('a[href], button, input, select, textarea, [tabindex]'))
  .map((w) => `${w.querySelector('table').className || 'table'} ${w.scrollWidth - w.clientWidth} px`)"""


def _nothing_is_wider_than_a_320_px_phone(site: Site) -> None:
    """WCAG 1.4.10 reflow at 320 px, in English (the wider words) and zh-CN: nothing widens
    the page, a run's attempts (with a log retention removed, the widest) fit their box, and
    a table that still scrolls sideways holds a control, so the keyboard can scroll it."""
    routes = {
        "runs": "runs",
        "run": f"runs/{site.finished_run}",
        "expired": f"runs/{site.expiring_run}",
        "tasks": "tasks",
        "task": "tasks/hello",
        "new-task": "new-task",
        "schedules": "schedules",
        "schedule": f"schedules/{site.schedule}",
        "new-schedule": "new-schedule",
        "secrets": "secrets",
        "system": "system",
    }
    wider = []
    for locale in ("en-US", "zh-CN"):
        page = site.page(locale=locale, width=320)
        site.sign_in(page, path="runs")
        for name, route in routes.items():
            site.visit(page, route)
            width_px = page.evaluate("document.documentElement.scrollWidth")
            if width_px > 320:
                wider.append(f"{name} in {locale}: the page is {width_px} px")
            if name in ("run", "expired"):
                page.wait_for_selector("table.attempts .status")
                over = page.eval_on_selector(
                    ".table-wrap:has(table.attempts)", "w => w.scrollWidth - w.clientWidth"
                )
                if over:
                    wider.append(f"{name} in {locale}: the attempts are {over} px too wide")
            wider.extend(f"{name} in {locale}: {w}" for w in page.evaluate(_SCROLLS_UNREACHABLY))
            if name == "expired":
                site.shot(page, f"run-320-{locale}")
        assert page.errors == []
        page.context.close()
    assert not wider, wider


_CRON_CODES = "[...document.querySelectorAll('#sch-cron-help code')].map((c) => c.textContent)"


def _the_cron_help_names_the_aliases_in_both_languages(site: Site) -> None:
    """The aliases are data, not words: in code elements, so zh-CN names them too."""
    for locale in ("en-US", "zh-CN"):
        page = site.page(locale=locale)
        site.sign_in(page, path="new-schedule")
        page.wait_for_selector("main[aria-busy=false] #sch-cron-help")
        codes = page.evaluate(_CRON_CODES)
        for alias in ("@hourly", "@daily", "@weekly", "@monthly", "@yearly"):
            assert alias in codes, (locale, codes)
        # The zone's help speaks of the cadence chosen: an interval has no expressions, and
        # fires at the same instants in any zone.
        cron_zone = page.inner_text("#sch-timezone-help")
        assert ("expressions" if locale == "en-US" else "表达式") in cron_zone, cron_zone
        page.check("#sch-kind-every")
        every_zone = page.inner_text("#sch-timezone-help")
        assert "expression" not in every_zone and "表达式" not in every_zone, every_zone
        assert "1970-01-01 UTC" in every_zone, every_zone
        site.shot(page, f"new-schedule-every-{locale}")
        assert page.errors == []
        page.context.close()


def _switching_the_language_keeps_what_was_typed(site: Site) -> None:
    """The page is drawn again in the other language: a half-typed form was blanked."""
    page = site.page()
    site.sign_in(page, path="new-task")
    page.wait_for_selector("main[aria-busy=false] #def-argv")
    page.fill("#def-task", "typed-then-switched")
    page.fill("#def-argv", "/bin/echo\nkept")
    page.select_option("#lang", "zh-CN")
    page.wait_for_selector("#nav a[href='#/runs']:text-is('运行')")
    page.wait_for_selector("main[aria-busy=false] #def-argv")
    assert (page.input_value("#def-task"), page.input_value("#def-argv")) == (
        "typed-then-switched", "/bin/echo\nkept")  # fmt: skip
    assert page.inner_text("#notice") == ""  # nothing happened to the typing: nothing said
    page.select_option("#lang", "en")
    page.wait_for_selector("#nav a[href='#/runs']:text-is('Runs')")
    assert page.input_value("#def-task") == "typed-then-switched"
    assert page.errors == []
    page.context.close()


def _decisions(site: Site) -> list[dict[str, Any]]:
    r = site.api("GET", f"/api/v1/schedules/{site.schedule}/decisions")
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def test_the_ui_in_a_real_browser_against_a_real_serve(site: Site) -> None:
    """Issue 17's flows, in order; a failure names its flow in the traceback."""
    _sign_in_see_runs_and_watch_a_started_run_stream_its_log_live_to_succeeded(site)
    _cancel_a_long_run_ends_cancelled(site)
    _a_running_log_past_its_head_says_what_it_keeps_not_0_bytes_dropped(site)
    _a_truncated_logs_gap_is_marked_in_the_log_box_where_its_bytes_were_dropped(site)
    _markup_in_a_definition_and_a_log_line_renders_as_text_and_runs_no_script(site)
    _the_api_docs_page_runs_no_swagger_bytes_but_the_pinned_ones(site)
    _define_a_task_and_a_revision_then_start_rerun_and_pin_its_run(site)
    _create_edit_and_delete_a_schedule_in_the_ui(site)
    _the_system_page_says_how_the_worker_holds_the_job_process_limit(site)
    _the_tasks_list_says_each_tasks_last_run(site)
    _archive_a_task_after_a_question_and_find_it_among_the_archived(site)
    _a_read_only_token_is_offered_no_write_and_told_which_scope_it_lacks(site)
    _a_waiting_retry_and_an_ended_schedule_are_said_as_such(site)
    _the_runs_and_schedules_tables_fit_a_phone_in_both_languages(site)
    _a_paused_schedules_next_fires_say_they_wait_for_a_resume(site)
    _the_runs_page_filters_by_schedule_and_by_a_window_of_created_time(site)
    _the_headers_tab_order_is_the_order_it_is_seen_in_at_any_width(site)
    _a_runs_status_change_is_announced_once(site)
    _a_slow_page_says_it_is_loading_until_its_first_answer(site)
    _a_run_the_service_stopped_on_exit_says_so_not_a_user(site)
    _a_times_utc_form_is_in_its_text_not_only_a_title(site)
    _nothing_is_wider_than_a_320_px_phone(site)
    _the_cron_help_names_the_aliases_in_both_languages(site)
    _switching_the_language_keeps_what_was_typed(site)
    _zh_cn_pages_show_no_untranslated_label_and_every_page_is_captured(site)
    _the_keyboard_bad_numbers_unknown_ids_and_a_stopped_service_are_told_truthfully(site)
