"""How many processes a job may have at once (``QL_JOB_MAX_PROCESSES``, docs/job-user.md
"Process limit"), and the worker's one start-up line saying how this host enforces it.

The shim applies the first way that holds for a job (api-schemas/launch-protocol.md §3 step 5):

1. ``pids.max`` of the job's own cgroup: that job alone, every process and thread in it.
   Only where the pids controller is enabled for the job cgroups (``cgroups.pids_problem``).
2. ``RLIMIT_NPROC`` lowered in the job before ``execve``, when it runs as a job user. The
   kernel counts every process and thread of that real uid against it, so it bounds all of
   that user's running jobs together, not one job. It is never used for a job of the
   service's own user: there it would count the api, the worker and every shim as well (and
   root, or a process with ``CAP_SYS_RESOURCE``, is not held by it at all).

Where neither holds, a job has no process limit, and the line says so as a warning.
"""

from __future__ import annotations

import logging

from app.worker.job_user import JobPolicy

# How the limit holds, as ``ping`` tells the api and ``/readyz`` shows it (docs/job-user.md
# "Process limit"): each word names one branch of ``describe``.
HELD_BY = ("off", "pids_max", "rlimit_nproc", "rlimit_nproc_run_as", "none")


def held_by(
    max_processes: int | None, pids_problem: str | None, policy: JobPolicy | None
) -> str:
    """One word of ``HELD_BY`` for the case ``describe`` words as a line: ``off`` (no limit
    set), ``pids_max`` (each job with its own cgroup, by its pids.max), ``rlimit_nproc`` (per
    job user, across its running jobs: every job runs as one), ``rlimit_nproc_run_as`` (the
    same for run_as jobs only; the others have none), ``none`` (not enforced)."""
    if max_processes is None:
        return "off"
    if pids_problem is None:
        return "pids_max"
    if policy is None:
        return "none"
    return "rlimit_nproc" if policy.default is not None else "rlimit_nproc_run_as"


def describe(
    max_processes: int | None, pids_problem: str | None, policy: JobPolicy | None
) -> tuple[int, str]:
    """(log level, line) for the worker's start: how ``max_processes`` is enforced here.

    ``pids_problem``: why job cgroups have no ``pids.max`` (None: they have one);
    ``policy``: the checked job users (None: every job runs as the service's user)."""
    if max_processes is None:
        return logging.INFO, "QL_JOB_MAX_PROCESSES=off: jobs may start any number of processes"
    head = f"process limit {max_processes} per job"
    if pids_problem is None:
        rest = (
            "a job without its own cgroup (leftovers keep) has none"
            if policy is None
            else "a job without its own cgroup (leftovers keep) is held per job user by "
            "RLIMIT_NPROC, across that user's running jobs"
        )
        return logging.INFO, f"{head} by the pids.max of its cgroup; {rest}"
    if policy is None:
        return logging.WARNING, (
            f"QL_JOB_MAX_PROCESSES={max_processes} is not enforced: job cgroups have no "
            f"pids.max ({pids_problem}) and jobs run as the service's own user, whose "
            "RLIMIT_NPROC would count the service's processes too; a job can start "
            "processes without bound (docs/job-user.md)"
        )
    per_user = (
        f"process limit {max_processes} per job user by RLIMIT_NPROC: it counts every "
        f"process of that user, across its running jobs (job cgroups have no pids.max: "
        f"{pids_problem})"
    )
    if policy.default is not None:
        return logging.INFO, per_user
    return logging.WARNING, (
        f"{per_user}; only run_as jobs run as a job user: the others, run as the service's "
        "own user, have no process limit (docs/job-user.md)"
    )
