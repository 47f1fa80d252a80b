"""Worker process: control socket, launcher, journal and the per-job shim."""
