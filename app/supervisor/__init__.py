"""``qinglong serve``'s supervisor: runs and restarts the api and the worker, reaps shims, and
stops the active jobs on ``--stop-jobs-on-exit`` (docs/packages.md)."""
