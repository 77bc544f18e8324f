"""Durability of a published tree: every file is synced after its last change, once for all.

The operating system calls of a real pull (a real Hub server, the real cache filesystem) are
journaled by path: what changed a file's bytes or mode, what fsynced it, and each ``syncfs`` of
the cache filesystem (which syncs every file on it). A small file lands read-only and unsynced;
publication's seal syncs the filesystem once, after the last change to any file of the tree,
including one kept from an earlier attempt (rehashed, perhaps only in the page cache) and a
large one. No small file is fsynced, or has its writeback started, on its own (one journal
commit each, and a writeback submission each: the costs this saves).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from models_harness import FILES, TUNING, Rig

from agent.models import diskio, pull
from hub import testing

pytestmark = pytest.mark.anyio

SMALL = [name for name, data in FILES.items() if len(data) <= TUNING.small_bytes]
LARGE = [name for name, data in FILES.items() if len(data) > TUNING.small_bytes]


class Journal:
    """``(call, file under a tree)`` for each journaled call, in the order they ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        for name in ("pwritev", "ftruncate", "posix_fallocate", "posix_fadvise", "fsync"):
            monkeypatch.setattr(os, name, self._by_fd(name, getattr(os, name)))
        monkeypatch.setattr(os, "chmod", self._by_path(os.chmod))
        real_syncfs = diskio.syncfs

        def syncfs(path: Path) -> None:
            real_syncfs(path)  # journaled once it returned: what it covers is synced
            self.calls.append(("syncfs", ""))

        monkeypatch.setattr(diskio, "syncfs", syncfs)

    def _note(self, call: str, path: str) -> None:
        if "/tree/" in path and not os.path.isdir(path):
            self.calls.append((call, path.split("/tree/", 1)[1]))

    def _by_fd(self, call: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def journaled(fd: int, *args: Any) -> Any:
            self._note(call, os.readlink(f"/proc/self/fd/{fd}"))
            return real(fd, *args)

        return journaled

    def _by_path(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def journaled(path: Any, *args: Any, **kwargs: Any) -> Any:
            self._note("chmod", os.fspath(path))
            return real(path, *args, **kwargs)

        return journaled

    def fsyncs(self, name: str) -> int:
        return self.calls.count(("fsync", name))

    def synced_last(self, name: str) -> bool:
        """Whether a sync of ``name`` (its fsync, or a syncfs) came after its last change."""
        own = [call for call, path in self.calls if path == name or call == "syncfs"]
        return bool(own) and own[-1] in ("fsync", "syncfs")


async def _pull(rig: Rig) -> Path:
    settings = pull.PullSettings(
        repository="org/model",
        revision="main",
        cache_root=rig.settings.cache_root,
        endpoint=rig.endpoints.hub,
        tuning=TUNING,
    )
    _, tree = await pull.pull(settings)
    return tree


def _fetched(hub: testing.FakeHub) -> set[str]:
    return {s.path.rsplit("/", 1)[-1] for s in hub.seen if "/api/" not in s.path}


async def test_a_fresh_pull_syncs_each_file_after_its_last_change_with_one_syncfs(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.artifact("org/model", FILES)
    journal = Journal(monkeypatch)

    tree = await _pull(rig)

    monkeypatch.undo()
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()) == sorted(FILES)
    assert {name: journal.synced_last(name) for name in FILES} == dict.fromkeys(FILES, True)
    assert journal.calls.count(("syncfs", "")) == 1
    assert {name: journal.fsyncs(name) for name in SMALL} == dict.fromkeys(SMALL, 0)
    # nor is a small file's writeback started on its own: the syncfs does it for all at once
    advised = {path for call, path in journal.calls if call == "posix_fadvise"}
    assert advised == set(LARGE)  # a large file's batches are, as they are written
    assert LARGE


async def test_files_kept_from_a_failed_attempt_are_synced_by_the_next_publication(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.artifact("org/model", FILES)
    rig.hub.corrupt.add("model-00002.safetensors")
    with pytest.raises(pull.PullFailed, match="IntegrityMismatch"):
        await _pull(rig)
    rig.hub.corrupt.clear()
    rig.hub.seen.clear()
    journal = Journal(monkeypatch)

    tree = await _pull(rig)

    monkeypatch.undo()
    kept = set(FILES) - _fetched(rig.hub) - {"empty.txt"}  # an empty file is never requested
    assert kept and "model-00002.safetensors" not in kept
    assert {p: (tree / p).read_bytes() for p in FILES} == FILES
    assert {name: journal.synced_last(name) for name in FILES} == dict.fromkeys(FILES, True)
    assert journal.calls.count(("syncfs", "")) == 1
