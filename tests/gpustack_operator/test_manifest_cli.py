"""``model-manager manifest``: what a user runs to pin ``expectedDigest``, against a real Hub server."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import anyio
import pytest

from hub import testing as hub_testing

pytestmark = pytest.mark.anyio
CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")


async def test_manifest_prints_commit_manifest_and_a_digest_that_matches_it(
    tmp_path: Path,
) -> None:
    hub = hub_testing.FakeHub(tmp_path / "hub", lfs_threshold=16)
    commit = hub.add(
        "org/tiny",
        {"config.json": b"{}", "model.safetensors": b"w" * 64, "README.md": b"# tiny"},
    )
    async with hub_testing.serving(hub) as endpoints:
        result = await anyio.run_process(
            [
                CLI,
                "mm",
                "manifest",
                "org/tiny",
                "--hf-endpoint",
                endpoints.hub,
                "--ignore-pattern",
                "*.md",
            ],
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    assert commit in out
    assert "README.md" not in out
    first, *rest = out.splitlines()
    assert first == f"commit: {commit}"
    *manifest_lines, digest_line = rest
    manifest = "".join(line + "\n" for line in manifest_lines)
    assert manifest_lines[0] == "gpustack-manifest v1"
    assert [line.split(" ", 2)[2] for line in manifest_lines[1:]] == [
        "config.json",
        "model.safetensors",
    ]
    assert manifest_lines[2].startswith("sha256:" + hashlib.sha256(b"w" * 64).hexdigest())
    assert digest_line == "digest: sha256:" + hashlib.sha256(manifest.encode()).hexdigest()
