"""Publication: a downloaded attempt becomes ``published/<hex>``, sealed, in one atomic step.

What a reader may rely on, and why each step is here: every file is read-only (0444) and
durable (:func:`seal_files`: one ``syncfs`` of the cache filesystem, not an fsync per file,
see :mod:`agent.models.diskio`); every directory is 0555 and fsynced, deepest first;
the manifest and the marker are written atomically; then
``rename(partial/<hex>/<n>, published/<hex>)`` and an fsync of ``published``. A reader
therefore sees either no tree or a complete, durable one, and a tree without its marker is a
torn leftover that the next publication replaces.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import anyio
import anyio.to_thread
import msgspec

from agent.models import diskio, layout
from hub.manifest import Manifest

__all__ = ["publish", "seal_files"]


async def seal_files(tree: Path) -> None:
    """Every file under ``tree`` read-only and durable (:func:`diskio.seal`), in a worker
    thread."""
    await anyio.to_thread.run_sync(diskio.seal, tree)


def publish(
    cache: layout.Cache,
    hex_: str,
    number: int,
    attempt: Path,
    manifest: Manifest,
    source: Literal["Hub", "Peer"] = "Hub",
) -> None:
    """Seal ``attempt`` and rename it to ``published/<hex>`` (see the module docstring); an
    attempt whose digest an earlier run published meanwhile is discarded instead (same bytes).
    Blocking: run it in a worker thread."""
    state = attempt / "state"
    for p in state.iterdir():
        p.unlink()
    state.rmdir()
    tree = attempt / "tree"
    for e in manifest.entries:  # directories of empty repos still need to exist
        (tree / e.path).parent.mkdir(parents=True, exist_ok=True)
    layout.write_atomically(attempt / "manifest", manifest.text().encode())
    _seal(tree)
    marker = layout.Marker(
        digest="sha256:" + hex_,
        attempt=number,
        size_bytes=manifest.size,
        file_count=len(manifest.entries),
        published_time=datetime.now(UTC),
        source=source,
    )
    layout.write_atomically(attempt / "marker", msgspec.json.encode(marker))
    if cache.is_published(hex_):
        cache.discard(attempt)  # published by an earlier run meanwhile: same bytes, keep that one
        return
    cache.discard(cache.published / hex_)  # a torn leftover without marker
    attempt.rename(cache.published / hex_)
    layout.fsync_dir(cache.published)


def _seal(tree: Path) -> None:
    """Directories 0555 deepest first and fsynced (their files were sealed before)."""
    for dirpath, _, _ in os.walk(tree, topdown=False):
        layout.fsync_dir(Path(dirpath))
        os.chmod(dirpath, 0o555)
