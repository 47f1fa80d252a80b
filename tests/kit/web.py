"""httpx's one-request functions with one SSL context for the whole test process.

Each of ``httpx.get``, ``httpx.post``... builds a client, and each client loads the CA
bundle into a new SSL context: 27 ms of CPU for a request to ``http://127.0.0.1`` that never
uses it. The tests poll their services many times a second, so that was the largest CPU
cost of the test process (the pytest workers spent 456 CPU-s on a full run's tests, 266
with these, on a 2-core CI host where it was taken from the services under test). These
functions keep httpx's behaviour (a fresh client and connection per call) with the context
made once. Ruff bans the ``httpx`` ones outside the bench (``TID251`` in pyproject.toml).
"""

from __future__ import annotations

import functools

import httpx

VERIFY = httpx.create_ssl_context()

# ruff: noqa: TID251 - the one place the banned functions are called
get = functools.partial(httpx.get, verify=VERIFY)
post = functools.partial(httpx.post, verify=VERIFY)
put = functools.partial(httpx.put, verify=VERIFY)
patch = functools.partial(httpx.patch, verify=VERIFY)
delete = functools.partial(httpx.delete, verify=VERIFY)
head = functools.partial(httpx.head, verify=VERIFY)
options = functools.partial(httpx.options, verify=VERIFY)
request = functools.partial(httpx.request, verify=VERIFY)
stream = functools.partial(httpx.stream, verify=VERIFY)
