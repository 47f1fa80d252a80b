"""The shim bench builds the spec the shim validates (it rotted once: a spec without
``leftovers`` and ``cgroup_root`` made every bench launch fail with SPEC_INVALID)."""

from __future__ import annotations

from pathlib import Path

from app.worker import shim
from bench.shim import _Shims


def test_the_bench_spec_is_one_the_shim_accepts(tmp_path: Path) -> None:
    spec = _Shims(tmp_path).spec(["/bin/true"], 1 << 20)
    assert shim._validate(spec) is spec
