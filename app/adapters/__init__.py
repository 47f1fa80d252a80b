"""Adapters the api process wires besides the database: the worker's control-socket client
(the execution ports ``Launcher`` and ``Controller``; docs/packages.md)."""
