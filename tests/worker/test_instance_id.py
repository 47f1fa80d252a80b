"""The instance id of a data dir: created once (0600), stable, one id under a race."""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from app.domain.ids import is_uuid7
from app.worker.identity import current_boot_id
from app.worker.instance import INSTANCE_FILE, claimant, holder_alive, instance_id
from tests.unit.test_lease_decide import lease


def test_instance_id_is_created_once_private_and_stable(tmp_path: Path) -> None:
    first = instance_id(tmp_path)
    assert is_uuid7(first)
    mode = stat.S_IMODE((tmp_path / INSTANCE_FILE).stat().st_mode)
    assert mode == 0o600
    assert instance_id(tmp_path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [INSTANCE_FILE]  # no temp left


def _first_starts(root: Path, starts: int) -> list[str]:
    barrier = threading.Barrier(starts)
    seen: list[str] = []

    def start() -> None:
        barrier.wait()
        seen.append(instance_id(root))

    threads = [threading.Thread(target=start) for _ in range(starts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return seen


def test_concurrent_first_starts_agree_on_one_id(tmp_path: Path) -> None:
    for round_ in range(20):
        root = tmp_path / str(round_)
        root.mkdir()
        seen = _first_starts(root, 4)
        assert len(seen) == 4 and len(set(seen)) == 1
        assert [p.name for p in root.iterdir()] == [INSTANCE_FILE]


def test_a_damaged_instance_file_is_refused_not_replaced(tmp_path: Path) -> None:
    (tmp_path / INSTANCE_FILE).write_text("not-an-id\n")
    with pytest.raises(ValueError, match="does not hold an instance id"):
        instance_id(tmp_path)
    assert (tmp_path / INSTANCE_FILE).read_text() == "not-an-id\n"


def test_holder_alive_needs_the_exact_process_on_this_boot(tmp_path: Path) -> None:
    me = claimant(tmp_path)
    assert me.pid == os.getpid() and me.boot_id == current_boot_id()
    same = replace(
        lease(me.instance_id), boot_id=me.boot_id, pid=me.pid, start_ticks=me.start_ticks
    )
    assert holder_alive(same)
    assert not holder_alive(replace(same, start_ticks=me.start_ticks + 1))  # a reused pid
    assert not holder_alive(replace(same, boot_id="another-boot"))
