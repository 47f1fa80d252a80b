"""A/B of trivial bursts: this checkout against another, in interleaved rounds on one host.

``python -m bench.burst --against DIR [--rounds 4] [--runs 600] [--pg URL] [--idle]``: each round
runs one burst of DIR's code and one of this checkout's, each side first in every other round
(``order``), each on a fresh stack of its own
(N `/bin/true` runs posted over 4 keep-alive clients, until all are terminal), and prints
both runs/s and the machine's busy CPU per run (user, system and interrupts from
``/proc/stat``, steal left out: every process of the stack and the database server, the
bench client included); at the end the medians and their ratios, this checkout / DIR. On a
shared host the CPU per run moves less from round to round than runs/s, which also counts
the time the stack waited for a core. With ``--idle`` a
round is instead N runs one at a time (``bench.trivial.idle_latency``, after 10 not counted)
on each side, and the figure is the mean created → started in ms: the timestamps are whole
milliseconds, so the p50 of a few dozen runs moves by a whole step between runs of the same
code, and the mean of a few hundred does not. The host's speed
moves by more than most changes (bench/README.md), so only interleaved rounds compare: the
other checkout is the same-run baseline. DIR is typically a ``git worktree`` of the commit
before the change.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# The child: one burst of the checkout it runs in. Only `bench.stack` and `bench.trivial`,
# which older checkouts have too (this module may not exist there).
_ONE_BURST = """
import os, sys
from bench.stack import running_stack
from bench.trivial import enqueue_and_finish
runs, pg = int(sys.argv[1]), sys.argv[2] or None

def busy():  # the machine's busy jiffies: user, nice, system, irq, softirq (not steal)
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:]]
    return t[0] + t[1] + t[2] + t[5] + t[6]

os.umask(0o077)  # the data dir must be private, as the service makes it
with running_stack(pg) as stack:
    before = busy()
    got = enqueue_and_finish(stack, runs, 4)
    after = busy()
if got["succeeded"] != runs:
    sys.exit(f"only {int(got['succeeded'])} of {runs} runs succeeded")
print(got["runs_per_s"], (after - before) * 1000 / os.sysconf("SC_CLK_TCK") / runs)
"""
_IDLE = """
import os, statistics, sys
from bench.stack import running_stack
from bench.trivial import define_task, idle_latency
runs, pg = int(sys.argv[1]), sys.argv[2] or None
os.umask(0o077)
with running_stack(pg) as stack:
    define_task(stack)
    idle_latency(stack, 10)
    lags = idle_latency(stack, runs)
if len(lags) != runs:
    sys.exit(f"only {len(lags)} of {runs} runs started")
print(statistics.mean(lags))
"""


def burst_in(
    checkout: Path, runs: int, pg: str | None, *, idle: bool = False
) -> tuple[float, float | None]:
    """runs/s of one burst of ``checkout``'s code, in a process of its own (its modules), and
    the machine's busy CPU per run in ms; with ``idle``, the mean created → started ms of
    ``runs`` runs one at a time (and no CPU figure)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["PYTHONPATH"] = str(checkout)
    done = subprocess.run(
        [sys.executable, "-c", _IDLE if idle else _ONE_BURST, str(runs), pg or ""],
        cwd=checkout, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"burst in {checkout} failed: {done.stderr[-2000:]}")
    # The child's last line (anything the stack printed before it is not a figure).
    figures = [float(x) for x in done.stdout.strip().splitlines()[-1].split()]
    return figures[0], (figures[1] if len(figures) > 1 else None)


def order(round_index: int) -> tuple[str, str]:
    """Which checkout bursts first in a round: the baseline in even rounds, this checkout in
    odd ones. A fixed order can favour one side: in session 14 two commits whose bursts
    differ by two pings in 600 runs measured a median ratio of 1.12 with one of them always
    second, 1.03 with the other always second, and 1.02 alternating."""
    return ("base", "ours") if round_index % 2 == 0 else ("ours", "base")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, help="the other checkout (the baseline)")
    parser.add_argument("--rounds", type=int, default=4)  # even: each side first as often
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--pg", default=None, help="a PostgreSQL URL (default: SQLite)")
    parser.add_argument("--idle", action="store_true", help="one at a time: mean ms to start")
    args = parser.parse_args()
    unit = "ms created -> started (mean)" if args.idle else "runs/s"
    if args.against is None:
        parser.error("--against DIR is required: the baseline is the other checkout")
    base: list[float] = []
    ours: list[float] = []
    cpu: dict[str, list[float]] = {"base": [], "ours": []}
    for i in range(args.rounds):
        sides = order(i)
        for side in sides:
            checkout = args.against.resolve() if side == "base" else ROOT
            figure, cpu_ms = burst_in(checkout, args.runs, args.pg, idle=args.idle)
            (base if side == "base" else ours).append(figure)
            if cpu_ms is not None:
                cpu[side].append(cpu_ms)
        first = "this checkout" if sides[0] == "ours" else str(args.against)
        line = (
            f"round {i + 1} ({first} first): {args.against} {base[-1]:.2f}, "
            f"this checkout {ours[-1]:.2f} {unit}"
        )
        if cpu["ours"]:
            line += f"; CPU {cpu['base'][-1]:.2f} vs {cpu['ours'][-1]:.2f} ms/run"
        print(line)
    b, o = statistics.median(base), statistics.median(ours)
    better = " (below 1: this checkout is quicker)" if args.idle else ""
    print(
        f"median {unit}: this checkout {o:.2f} | {args.against} {b:.2f} | "
        f"ratio {o / b:.3f}{better}"
    )
    if cpu["ours"]:
        cb, co = statistics.median(cpu["base"]), statistics.median(cpu["ours"])
        print(
            f"median machine CPU per run: this checkout {co:.2f} ms | {args.against} "
            f"{cb:.2f} ms | ratio {co / cb:.3f} (below 1: this checkout needs less)"
        )


if __name__ == "__main__":
    main()
