"""Printing and recording figures with their same-run baselines."""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Figure:
    """One measured value beside the baseline measured in the same run."""

    name: str
    value: float
    unit: str
    baseline_name: str
    baseline: float
    higher_is_better: bool
    target: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """value / baseline (how many baselines one figure is)."""
        return self.value / self.baseline if self.baseline else float("nan")


@dataclass
class Report:
    """All figures of one benchmark run."""

    figures: list[Figure] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)

    def add(self, figure: Figure) -> None:
        """Record and print one figure."""
        self.figures.append(figure)
        print(
            f"{figure.name:<44} {figure.value:>12.3f} {figure.unit:<7}"
            f" | {figure.baseline_name:<36} {figure.baseline:>12.3f}"
            f" | ratio {figure.ratio:>8.3f}"
            + (f" | target {figure.target}" if figure.target else ""),
            flush=True,
        )

    def write(self, label: str) -> Path:
        """Write the figures as JSON under bench/results/."""
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"{label}-{time.strftime('%Y%m%dT%H%M%S')}.json"
        payload = {
            "label": label,
            "machine": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": __import__("os").cpu_count(),
            },
            "figures": [asdict(f) | {"ratio": f.ratio} for f in self.figures],
        }
        path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"figures written to {path}")
        return path


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0..100) of ``samples``."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(samples: list[float]) -> float:
    """The median of ``samples``."""
    return statistics.median(samples) if samples else float("nan")
