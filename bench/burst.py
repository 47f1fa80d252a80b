"""One trivial burst, for comparing two checkouts in turn (an A/B on one host).

``python -m bench.burst [--runs N] [--pg URL]`` starts a fresh stack of *this* checkout,
posts N `/bin/true` runs over 4 keep-alive clients, waits until all are terminal and prints
runs/s. Run it from the two checkouts one after the other, several rounds: the host's speed
moves by more than most changes (bench/README.md), so only interleaved rounds compare.
"""

from __future__ import annotations

import argparse
import os

from app.storage.private_files import SERVICE_UMASK
from bench.stack import running_stack
from bench.trivial import enqueue_and_finish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--pg", default=None, help="a PostgreSQL URL (default: SQLite)")
    args = parser.parse_args()
    os.umask(SERVICE_UMASK)  # the data dir must be private, as the service makes it
    with running_stack(args.pg) as stack:
        got = enqueue_and_finish(stack, args.runs, 4)
    print(f"{got['runs_per_s']:.1f} runs/s, {int(got['succeeded'])} of {args.runs} succeeded")


if __name__ == "__main__":
    main()
