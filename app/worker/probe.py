"""Liveness of a handle's exact identities: the reconciler's ProcessProbe adapter."""

from __future__ import annotations

from app.domain.model import ProcessHandle
from app.worker.identity import ProcessIdentity, matches
from app.worker.watcher import shim_alive


class HandleProbe:
    """Reads /proc; a different boot, a reused pid or a zombie all count as exited."""

    def job_alive(self, handle: ProcessHandle) -> bool:
        """The job (its group leader) with exactly this identity is alive now."""
        return matches(ProcessIdentity.of_job(handle))

    def shim_alive(self, handle: ProcessHandle) -> bool:
        """The shim with exactly this identity (boot id, pid, start ticks) is alive now."""
        return shim_alive(handle)
