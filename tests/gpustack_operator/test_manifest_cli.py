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


@pytest.mark.parametrize("where", ["legacy variable", "login file under HF_HOME"])
async def test_manifest_finds_the_token_where_huggingface_hub_does(
    tmp_path: Path, where: str
) -> None:
    hub = hub_testing.FakeHub(tmp_path / "hub")
    hub.add("org/private", {"config.json": b"{}"}, token="s3cret")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env["HOME"] = str(tmp_path / "nohome")
    if where == "legacy variable":
        env["HUGGING_FACE_HUB_TOKEN"] = "s3cret"
    else:
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "token").write_text("s3cret\n")
        env["HF_HOME"] = str(tmp_path / "hf")
    async with hub_testing.serving(hub) as endpoints:
        env["HF_ENDPOINT"] = endpoints.hub
        ok = await anyio.run_process([CLI, "mm", "manifest", "org/private"], env=env, check=False)
        env.pop("HUGGING_FACE_HUB_TOKEN", None)
        env.pop("HF_HOME", None)
        refused = await anyio.run_process(
            [CLI, "mm", "manifest", "org/private"], env=env, check=False
        )
    assert ok.returncode == 0, ok.stderr.decode()
    assert refused.returncode == 1
    assert {s.authorization for s in hub.seen} == {"Bearer s3cret", None}


async def test_manifest_offline_fails_in_one_line_without_a_request(tmp_path: Path) -> None:
    hub = hub_testing.FakeHub(tmp_path / "hub")
    hub.add("org/tiny", {"config.json": b"{}"})
    async with hub_testing.serving(hub) as endpoints:
        result = await anyio.run_process(
            [CLI, "mm", "manifest", "org/tiny", "--hf-endpoint", endpoints.hub],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            check=False,
        )
    assert result.returncode == 1
    assert result.stdout == b""
    assert len(result.stderr.decode().strip().splitlines()) == 1
    assert "HF_HUB_OFFLINE" in result.stderr.decode()
    assert hub.seen == []
