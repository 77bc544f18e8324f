"""``-o`` wherever a command prints objects, one YAML style for all, kubectl's empty-table line:
run through the console script against a real Hub server (``hub.testing``) and a real
nats-server."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import anyio
import msgspec
import pytest
import yaml

from bus import codec, connection, publishing, testing
from bus.metrics import BusMetrics
from gpustack_operator.buswatching import format_event
from hub import testing as hub_testing
from kit import rendering

pytestmark = pytest.mark.anyio
CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")
FILES = {"config.json": b"{}", "model.safetensors": b"w" * 64}
_UNINDENTED_LIST = re.compile(r"^( *)[\w.-]+:\n\1- ", re.MULTILINE)
"""A block sequence at its key's own indent: PyYAML's default, not kubectl's."""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSTACK_", "NATS_", "HF_"))}
    return {**env, **extra}


async def _cli(*args: str, **env: str) -> tuple[int, str, str]:
    done = await anyio.run_process([CLI, *args], env=_env(**env), check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_mm_manifest_prints_json_and_yaml_documents(tmp_path: Path) -> None:
    hub = hub_testing.FakeHub(tmp_path / "hub", lfs_threshold=16)
    commit = hub.add("org/tiny", FILES)
    async with hub_testing.serving(hub) as endpoints:
        base = ("mm", "manifest", "org/tiny", "--hf-endpoint", endpoints.hub)
        text = await _cli(*base)
        as_json = await _cli(*base, "-o", "json")
        as_yaml = await _cli(*base, "--output=yaml")
    assert text[0] == as_json[0] == as_yaml[0] == 0, (text[2], as_json[2], as_yaml[2])
    digest = text[1].splitlines()[-1].removeprefix("digest: ")
    document = json.loads(as_json[1])
    assert yaml.safe_load(as_yaml[1]) == document
    assert document["repository"] == "org/tiny" and document["revision"] == "main"
    assert document["commit"] == commit and document["digest"] == digest
    assert [f["path"] for f in document["files"]] == ["config.json", "model.safetensors"]
    weights = document["files"][1]
    assert weights["size"] == 64 and weights["algorithm"] == "sha256"
    assert weights["oid"] == hashlib.sha256(b"w" * 64).hexdigest()
    assert document["size"] == sum(len(b) for b in FILES.values())
    assert not _UNINDENTED_LIST.search(as_yaml[1])


async def test_mm_pull_prints_json_and_yaml_documents(tmp_path: Path) -> None:
    hub = hub_testing.FakeHub(tmp_path / "hub", lfs_threshold=16)
    commit = hub.add("org/tiny", FILES)
    cache = tmp_path / "cache"
    async with hub_testing.serving(hub) as endpoints:
        argv = ("mm", "pull", "org/tiny", "--cache-root", str(cache), "-o", "json")
        code, out, err = await _cli(*argv, HF_ENDPOINT=endpoints.hub)
        again = await _cli(*argv[:-1], "yaml", HF_ENDPOINT=endpoints.hub)
    assert code == 0 and again[0] == 0, (err, again[2])
    document = json.loads(out)
    assert yaml.safe_load(again[1]) == document
    assert document["commit"] == commit and document["digest"].startswith("sha256:")
    assert sorted(os.listdir(document["path"])) == sorted(FILES)


async def test_output_refuses_an_unknown_format() -> None:
    code, out, err = await _cli("mm", "manifest", "org/tiny", "-o", "xml")
    assert code == 2 and out == ""
    assert "must be one of text, json, yaml" in err


async def test_kind_lists_its_real_choices() -> None:
    code, _, err = await _cli("bus", "watch", "--kind", "bogus")
    assert code == 2 and len(err.splitlines()) == 1
    assert "must be one of devices, samples, health, allocations, models, agent (or empty)" in err
    assert "one of ," not in err


async def test_an_empty_bus_watch_table_says_no_resources_found(tmp_path: Path) -> None:
    async with testing.nats_server(tmp_path) as server:
        settings = testing.settings_for(server)
        async with (
            connection.connect(settings, retry=False) as conn,
            publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
        ):
            for event in testing.example_events("node-a"):
                pub.publish(event)
            await pub.wait_sent()
        watch = ("bus", "watch", "--once", "--nats-url", server.url)
        empty = await _cli(*watch, "-o", "wide", "--node", "node-b")
        full = await _cli(*watch, "-o", "wide", "--node", "node-a")
        documents = await _cli(*watch, "--node", "node-b")
    assert empty[0] == 0 and empty[1] == "", empty[2]
    assert "No resources found." in empty[2]
    assert full[0] == 0 and full[1].startswith("TIME") and "No resources" not in full[2]
    assert documents[0] == 0 and documents[1] == "" and "No resources" not in documents[2]


def test_every_yaml_has_one_style() -> None:
    """``bus watch -o yaml``, ``dm detect``'s renderer and ``dm preflight`` print alike: block
    sequences indented under their key, multi-line text as a ``|`` block."""
    for event in testing.example_events("node-a"):
        wire = msgspec.json.decode(codec.encode(event))
        shown = format_event(event, "yaml")
        assert shown == "---\n" + rendering.yaml_text(wire)
        assert not _UNINDENTED_LIST.search(shown), shown
    document = {"checks": [{"evidence": "line one\nline two\n"}]}
    assert rendering.yaml_text(document) == (
        "checks:\n  - evidence: |\n      line one\n      line two\n"
    )
    assert rendering.render(document, "yaml") == rendering.yaml_text(document)
