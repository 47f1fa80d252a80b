"""The Celery app the peer bench's worker process loads (``celery -A bench.peer_celery_worker``).

Its queue and result key come from the environment the bench sets (bench/peer_celery.py).
"""

from __future__ import annotations

import os

from bench.peer_celery import _app

app, true_job = _app(os.environ["QLBENCH_QUEUE"], os.environ["QLBENCH_KEY"])
