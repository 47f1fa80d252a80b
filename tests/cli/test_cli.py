"""The qinglong CLI as a user runs it: a real process, real database files."""

from __future__ import annotations

import calendar
import os
import pty
import re
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from app.domain.canonical import sha256_digest
from app.domain.tokens import looks_like_token
from tests.conftest import PG_ENV
from tests.disk import fill, mounted_tmpfs


def ql(
    *args: str, data_dir: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m app`` with a private data dir."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    full_env |= {"QL_DATA_DIR": str(data_dir)} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_token_lifecycle_shows_the_token_once_and_stores_only_its_digest(tmp_path: Path) -> None:
    assert ql("migrate", data_dir=tmp_path).returncode == 0
    created = ql(
        "token", "create", "--scope", "runs:read", "logs:read", "--name", "ci", data_dir=tmp_path
    )
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip().splitlines()[-1]
    assert looks_like_token(token)
    stored = _all_bytes(tmp_path)
    assert token.encode() not in stored
    assert sha256_digest(token.encode()).encode() in stored
    listed = ql("token", "list", data_dir=tmp_path)
    # Not a terminal: one line a token, no header (what scripts have always read).
    assert listed.stdout.splitlines()[0].startswith("ci\tactive\tlogs:read runs:read\t")
    assert token not in listed.stdout
    *_, created, revoked, expires = listed.stdout.splitlines()[0].split("\t")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created) and revoked == "-"
    assert expires == "-"  # made without --expires-in: valid until revoked
    revoked_now = ql("token", "revoke", "ci", data_dir=tmp_path)
    assert (revoked_now.returncode, revoked_now.stdout) == (0, "revoked token ci\n")
    line = ql("token", "list", data_dir=tmp_path).stdout.splitlines()[0].split("\t")
    assert line[:2] == ["ci", "revoked"] and line[3] == created and line[4] >= created
    # Again: still exit 0 (a script may "make sure"), but it says it was so already.
    twice = ql("token", "revoke", "ci", data_dir=tmp_path)
    assert (twice.returncode, twice.stdout) == (0, f"token ci was already revoked ({line[4]})\n")
    again = ql("token", "create", "--scope", "runs:read", "--name", "ci", data_dir=tmp_path)
    assert again.returncode != 0
    assert "ci was revoked; a name is never reused" in again.stderr
    assert "Traceback" not in again.stderr


def test_token_list_into_a_pipe_closed_early_is_exit_141_without_a_traceback(
    tmp_path: Path,
) -> None:
    # `qinglong token list | head -0`: a BrokenPipeError traceback and exit 1 before.
    assert ql("migrate", data_dir=tmp_path).returncode == 0
    assert ql("token", "create", "--scope", "runs:read", data_dir=tmp_path).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "app", "token", "list", "--data-dir", str(tmp_path)],
            stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (listed.returncode, listed.stderr) == (141, "")


def test_a_token_created_into_a_pipe_closed_early_says_to_revoke_it(tmp_path: Path) -> None:
    """Shown once and lost to a closed pipe: the admin learns a token exists nobody holds."""
    assert ql("migrate", data_dir=tmp_path).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        made = subprocess.run(
            [sys.executable, "-m", "app", "token", "create", "--scope", "runs:read",
             "--name", "lost", "--data-dir", str(tmp_path)],
            stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert made.returncode == 141 and "Traceback" not in made.stderr
    assert made.stderr.strip() == (
        "token lost was created but its output did not reach a reader: revoke it "
        "(qinglong token revoke lost) and create another"
    )


def test_token_list_on_a_terminal_has_a_header_line(tmp_path: Path) -> None:
    """A person reads columns by their names; a script (no terminal) reads rows only."""
    assert ql("migrate", data_dir=tmp_path).returncode == 0
    none = ql("token", "list", data_dir=tmp_path)  # nothing yet: said on stderr, not stdout
    assert (none.returncode, none.stdout, none.stderr) == (0, "", "no tokens yet\n")
    made = ql("token", "create", "--scope", "runs:read", "--name", "ci", data_dir=tmp_path)
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    primary, secondary = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "app", "token", "list"], stdout=secondary,
            stderr=subprocess.PIPE, env=env | {"QL_DATA_DIR": str(tmp_path)}, timeout=60,
        )  # fmt: skip
        os.close(secondary)
        secondary = -1
        out = b""
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)
    assert done.returncode == 0, done.stderr
    lines = out.decode().splitlines()
    assert lines[0] == "NAME\tSTATE\tSCOPES\tCREATED\tREVOKED\tEXPIRES"
    assert lines[1].startswith("ci\tactive\truns:read\t")


def test_bootstrap_prints_an_admin_token_only_the_first_time(tmp_path: Path) -> None:
    ql("migrate", data_dir=tmp_path)
    first = ql("token", "bootstrap", data_dir=tmp_path)
    assert looks_like_token(first.stdout.strip().splitlines()[-1])
    second = ql("token", "bootstrap", data_dir=tmp_path)
    assert second.returncode == 0
    assert not any(looks_like_token(line) for line in second.stdout.splitlines())


@pytest.mark.parametrize(
    "args",
    [
        ("token", "create", "--scope", "everything"),
        ("token", "create"),
        ("token", "create", "--scope", "admin", "--name", "Bad Name"),
        ("frobnicate",),
    ],
)
def test_bad_flags_get_a_clear_message_and_no_traceback(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    ql("migrate", data_dir=tmp_path)
    result = ql(*args, data_dir=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip()


def test_unreachable_database_is_a_clear_error(tmp_path: Path) -> None:
    result = ql(
        "token", "list",
        data_dir=tmp_path,
        env={"QL_DATABASE_URL": "postgresql+psycopg://nobody:pw-not-shown@127.0.0.1:9/none"},
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "database" in result.stderr and "pw-not-shown" not in result.stderr


def test_an_unmigrated_database_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    sqlite3.connect(empty / "qinglong.db").close()
    result = ql("token", "list", data_dir=empty)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "migrate" in result.stderr


def test_no_database_where_a_command_looks_names_the_path_not_migrate(tmp_path: Path) -> None:
    # Run from another directory than the service's: the relative default data dir holds
    # nothing. `migrate` would make a second, empty database there, so it is not the advice.
    for args in (("token", "list"), ("token", "create", "--name", "x", "--scope", "admin")):
        result = ql(*args, data_dir=tmp_path / "elsewhere")
        assert result.returncode == 1, result.stderr
        assert result.stderr.splitlines() == [
            f"qinglong: no database at {tmp_path / 'elsewhere' / 'qinglong.db'}; give the "
            "service's data dir with --data-dir or QL_DATA_DIR (the default, ./.qinglong, is "
            "relative to the current directory)"
        ]
        assert not (tmp_path / "elsewhere").exists()  # nothing made where it looked
    # A URL given outright (with a query) is checked as given, and so is the advice.
    url = f"sqlite:///{tmp_path / 'gone.db'}?timeout=5"
    result = ql("token", "list", data_dir=tmp_path / "d", env={"QL_DATABASE_URL": url})
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"qinglong: no database at {tmp_path / 'gone.db'}; check QL_DATABASE_URL"
    ]


def test_a_database_that_does_not_answer_is_one_line_without_the_url(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the connect is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+psycopg://postgres:s3cret-pw@127.0.0.1:{port}/test"
    for args in (("migrate",), ("token", "list")):
        done = ql(*args, data_dir=tmp_path, env={"QL_DATABASE_URL": url})
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines() == [
            "qinglong: the database did not answer or refused the connection "
            "(DATABASE_UNREACHABLE): Connection refused; check QL_DATABASE_URL and that the "
            "server is up"
        ]
        assert "s3cret-pw" not in done.stdout + done.stderr


def test_a_password_holding_a_slash_or_a_question_mark_is_no_port() -> None:
    # SQLAlchemy reads these URLs (a base64-like generated password); a split by hand read
    # part of the password as the port and refused a deployment that worked.
    from app.settings import database_url_from_env

    for url in (
        "postgresql+psycopg://app:pa/ss@127.0.0.1:5432/ql",
        "postgresql+psycopg://app:pa?ss@127.0.0.1/ql",
        "postgresql+psycopg://app:a:b@[::1]:5432/ql",
    ):
        assert database_url_from_env({"QL_DATABASE_URL": url}, Path("/nonexistent")) == url


def test_a_database_url_of_another_driver_or_a_bad_port_is_one_line_without_the_url(
    tmp_path: Path,
) -> None:
    # Before: a traceback (ModuleNotFoundError: MySQLdb, psycopg2) or Python's own words
    # ("invalid literal for int()"), from every command, `serve` and `migrate` included.
    cases = {
        "mysql://app:s3cret-pw@127.0.0.1/ql": "the scheme mysql",
        "postgresql+psycopg2://app:s3cret-pw@127.0.0.1/ql": "the scheme postgresql+psycopg2",
        "postgres://app:s3cret-pw@127.0.0.1/ql": "the scheme postgres",
        "127.0.0.1:5432/ql": "no scheme",
        "postgresql+psycopg://app:s3cret-pw@127.0.0.1:pgport/ql": "the port is not a number",
    }
    for n, (url, said) in enumerate(cases.items()):
        # One URL through every kind of command (they share the check); the rest by one.
        for args in (("migrate",), ("token", "list"), ("worker",))[: 3 if n == 0 else 1]:
            done = ql(*args, data_dir=tmp_path / "d", env={"QL_DATABASE_URL": url})
            assert done.returncode == 2, (url, args, done.stderr)
            assert done.stderr.splitlines() == [
                "qinglong: QL_DATABASE_URL must be sqlite:///PATH or "
                f"postgresql+psycopg://USER@HOST[:PORT]/DATABASE ({said})"
            ], (url, args)
            assert "s3cret-pw" not in done.stdout + done.stderr
    assert not (tmp_path / "d").exists()  # nothing made for a URL that was refused


def test_migrate_and_serve_on_a_full_disk_say_so_not_check_the_url_and_migrate(
    tmp_path: Path,
) -> None:
    # Before: `qinglong migrate` and `qinglong serve` (which migrates first) on a data dir
    # whose disk filled up said "the database is not reachable or not usable
    # (OperationalError); check QL_DATABASE_URL and run `qinglong migrate`": SQLite could not
    # make its -wal/-shm files, and the advice sent the operator to the one command failing.
    with mounted_tmpfs(tmp_path / "fs", size_mib=60) as fs:
        data = fs / "data"
        assert ql("migrate", data_dir=data).returncode == 0
        fill(fs)
        with socket.socket() as probe:  # never bound: serve migrates first
            probe.bind(("127.0.0.1", 0))
            port = str(probe.getsockname()[1])
        for args in (("migrate",), ("serve", "--host", "127.0.0.1", "--port", port)):
            done = ql(*args, data_dir=data)
            assert done.returncode == 1, (args, done.stderr)
            assert done.stderr.splitlines() == [
                "qinglong: the database cannot store writes now (disk full or read-only); "
                "retry later"
            ], args


def test_an_api_and_a_worker_first_started_on_a_full_disk_say_so_in_one_line(
    tmp_path: Path,
) -> None:
    # Before: each uvicorn worker died in a traceback making secret.key, and left it empty,
    # so every start after it, with room again, was refused ("holds no key"); the worker
    # died in a traceback making instance-id.
    from app.storage.engine import make_engine
    from app.storage.migrate import upgrade_to_head

    url = f"sqlite:///{tmp_path / 'q.db'}"  # the database has room; the data dir has none
    engine = make_engine(url)
    upgrade_to_head(engine)
    engine.dispose()
    with mounted_tmpfs(tmp_path / "fs", size_mib=1) as fs:
        data = fs / "data"
        fill(fs)
        with socket.socket() as probe:  # never bound: refused before uvicorn starts
            probe.bind(("127.0.0.1", 0))
            port = str(probe.getsockname()[1])
        env = {"QL_DATABASE_URL": url, "QL_WORKER_SOCKET": str(tmp_path / "w.sock")}
        done = ql("api", "--host", "127.0.0.1", "--port", port, data_dir=data, env=env)
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines() == [
            f"qinglong: cannot make {data}/secret.key (No space left on device): free space in "
            "the data dir and start again"
        ]
        done = ql("worker", data_dir=data, env=env)
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines() == [
            f"qinglong: cannot make {data}/instance-id (No space left on device): free space in "
            "the data dir and start again"
        ]
        assert list(data.iterdir()) == [data / "api.lock"]  # no key, no id, no temp file


def test_a_first_start_that_fails_for_another_reason_says_so_without_the_disk_advice(
    tmp_path: Path,
) -> None:
    # Before: every OSError was told to free space in the data dir, a symlink loop too.
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "instance-id").symlink_to(data / "instance-id")
    env = {"QL_DATABASE_URL": f"sqlite:///{tmp_path / 'q.db'}",
           "QL_WORKER_SOCKET": str(tmp_path / "w.sock")}  # fmt: skip
    done = ql("worker", data_dir=data, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"qinglong: cannot make {data}/instance-id (Too many levels of symbolic links)"
    ]


def test_a_start_sweeps_the_temp_files_a_killed_first_start_left(tmp_path: Path) -> None:
    # Before: a first start killed between writing a temp file and linking it (or between
    # linking and unlinking it) left a whole key, 0600, under a temp name forever.
    from app.cli.common import make_first_start_files
    from app.domain.profiles import EDGE
    from app.settings import Settings
    from app.storage.durable import TEMP_SWEEP_AGE_S

    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    left = [data / ".secret.key.0123456789ab.tmp", data / ".instance-id.0123456789abcdef.tmp"]
    kept = [
        data / ".secret.key.0123456789ab.tmp.bak",  # not the exact name
        data / ".secret.key.0123456789.tmp",
        data / ".instance-id.0123456789abcdee.tmp",  # too young: a start under way
    ]
    old = time.time() - TEMP_SWEEP_AGE_S - 5
    for path in left + kept:
        path.write_text("x\n")
        path.chmod(0o600)
        if path != kept[-1]:
            os.utime(path, (old, old))
    url = f"sqlite:///{tmp_path / 'q.db'}"
    settings = Settings(data_dir=data, database_url=url, profile=EDGE)
    assert make_first_start_files(settings) is None
    names = {p.name for p in data.iterdir()}
    assert names == {"secret.key", "instance-id"} | {p.name for p in kept}


def test_a_login_the_server_refuses_is_told_apart_from_a_server_that_is_down(
    tmp_path: Path,
) -> None:
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"needs a PostgreSQL server ({PG_ENV}; CI sets it)")
    server = make_url(base)
    cases = {
        "role": (server.set(username="ql_no_such_role", password="s3cret-pw"),
                 'FATAL: role "ql_no_such_role" does not exist'),
        "database": (server.set(database="ql_no_such_db", password="s3cret-pw"),
                     'FATAL: database "ql_no_such_db" does not exist'),
    }  # fmt: skip
    for url, said in cases.values():
        env = {"QL_DATABASE_URL": url.render_as_string(hide_password=False)}
        done = ql("token", "list", data_dir=tmp_path, env=env)
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines() == [
            "qinglong: the database did not answer or refused the connection "
            f"(DATABASE_UNREACHABLE): {said}; check QL_DATABASE_URL and that the server is up"
        ]
        assert "s3cret-pw" not in done.stdout + done.stderr


def test_a_database_a_newer_build_migrated_is_one_line_that_says_so_not_migrate(
    tmp_path: Path,
) -> None:
    """A rollback past the documented bound (docs/operations.md, Roll back): the database
    is at a migration this build does not know. `migrate` printed Alembic's traceback, and
    the worker and /readyz advised `qinglong migrate`, which cannot help."""
    from app.context.readiness import database_check
    from app.storage.engine import make_engine

    nowhere = tmp_path / "none"
    version = ql("--version", data_dir=nowhere)
    assert not nowhere.exists()  # it reads the build only: no data dir, no database
    migrated = ql("migrate", data_dir=tmp_path)
    head = re.fullmatch(r"qinglong-control \S+ \(database migrations up to (\w+)\)\n", version.stdout)
    assert version.returncode == 0 and head, version.stdout
    assert migrated.stdout == f"database migrated to head ({head.group(1)})\n"
    db = tmp_path / "qinglong.db"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0099'")
    said = "the database is at migration 0099, newer than this build knows (its newest is "
    for command in (("migrate",), ("worker",)):
        done = ql(*command, data_dir=tmp_path)
        assert done.returncode == 1, (command, done.stderr)
        assert "Traceback" not in done.stderr
        # The worker may warn first (jobs as the service's own user, when root runs it).
        assert done.stderr.splitlines()[-1].startswith(f"qinglong: {said}"), done.stderr
        assert "run the build that migrated it or a newer one" in done.stderr
    engine = make_engine(f"sqlite:///{db}")
    try:
        reason = database_check(engine)
    finally:
        engine.dispose()
    assert reason is not None and reason.startswith("database is at migration 0099, newer than")
    with sqlite3.connect(db) as conn:  # behind (a known, older migration): migrate helps
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    engine = make_engine(f"sqlite:///{db}")
    try:
        assert database_check(engine) == "database is not migrated to head (run `qinglong migrate`)"
    finally:
        engine.dispose()


def test_every_data_dir_flag_says_the_same_true_default() -> None:
    """``qinglong --help`` and each command's ``--help`` give one default for the data dir,
    the one app/settings.py applies (they disagreed: one left out ./.qinglong)."""
    from app.cli import DATA_DIR_HELP, _subcommands, build_parser
    from app.settings import DEFAULT_DATA_DIR

    assert "$QL_DATA_DIR" in DATA_DIR_HELP and DEFAULT_DATA_DIR in DATA_DIR_HELP
    helps = []
    todo = [build_parser()]
    while todo:
        parser = todo.pop()
        todo.extend(_subcommands(parser).values())
        action = parser._option_string_actions.get("--data-dir")
        if action is not None:
            helps.append(action.help)
    assert len(helps) > 10 and set(helps) == {DATA_DIR_HELP}


def test_a_token_made_to_expire_says_when_lists_it_and_bad_durations_are_refused(
    tmp_path: Path,
) -> None:
    assert ql("migrate", data_dir=tmp_path).returncode == 0
    made = ql(
        "token", "create", "--scope", "runs:read", "--name", "ci", "--expires-in", "90d",
        data_dir=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    said = made.stdout.splitlines()[0]
    assert said.startswith("created token ci with scopes runs:read; it expires 20"), said
    when = said.rsplit(" ", 1)[-1]
    expected = time.time() + 90 * 86400
    assert abs(calendar.timegm(time.strptime(when, "%Y-%m-%dT%H:%M:%SZ")) - expected) < 120
    row = ql("token", "list", data_dir=tmp_path).stdout.splitlines()[0].split("\t")
    assert (row[0], row[1], row[5]) == ("ci", "active", when)
    for bad in ("90", "0d", "30s", "3651d", "1w", "-5d", "\u0661\u0662d"):  # and Arabic-Indic digits
        refused = ql("token", "create", "--scope", "runs:read", "--expires-in", bad, data_dir=tmp_path)
        assert refused.returncode == 2, (bad, refused.stderr)
        assert "--expires-in" in refused.stderr and "Traceback" not in refused.stderr


def test_lease_retire_refuses_what_is_not_an_instance_and_names_an_unknown_one(
    tmp_path: Path,
) -> None:
    """``lease retire`` ends runs: a typo is refused before the database is touched (exit 2),
    an instance with no lease on this database is one line (exit 1), neither a traceback."""
    ql("migrate", data_dir=tmp_path)
    typo = ql("lease", "retire", "01a23", data_dir=tmp_path)
    assert typo.returncode == 2 and "is not an instance id" in typo.stderr, typo.stderr
    unknown = ql("lease", "retire", "01a230bf-36ec-72f8-8227-a0718c1b7418", data_dir=tmp_path)
    assert unknown.returncode == 1, unknown.stderr
    assert "no worker lease of instance 01a230bf-36ec-72f8-8227-a0718c1b7418" in unknown.stderr
    assert "Traceback" not in typo.stderr + unknown.stderr


def test_a_data_dir_without_file_locks_serves_unguarded_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # NFS without lockd answers flock with ENOLCK: a traceback stopped `serve` and `api`
    # there, where they ran before the lock existed.
    import errno
    import fcntl

    from app.cli import common

    def no_locks(_fd: int, _op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    fd = common.hold_lock(tmp_path / "serve.lock")
    assert fd is not None
    os.close(fd)
    assert capsys.readouterr().err.splitlines() == [
        f"qinglong: cannot lock {tmp_path / 'serve.lock'} (No locks available): a second "
        "service on this data dir would not be refused"
    ]
