"""Shared fixtures: a migrated database on SQLite (a real file) and on PostgreSQL; test tiers.

Every test gets exactly one tier marker from its folder (docs/testing.md §Tiers):
tests/unit → ``unit`` (pure logic: no database, no process of ours), tests/e2e → ``e2e`` (a
real ``qinglong serve``), every other folder → ``integration`` (real databases, processes,
files). A unit test that asks for a database or process fixture is a collection error.

PostgreSQL tests run when QL_TEST_POSTGRES_URL is set (CI sets it) and are skipped with a
reason otherwise; when it is set, an unreachable server fails the run. Each pytest process
migrates its own fresh schema once, truncates it before every test and drops it at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import Engine, create_engine, text

from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.private_files import SERVICE_UMASK
from app.storage.tables import metadata
from tests.kit.processes import Processes

PG_ENV = "QL_TEST_POSTGRES_URL"
TESTS = Path(__file__).resolve().parent
TIER_FOLDERS = {"unit": "unit", "e2e": "e2e"}  # any other folder is "integration"
# Fixtures that reach a real database, a spawned process or a served instance.
NOT_UNIT_FIXTURES = frozenset({
    "db_url", "engine", "postgres_url", "sqlite_template", "procs",
    "served", "serve_factory", "module_serve_factory",
})  # fmt: skip


ROOT = TESTS.parent
# What tools make in a checkout (the venv, caches, build metadata, coverage data): a run
# that leaves one of these behind has not strayed into the checkout.
TOOL_DIRS = frozenset({
    ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
    ".import_linter_cache", ".hypothesis", ".tox", ".nox", "htmlcov",
})  # fmt: skip
_CHECKOUT_BEFORE = pytest.StashKey[tuple[frozenset[str], float]]()
_CHECKOUT_GAINED = pytest.StashKey[list[str]]()


def _tool_output(entry: str) -> bool:
    parts = Path(entry).parts
    if parts[-1].startswith(".coverage"):  # coverage.py's data files
        return True
    return any(p in TOOL_DIRS or p.endswith(".egg-info") for p in parts)


def _git_untracked(root: Path) -> set[str]:
    """Untracked and ignored entries anywhere in ``root``'s git checkout (a directory git
    shows whole, as one); none when git is missing or ``root`` is not a checkout's top
    (an unpacked tarball, an installed tree)."""
    try:
        top = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
            return set()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--ignored", "-z"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return set()
    if status.returncode != 0:
        return set()
    records = status.stdout.decode("utf-8", "surrogateescape").split("\0")
    return {r[3:].rstrip("/") for r in records if r[:3] in ("?? ", "!! ")}


def checkout_entries(root: Path = ROOT) -> frozenset[str]:
    """The names in the checkout's root and in ``app/`` (as relative paths), and with git
    every untracked or ignored entry, tool output left out."""
    found = _git_untracked(root)
    for folder in (".", "app"):
        with contextlib.suppress(OSError):
            found.update(
                os.path.normpath(os.path.join(folder, n)) for n in os.listdir(root / folder)
            )
    return frozenset(e for e in found if not _tool_output(e))


def gained_entries(before: frozenset[str], since: float, root: Path = ROOT) -> list[str]:
    """What ``checkout_entries(root)`` holds beyond ``before`` and was made during the run:
    its own mtime (``lstat``) at or after ``since`` (the session's start, on the wall clock)
    less a second for coarse timestamps. A new entry that is older (a file restored from an
    older copy, a directory moved back in) is not the run's doing."""
    gained = []
    for entry in sorted(checkout_entries(root) - before):
        try:
            made = os.lstat(root / entry).st_mtime
        except OSError:  # gone again since the listing
            continue
        if made >= since - 1:
            gained.append(entry)
    return gained


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note what the checkout holds; ``pytest_sessionfinish`` fails the run if it gained any.
    Under xdist only the controller checks (it ends after every worker has)."""
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_CHECKOUT_BEFORE] = (checkout_entries(), time.time())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when the checkout gained a file or directory made during it (once, a
    run left a ``secret.key`` in its root): tests write under their temp dirs only."""
    noted = session.config.stash.get(_CHECKOUT_BEFORE, None)
    if noted is None:
        return
    gained = gained_entries(*noted)
    session.config.stash[_CHECKOUT_GAINED] = gained
    if gained and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Name what the run left in the checkout (``pytest_sessionfinish`` failed the run)."""
    gained = config.stash.get(_CHECKOUT_GAINED, [])
    if gained:
        terminalreporter.section("the checkout gained files", sep="=", red=True, bold=True)
        for entry in gained:
            terminalreporter.line(f"{ROOT / entry}", red=True)
        terminalreporter.line(
            "a test wrote into the checkout (tests write under their temp dirs only): find "
            "it, fix it and remove these; the run fails until then"
        )


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per CPU (4 on CI's 2 cores), docs/testing.md §Order.

    Much of the suite's time is waiting: for a served stack to start, a job to end, a slot's
    instant, a browser. With one worker per CPU the CPUs sat half idle (CI took 16 minutes
    on 2 cores, the limit is 15); a third worker filled most of the waits, and once the
    tests stopped wasting CPU a fourth paid too (679 s of tests against 744-754 s with 3, in
    fresh clones the same hour). ``-n N`` still sets it.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cpus or 1) * 2)


def pytest_configure(config: pytest.Config) -> None:
    """Tests create data dirs and databases as the service would: under its umask (077).

    ``qinglong serve``, ``api``, ``worker`` and ``migrate`` refuse files that group or others
    can read (app/storage/private_files.py); a database a test prepares for them must be as
    private as one they made. Tests that prove the service's own umask start it from a loose
    one explicitly (tests/cli/test_file_modes.py).
    """
    os.umask(SERVICE_UMASK)


def tier_of(path: Path) -> str:
    """The tier of a test file from its folder under tests/."""
    parts = path.resolve().relative_to(TESTS).parts
    return TIER_FOLDERS.get(parts[0], "integration") if len(parts) > 1 else "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, so ``-m unit`` (``make test-unit``) selects pure logic;
    then move the tests marked ``slow`` to the front (docs/testing.md §Order).

    xdist hands each worker a first chunk of consecutive tests: a slow test that came last
    would run alone on one worker while the other sat idle (a tail of minutes); first, it
    runs while the other worker takes the rest of the suite.
    """
    wrong = []
    for item in items:
        tier = tier_of(item.path)
        item.add_marker(tier)
        if tier == "unit":
            used = NOT_UNIT_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            if used:
                wrong.append(f"{item.nodeid} uses {', '.join(sorted(used))}")
    if wrong:
        raise pytest.UsageError(
            "unit tests use no database or process (docs/testing.md §Tiers); move these to "
            "an integration folder:\n  " + "\n  ".join(wrong)
        )
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


def _with_search_path(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite file per test process, copied for each test."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade_to_head(engine)
    engine.dispose()
    return path


@contextlib.contextmanager
def private_pg_schema(prefix: str, *, migrate: bool = True, why: str = "") -> Iterator[str]:
    """A private schema on the shared PostgreSQL server, dropped afterwards; its URL.

    Skips with a reason when QL_TEST_POSTGRES_URL is unset; fails clearly when it is set
    but the server is unusable. ``migrate=False`` leaves the schema empty (a test that
    migrates it through the product itself).
    """
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(why or f"PostgreSQL tests need {PG_ENV} (CI sets it; .ci/run shows how)")
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:  # pragma: no cover - the point is a clear failure
        admin.dispose()
        pytest.fail(f"{PG_ENV} is set but PostgreSQL is not usable: {type(exc).__name__}: {exc}")
    url = _with_search_path(base, schema)
    try:
        if migrate:
            engine = make_engine(url)
            try:
                upgrade_to_head(engine)
            finally:
                engine.dispose()
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A migrated, private schema on the shared PostgreSQL server."""
    with private_pg_schema("ql_test") as url:
        yield url


def _truncate_all(engine: Engine) -> None:
    names = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} CASCADE"))


@pytest.fixture
def pg_engine(postgres_url: str) -> Iterator[Engine]:
    """For a PostgreSQL-only test: an engine on the process's schema, empty before and
    after (the tests that share the schema never see each other's rows)."""
    engine = make_engine(postgres_url)
    try:
        _truncate_all(engine)
        yield engine
    finally:
        _truncate_all(engine)
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database URL: a fresh SQLite file, or the process's PG schema."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "qinglong.db"
        shutil.copyfile(template, path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("postgres_url")
    engine = make_engine(url)
    try:
        _truncate_all(engine)
    finally:
        engine.dispose()
    return url


@pytest.fixture
def unmigrated(tmp_path: Path) -> Iterator[Engine]:
    """An engine on a SQLite file with no tables yet (a worker or api started before
    ``qinglong migrate``: every statement is refused with NotMigrated)."""
    eng = make_engine(f"sqlite:///{tmp_path / 'not-migrated.db'}")
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on ``db_url``, disposed after the test."""
    eng = make_engine(db_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def procs() -> Iterator[Processes]:
    """Tracks launched processes and kills survivors (by verified identity) at teardown."""
    tracker = Processes()
    try:
        yield tracker
    finally:
        tracker.cleanup()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short private directory (Unix socket paths must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ql"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
