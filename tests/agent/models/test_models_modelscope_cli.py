"""``mm pull --hub modelscope`` and ``mm manifest --hub modelscope``: the real console script
against a real fake ModelScope server (:mod:`hub.testing_modelscope`).

The digest of every materialized repository is computed here a second time, from the bytes,
with :mod:`hashlib` alone (the reference's manifest text written out), and must be equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from hub.testing_modelscope import FakeModelScope, serving

pytestmark = pytest.mark.anyio
CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")
FILES = {
    "configuration.json": b'{"framework": "pytorch", "task": "text-generation"}',
    "model.safetensors": bytes(range(256)) * 4096,  # 1 MiB: ranged segments
    "tokenizer/tokenizer.json": '{"é": 1}'.encode() * 300,
    "README.md": b"# tiny\n",
}


def independent_digest(files: dict[str, bytes]) -> str:
    text = "gpustack-manifest v1\n"
    for path in sorted(files, key=lambda p: p.encode()):
        text += f"sha256:{hashlib.sha256(files[path]).hexdigest()} {len(files[path])} {path}\n"
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _env(**extra: str) -> dict[str, str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING", "MODELSCOPE_", "GPUSTACK_"))
    }
    return {**clean, "HOME": "/nonexistent", **extra}


async def _run(*argv: str, **env: str) -> tuple[int, str, str]:
    result = await anyio.run_process([CLI, "mm", *argv], env=_env(**env), check=False)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


@pytest.fixture
async def modelscope() -> AsyncIterator[tuple[FakeModelScope, str]]:
    fake = FakeModelScope()
    async with serving(fake) as url:
        yield fake, url


async def test_pull_materializes_the_independently_computed_digest(
    modelscope: tuple[FakeModelScope, str], tmp_path: Path
) -> None:
    fake, url = modelscope
    commit = fake.add("qwen/Tiny", FILES)
    digest = independent_digest(FILES)
    root = tmp_path / "cache"
    code, out, err = await _run(
        "pull", "qwen/Tiny", "--hub", "modelscope", "--cache-root", str(root), "-o", "json",
        MODELSCOPE_DOMAIN=url,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["commit"], doc["digest"], doc["revision"]) == (commit, digest, "master")
    tree = Path(doc["path"])
    assert tree == root / "published" / digest.removeprefix("sha256:") / "tree"
    assert {p: (tree / p).read_bytes() for p in FILES} == FILES
    fetched = len(fake.file_requests())
    assert fetched >= len(FILES)

    # The manifest command prints the same digest, and a second pull fetches nothing.
    code, out, err = await _run("manifest", "qwen/Tiny", "--hub", "modelscope",
                                "--modelscope-endpoint", url)  # fmt: skip
    assert code == 0, err
    assert out.endswith(f"digest: {digest}\n") and out.startswith(f"commit: {commit}\n")
    code, _, err = await _run(
        "pull", "qwen/Tiny", "--hub", "modelscope", "--cache-root", str(root),
        MODELSCOPE_DOMAIN=url,
    )  # fmt: skip
    assert code == 0, err
    assert len(fake.file_requests()) == fetched


async def test_a_corrupted_file_is_refused_and_nothing_is_published(
    modelscope: tuple[FakeModelScope, str], tmp_path: Path
) -> None:
    fake, url = modelscope
    fake.add("qwen/Tiny", FILES)
    fake.corrupt.add("tokenizer/tokenizer.json")
    root = tmp_path / "cache"
    code, out, err = await _run(
        "pull", "qwen/Tiny", "--hub", "modelscope", "--cache-root", str(root),
        MODELSCOPE_DOMAIN=url,
    )  # fmt: skip
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "IntegrityMismatch" in err and "tokenizer.json" in err
    assert not list((root / "published").iterdir())


async def test_a_private_repository_takes_the_modelscope_token(
    modelscope: tuple[FakeModelScope, str], tmp_path: Path
) -> None:
    fake, url = modelscope
    fake.add("org/private", {"w.bin": b"secret weights"}, token="ms-good")
    args = ("pull", "org/private", "--hub", "modelscope", "--cache-root", str(tmp_path / "c"))
    code, _, err = await _run(*args, MODELSCOPE_DOMAIN=url, HF_TOKEN="ms-good")
    assert code == 1 and "] AccessDenied: " in err and err.count("\n") == 1
    code, _, err = await _run(*args, MODELSCOPE_DOMAIN=url, MODELSCOPE_API_TOKEN="ms-bad")
    assert code == 1 and "the token itself is refused" in err
    code, out, err = await _run(*args, MODELSCOPE_DOMAIN=url, MODELSCOPE_API_TOKEN="ms-good")
    assert code == 0, err
    assert f"digest: {independent_digest({'w.bin': b'secret weights'})}\n" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["pull", "single", "--hub", "modelscope"], "owner/name"),
        (["pull", "a/b", "--hub", "gitee"], "--hub"),
        (["manifest", "a/b", "--hub", "modelscope", "--hf-endpoint", "http://x"], "--hf-endpoint"),
        (["manifest", "a/b", "--modelscope-endpoint", "http://x"], "--hub modelscope"),
        (["manifest", "a/b", "--hub", "modelscope", "--modelscope-endpoint", "ftp://x"], "URL"),
    ],
)
async def test_bad_input_exits_2_in_one_line(argv: list[str], needle: str) -> None:
    code, out, err = await _run(*argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err
    assert "Traceback" not in err


async def test_help_names_the_hub_flag() -> None:
    for command in ("pull", "manifest"):
        code, out, _ = await _run(command, "--help")
        assert code == 0
        assert "--hub string" in out and "modelscope" in out and "--modelscope-endpoint" in out
