"""File names derived from an attempt id, and the shim's own spelling of its temp files."""

from __future__ import annotations

import pytest

from app.domain.artifacts import (
    log_head_bytes,
    log_tail_bytes,
    publish_temp_name,
    published_by_temp,
    receipt_name,
    receipt_relpath,
    receipt_temp_relpath,
    truncation_fact_relpath,
    truncation_fact_temp_relpath,
)
from app.domain.ids import uuid7
from app.worker import shim


def test_the_shim_names_its_temp_files_as_the_worker_and_the_audit_expect() -> None:
    # The shim imports nothing from app, so it spells the temp name itself: this is the
    # check that its copy and the domain's stay one rule.
    attempt = uuid7()
    for name in (receipt_name(attempt), f"{attempt}.log.truncated"):
        assert shim._Published(-1, name).tmp == publish_temp_name(name)
    assert receipt_temp_relpath(attempt).rsplit("/", 1)[1] == publish_temp_name(
        receipt_name(attempt)
    )


def test_the_shim_keeps_the_tail_the_log_reads_expect() -> None:
    # The api says a running log is cut once it reaches its head: the shim's rule, spelled twice.
    for quota in (0, 1, 7, 1024, 256 * 1024, 4 << 20, 64 << 20):
        assert shim._tail_bytes(quota) == log_tail_bytes(quota)
        assert log_head_bytes(quota) + log_tail_bytes(quota) == quota
    assert log_tail_bytes(4 << 20) == log_tail_bytes(64 << 20) == 64 * 1024


def test_the_temp_paths_sit_beside_the_files_they_publish() -> None:
    attempt = uuid7()
    for final, temp in (
        (receipt_relpath(attempt), receipt_temp_relpath(attempt)),
        (truncation_fact_relpath(attempt), truncation_fact_temp_relpath(attempt)),
    ):
        shard, name = final.rsplit("/", 1)
        assert temp == f"{shard}/{publish_temp_name(name)}"
        assert published_by_temp(temp.rsplit("/", 1)[1]) == name


@pytest.mark.parametrize("name", ["x.json", ".x.json", "x.json.tmp", ".tmp", "..tmp", ""])
def test_a_name_that_is_no_temp_file_publishes_nothing(name: str) -> None:
    assert published_by_temp(name) is None
