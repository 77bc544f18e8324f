"""Start-up failures a person can act on: one line naming the cause and the fix, no traceback.

Each runs the installed binary as a separate process, as an operator would.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus import embedded

BINARY = str(Path(sys.executable).with_name("gpustack-operator"))


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    server = subprocess.Popen(
        [embedded.find_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BINARY, *argv], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("E")]


def test_worker_without_a_kubeconfig_names_the_ways_out(tmp_path: Path, nats: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(HOME=str(tmp_path), KUBERNETES_SERVICE_HOST="")
    done = _run(["worker", f"--nats-url={nats}", "--secure-port=0"], env)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    [line] = _errors(done.stderr)
    assert "KUBECONFIG" in line and "--kubeconfig=none" in line


def test_a_busy_port_in_standalone_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run(
            ["standalone", "--simulate=nvidia-h200x8", f"--state-dir={tmp_path}",
             "--nats-port=0", f"--worker-port={port}", "--device-manager-port=0",
             "--model-manager-port=0", "--dashboard-port=0", "--bind-address=127.0.0.1",
             "--node-name=n1"],
            dict(os.environ),
        )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    [line] = _errors(done.stderr)
    assert f"127.0.0.1:{port}" in line and "in use" in line


def test_dm_serve_without_a_kubelet_directory_is_one_line(tmp_path: Path) -> None:
    done = _run(
        ["dm", "serve", "--simulate=nvidia-h200x8", "--kube-socket=/nonexistent/dir/kubelet.sock",
         "--secure-port=0", "--bind-address=127.0.0.1", "--node-name=n1",
         "--nats-url=nats://127.0.0.1:1"],
        dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    [line] = _errors(done.stderr)
    assert "/nonexistent/dir does not exist" in line
