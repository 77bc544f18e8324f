"""``bus schema`` and ``bus watch`` as a user runs them, against a real nats-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from bus import connection, publishing, subjects, testing
from bus.metrics import BusMetrics

CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")


def test_schema_covers_every_event_kind() -> None:
    result = subprocess.run([CLI, "bus", "schema"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    text = json.dumps(schema)
    for kind in subjects.KINDS:
        assert f'"{kind}"' in text, kind


@pytest.mark.anyio
async def test_watch_prints_retained_state_as_json_lines(tmp_path: Path) -> None:
    async with testing.nats_server(tmp_path) as server:
        settings = testing.settings_for(server)
        async with (
            connection.connect(settings, retry=False) as conn,
            publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
        ):
            for event in testing.example_events("gpu-node.example.com"):
                pub.publish(event)
            await pub.wait_sent()
        env = {**os.environ, "NATS_URL": server.url}
        process = await anyio.open_process(
            [
                CLI,
                "bus",
                "watch",
                "--node",
                "gpu-node.example.com",
                "--subject",
                "gpustack.v1.node.*.devices",
            ],
            env=env,
        )
        try:
            assert process.stdout is not None
            with anyio.fail_after(20):
                line = b""
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive(1)
        finally:
            process.terminate()
            await process.wait()
            await process.aclose()
    document = json.loads(line)
    assert document["kind"] == "devices"
    assert document["node"] == "gpu-node.example.com"


def test_watch_without_a_server_fails_with_one_line() -> None:
    result = subprocess.run(
        [CLI, "bus", "watch", "--nats-url", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert "cannot connect" in result.stderr.splitlines()[-1]
