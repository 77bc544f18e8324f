"""The ledger under concurrency and faults: records stay whole and a job's bookkeeping never kills
the plugin."""

from __future__ import annotations

import os
import threading
from functools import partial
from pathlib import Path

import pytest

from agent.models import layout

HEX = "ab" * 32


def _in_threads(n: int, work: partial[object]) -> list[BaseException]:
    """Run ``work`` in ``n`` threads released together; returns what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def one() -> None:
        start.wait()
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _save_many(cache: layout.Cache, times: int) -> None:
    for i in range(times):
        cache.save_digest(HEX, layout.DigestRecord(last_used=float(i)))


def test_concurrent_writes_of_one_digest_record_neither_fail_nor_leave_temp_files(
    tmp_path: Path,
) -> None:
    cache = layout.Cache.open(tmp_path / "cache")

    errors = _in_threads(8, partial(_save_many, cache, 20))

    assert errors == []
    assert sorted(p.name for p in cache.digests.iterdir()) == [f"{HEX}.json"]
    assert cache.load_digest(HEX).last_used == 19.0


def test_a_failed_write_leaves_the_old_record_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = layout.Cache.open(tmp_path / "cache")
    cache.save_digest(HEX, layout.DigestRecord(last_used=1.0))

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output"):
        cache.save_digest(HEX, layout.DigestRecord(last_used=2.0))
    monkeypatch.undo()

    assert sorted(p.name for p in cache.digests.iterdir()) == [f"{HEX}.json"]
    assert cache.load_digest(HEX).last_used == 1.0


def _count_up(cache: layout.Cache, times: int) -> None:
    for _ in range(times):
        cache.update_digest(HEX, lambda r: layout.DigestRecord(last_attempt=r.last_attempt + 1))


def test_updates_of_one_digest_record_are_serialized(tmp_path: Path) -> None:
    cache = layout.Cache.open(tmp_path / "cache")

    errors = _in_threads(8, partial(_count_up, cache, 10))

    assert errors == []
    assert cache.load_digest(HEX).last_attempt == 80
