"""Fixtures of the worker tests: ``procs`` and ``short_dir`` live in tests/conftest.py."""
