"""``python -m bench.table RESULTS.json``: the figures of one run as a Markdown table."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _num(value: float) -> str:
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(path: Path) -> str:
    """Markdown rows: figure, value, baseline, ratio, target."""
    data = json.loads(path.read_text())
    lines = [
        "| figure | value | same-run baseline | ratio | target |",
        "|---|---:|---|---:|---|",
    ]
    for f in data["figures"]:
        f = {k: v.replace("|", "\\|") if isinstance(v, str) else v for k, v in f.items()}
        lines.append(
            f"| {f['name']} | {_num(f['value'])} {f['unit']} | {f['baseline_name']}:"
            f" {_num(f['baseline'])} | {f['ratio']:.3g} | {f['target']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
