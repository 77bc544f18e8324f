"""A pull killed at any moment leaves no torn tree: ``published/<hex>`` is complete or absent.

The real command in its own process, against a real Hub server, is killed with SIGKILL at random
moments across a whole pull (listing, landing, the seal, the rename), again and again on one
cache, each attempt resuming what the last one left. After every kill, whatever is published
must hold every file of the manifest with its bytes, read-only, beside its marker; and a last
pull, not killed, must publish the tree. (SIGKILL keeps the page cache, so this proves the
publication is atomic and a resume sound; that the bytes are on disk before the rename is what
``test_models_durability`` asserts of the calls.)
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest
from models_harness import Rig, content, manifest_of

pytestmark = pytest.mark.anyio
CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")
FILES = {f"shard/part-{i:03d}.bin": content(2048 + 97 * i, i) for i in range(120)}
FILES |= {"config.json": b'{"a": 1}', "model.safetensors": content(3 * 1024 * 1024 + 5, 999)}
KILLS = 12


def _argv(rig: Rig, root: Path) -> list[str]:
    return [CLI, "mm", "pull", "org/model", "--cache-root", str(root)]


def _env(rig: Rig) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    return {**clean, "HOME": "/nonexistent", "HF_ENDPOINT": rig.endpoints.hub}


def _published(root: Path) -> dict[str, dict[str, bytes]]:
    """Each published tree's files (path -> bytes); asserts each is sealed beside a marker."""
    out: dict[str, dict[str, bytes]] = {}
    published = root / "published"
    for digest in os.listdir(published) if published.exists() else ():
        assert (published / digest / "marker").is_file(), f"{digest} published without marker"
        tree = published / digest / "tree"
        files = {str(p.relative_to(tree)): p for p in tree.rglob("*") if p.is_file()}
        assert all(p.stat().st_mode & 0o777 == 0o444 for p in files.values())
        out[digest] = {name: p.read_bytes() for name, p in files.items()}
    return out


async def _killed_after(rig: Rig, root: Path, delay: float) -> int | None:
    async with await anyio.open_process(_argv(rig, root), env=_env(rig)) as process:
        with anyio.move_on_after(delay):
            return await process.wait()
        process.send_signal(signal.SIGKILL)
        await process.wait()
    return None


async def test_a_pull_killed_at_random_moments_publishes_a_whole_tree_or_none(
    rig: Rig, tmp_path: Path
) -> None:
    rig.artifact("org/model", FILES)
    hex_ = manifest_of(FILES).digest.removeprefix("sha256:")
    begun = time.monotonic()
    whole = await anyio.run_process(_argv(rig, tmp_path / "once"), env=_env(rig), check=False)
    span = time.monotonic() - begun
    assert whole.returncode == 0, whole.stderr.decode()

    root = tmp_path / "cache"
    chance = random.Random(32)
    outcomes = []
    for _ in range(KILLS):
        code = await _killed_after(rig, root, chance.uniform(0.0, span))
        outcomes.append(code)
        for digest, files in _published(root).items():
            assert digest == hex_
            assert files == FILES
        if code == 0:  # it finished before the kill: start over on an empty cache
            os.rename(root, tmp_path / f"done-{len(outcomes)}")
    assert outcomes.count(None) >= KILLS // 2, outcomes  # most runs were killed mid-way

    last = await anyio.run_process(_argv(rig, root), env=_env(rig), check=False)
    assert last.returncode == 0, last.stderr.decode()
    assert _published(root) == {hex_: FILES}
