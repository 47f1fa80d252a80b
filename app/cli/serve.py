"""``qinglong serve`` (migrate, then supervise the api and the worker) and ``qinglong api``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
from typing import Any

from app.cli import DATA_DIR_HELP
from app.cli.admin import cmd_migrate
from app.cli.common import (
    API_LOCK,
    EXIT_DATA_DIR_IN_USE,
    REFUSAL,
    SERVE_LOCK,
    fd_room,
    hold_lock,
    make_first_start_files,
    private_settings,
    require_key_for_stored_secrets,
    start_step,
)
from app.settings import Settings

# app/api/startup.py: imports app.api.main itself, so that a start that fails, from the
# import on, is one line and a non-zero exit (not a traceback per uvicorn worker).
APP_FACTORY = "app.api.startup:serve_app"
# ``-m app`` would put the current directory first on sys.path: started from a folder with its
# own ``app/`` (any project checkout), the services would import that code instead of the
# installed package. ``-P`` (Python 3.11+) leaves the current directory out.
_ISOLATED = ("-P",)
# Bounds uvicorn's graceful shutdown (open streams such as log follows) so a stop or a
# rolling restart never waits on a client; the supervisor's own stop bound is larger. It
# must exceed the idle grace a retiring worker gives keep-alive connections (checked in
# ``cmd_api``, which imports the api).
GRACEFUL_SHUTDOWN_S = 5
# How long uvicorn's manager waits for a new worker to serve before it gives up a rolling
# restart (and how long a worker may miss its health ping). Its default, 5 s, is less than
# an app import takes on a busy two-core host or an SD card: the restart was then abandoned.
WORKER_READY_S = 30
# Files an api process holds besides its client connections (database, logs, the listener).
FD_RESERVE = 256


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def _port(value: str) -> int:
    number = int(value)
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError("must be a port number (1..65535)")
    return number


def _add_listen_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    parser.add_argument(
        "--workers", type=_positive, default=1, help="uvicorn worker processes (default 1)"
    )
    # SUPPRESS: an absent sub-command flag must not hide `qinglong --data-dir DIR serve`.
    parser.add_argument("--data-dir", default=argparse.SUPPRESS, help=DATA_DIR_HELP)


def register(sub: Any) -> None:
    """Add ``serve`` and ``api`` to the parser."""
    serve = sub.add_parser(
        "serve",
        help="migrate, then run and supervise the api and the worker",
        description=(
            "Migrate the database, then run the api (uvicorn) and the worker, restarting either "
            "one if it dies. SIGTERM/SIGINT stop the api (it stops dispatching and finishes "
            "its launches), then the worker; running jobs keep running and are "
            "reconciled at the next start unless --stop-jobs-on-exit is given. SIGHUP restarts "
            "the api's uvicorn workers one by one (with --workers 1: the api process) without "
            "touching the worker or any job."
        ),
    )
    _add_listen_flags(serve)
    serve.add_argument(
        "--stop-jobs-on-exit",
        action="store_true",
        help="on shutdown, also cancel and stop every running job (default: leave them running)",
    )
    serve.set_defaults(handler=cmd_serve)

    api = sub.add_parser("api", help="run only the api under uvicorn (for systemd; never migrates)")
    _add_listen_flags(api)
    api.set_defaults(handler=cmd_api)


def _check_listen(host: str, port: int) -> None:
    """Fail early with a clear message when the address cannot be bound."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def child_env(settings: Settings, advertise_url: str | None = None) -> dict[str, str]:
    """The services' environment: ours, with the resolved data dir (and socket) made explicit,
    and ``QL_ADVERTISE_URL`` when it was not set (docs/several-hosts.md)."""
    env = dict(os.environ) | settings.to_env()
    if settings.advertise_url is None and advertise_url is not None:
        env["QL_ADVERTISE_URL"] = advertise_url
    return env


def listen_url(host: str, port: int) -> str:
    """The base URL other hosts reach this api at: a wildcard bind advertises the host name."""
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - a wildcard bind: name the host instead
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _log_to_stderr(logger: logging.Logger) -> None:
    """One line per supervisor event on stderr (never job data: names, pids, statuses)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s supervisor %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def cmd_serve(args: argparse.Namespace) -> int:
    """Migrate, then supervise the api and the worker until SIGTERM/SIGINT."""
    from app.context.worker_lease import EXIT_LEASE_HELD
    from app.supervisor.stop_jobs import stop_active_jobs, stop_through_worker
    from app.supervisor.supervisor import JOBS_KEEP_RUNNING, ServiceSpec, StopWait, Supervisor
    from app.worker.job_user import job_policy

    supervisor_log = logging.getLogger("qinglong.supervisor")
    _log_to_stderr(supervisor_log)
    settings = private_settings(args, binds_socket=True)
    if settings.job.configured:
        job_policy(settings.job)  # refuse here, once, before migrating (docs/job-user.md)
    # Before anything of a live service is touched (its database, its metric files): the
    # lock stays held, by this process, until it exits.
    serve_lock = hold_lock(settings.data_dir / SERVE_LOCK)
    if serve_lock is None:
        return _in_use(settings, "qinglong serve")
    api_lock = hold_lock(settings.data_dir / API_LOCK)  # a `qinglong api` unit's
    if api_lock is None:
        return _in_use(settings, "qinglong api")
    os.close(api_lock)  # ours takes it when it starts
    _check_listen(args.host, args.port)
    # A broken install (a driver that does not import) shows first here: one line, exit 3.
    start_step(lambda: cmd_migrate(args))
    # Before the api makes a new key file; a broken driver is one line (the key check
    # builds an engine here).
    start_step(lambda: require_key_for_stored_secrets(settings))
    api_argv = [sys.executable, *_ISOLATED, "-m", "app", "api", "--host", args.host]
    api_argv += ["--port", str(args.port), "--workers", str(args.workers)]

    through_worker: list[bool] = []

    def before_worker_stops(worker_pid: int) -> StopWait | None:
        through_worker.append(True)
        return stop_through_worker(settings, worker_pid)

    services = [
        ServiceSpec("api", api_argv, reloads=True, forwards_hup=args.workers > 1),
        ServiceSpec(
            "worker",
            [sys.executable, *_ISOLATED, "-m", "app", "worker"],
            fatal_exit_codes=frozenset({EXIT_LEASE_HELD}),
            # The api is down (nothing launches); the worker still runs and records the
            # endings of the jobs stopped now (app/supervisor/stop_jobs.py).
            before_stop=before_worker_stops if args.stop_jobs_on_exit else None,
        ),
    ]
    env = child_env(settings, listen_url(args.host, args.port))
    jobs = (
        "the jobs before the worker: --stop-jobs-on-exit"
        if args.stop_jobs_on_exit
        else JOBS_KEEP_RUNNING
    )
    code = Supervisor(services=services, env=env, jobs_on_stop=jobs).run()
    # A refused worker never held the lease: the active attempts belong to the worker that
    # does, so this instance must not touch them (docs/worker-lease.md).
    # What the worker's turn left (it was down or without its lease then, an ending not
    # recorded in time): stopped now, recorded at the next start.
    if args.stop_jobs_on_exit and code != EXIT_LEASE_HELD:
        counts = stop_active_jobs(settings)
        if counts.pop("held", 0):
            supervisor_log.warning(
                "stop-jobs-on-exit, after the services: a live worker holds the lease; its "
                "jobs are left to it"
            )
        elif counts or not through_worker:  # after the worker's turn, only what it found
            summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none active"
            supervisor_log.info("stop-jobs-on-exit, after the services: %s", summary)
    return code


def _in_use(settings: Settings, other: str) -> int:
    print(
        f"qinglong: another {other} runs on the data dir {settings.data_dir}; refusing to "
        "start (nothing of it was touched)",
        file=sys.stderr,
    )
    return EXIT_DATA_DIR_IN_USE


def cmd_api(args: argparse.Namespace) -> int:
    """Serve the api with uvicorn alone (the database must already be migrated)."""
    from app.api import retirement
    from app.context.metrics import MULTIPROC_ENV, prepare_multiprocess_dir

    assert GRACEFUL_SHUTDOWN_S > retirement.IDLE_GRACE_S
    settings = private_settings(args)
    # Held until this process exits: the metric files below are this api's alone.
    if hold_lock(settings.data_dir / API_LOCK) is None:
        return _in_use(settings, "qinglong api")
    # Before build_context makes a new key file. Both run here, before uvicorn: what they
    # raise that no refusal covers (a driver that does not import) is one line, exit 3.
    start_step(lambda: require_key_for_stored_secrets(settings))
    cannot = start_step(lambda: make_first_start_files(settings))
    if cannot is not None:
        REFUSAL.refuse(cannot)
        return 1
    # uvicorn builds the app in each worker it spawns by calling the factory without
    # arguments, so the environment they inherit is the only way in: the one channel
    # ``Settings.to_env`` (``--data-dir`` included), read back by ``create_app``.
    os.environ.update(settings.to_env())
    # Each uvicorn worker keeps its metric observations in its own file here and a scrape
    # sums them (app/context/metrics.py); set before any worker imports prometheus-client.
    metrics_dir = settings.data_dir / "metrics"
    metrics_problem = prepare_multiprocess_dir(metrics_dir)
    os.environ[MULTIPROC_ENV] = str(metrics_dir)  # made or not: every worker's is the same
    limits = settings.http
    fd_room(limits.max_connections + FD_RESERVE)
    from app.api.log_lines import log_lines

    log_lines()
    REFUSAL.log_lines("api")  # under `qinglong serve`, a start that fails: one of its lines
    if metrics_problem is not None and args.workers > 1:  # one worker keeps its own in memory
        logging.getLogger(__name__).warning(
            "metrics: cannot make %s (%s): no api worker keeps observations; GET /metrics "
            "reports the database figures only until the api restarts with room "
            "(docs/metrics.md)",
            metrics_dir,
            metrics_problem,
        )
    logging.getLogger(__name__).info(
        "api on http://%s:%d with %d uvicorn worker(s)", args.host, args.port, args.workers
    )
    return _run_uvicorn(args, settings)


def _run_uvicorn(args: argparse.Namespace, settings: Settings) -> int:
    """What ``uvicorn.run`` does for ``qinglong api``, with a start that fails ending the
    api, non-zero, with its one line (app/api/startup.py): in this process with one worker,
    else said by the manager once a worker sent it."""
    import multiprocessing

    import uvicorn

    from app.api import startup
    from app.api.start_failure import EXIT_CANNOT_START

    options = uvicorn_options(args, settings)
    if args.workers == 1:
        startup.say_with(REFUSAL.refuse)
        server = uvicorn.Server(startup.ApiConfig(APP_FACTORY, **options))
        with contextlib.suppress(KeyboardInterrupt):
            server.run()  # a start that fails ends the process in app/api/startup.py
        if not server.started:
            # uvicorn.run's own check: a start that failed in uvicorn itself (the address in
            # use: it logged why) or was stopped before it served is not an orderly stop.
            return EXIT_CANNOT_START
        return 0
    reports, writer = multiprocessing.get_context("spawn").Pipe(duplex=False)
    config = startup.ApiConfig(APP_FACTORY, reports=writer, **options)
    manager = startup.ApiManager(config, sockets=[config.bind_socket()], reports=reports)
    with contextlib.suppress(KeyboardInterrupt):
        manager.run()
    if manager.failure is not None:
        REFUSAL.refuse(manager.failure)
        return EXIT_CANNOT_START
    return 0


def uvicorn_options(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """The keyword arguments ``qinglong api`` hands uvicorn's ``Config`` (``ApiConfig``, which
    uvicorn pickles into each worker it spawns) besides the app factory's path."""
    from app.api import retirement

    limits = settings.http
    return {
        "factory": True,
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "log_level": "warning",
        # No handler of uvicorn's own: its lines (a malformed request, a rolling restart
        # that did not take) reach the root logger's, in the service's format (log_lines).
        "log_config": None,
        # httptools (or QL_HTTP_PARSER=h11) with a shutdown that lets keep-alive clients
        # finish (app/api/retirement.py) and the limits of docs/http-limits.md.
        "http": retirement.http_protocol(limits),
        # No WebSocket protocol at all: the api has no WebSocket route and answers an
        # Upgrade as plain HTTP (docs/http-limits.md § No protocol switch); "none" keeps
        # uvicorn from importing its WebSocket module and the websockets library.
        "ws": "none",
        # h11's own buffer bound: the header cap is ours (431), h11 must not refuse first.
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S,
        "timeout_worker_healthcheck": WORKER_READY_S,
    }
