"""The composition roots (the api's ``bootstrap``, the worker's ``worker_process``) and the
facade the routes call (docs/packages.md)."""
