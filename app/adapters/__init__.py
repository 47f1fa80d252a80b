"""Adapters the api process wires besides the database: the worker's control-socket client,
which implements the execution ports ``Launcher`` and ``Controller`` (docs/architecture-packages.md)."""
