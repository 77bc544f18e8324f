"""``worker`` without a reachable cluster says what it needs, at once, instead of retrying.

Run as a user runs it (the console script), with nothing around it: no kubeconfig, no
in-cluster service account, no NATS server; then with a kubeconfig naming an API server that
is not there (and a real nats-server, so the worker gets as far as the API)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from bus import testing

CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")
NEEDS = ("--kubeconfig", "--kubeconfig=none")


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _worker(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUSTACK_", "NATS_", "KUBERNETES_")) and k != "KUBECONFIG"
    }
    env["HOME"] = str(tmp_path / "home")  # no ~/.kube/config
    argv = [CLI, "worker", "--bind-address=127.0.0.1", "--secure-port=0", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_no_kubeconfig_is_told_before_the_bus_is_retried(tmp_path: Path) -> None:
    """No NATS server either: the old worker retried the bus for ever, never naming the
    missing cluster configuration."""
    result = _worker(tmp_path, f"--nats-url=nats://127.0.0.1:{_closed_port()}")
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "no usable Kubernetes configuration" in last
    assert all(need in last for need in NEEDS) and "in-cluster" in last
    assert "cannot connect" not in result.stderr  # the bus was never tried


@pytest.mark.anyio
async def test_an_unreachable_api_server_is_named_with_what_to_do(tmp_path: Path) -> None:
    port = _closed_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    async with testing.nats_server(tmp_path) as server:
        argv = (f"--kubeconfig={kubeconfig}", f"--nats-url={server.url}")
        result = await anyio.to_thread.run_sync(lambda: _worker(tmp_path, *argv))
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"cannot reach the Kubernetes API server https://127.0.0.1:{port}" in last
    assert f"from the kubeconfig {kubeconfig}" in last
    assert all(need in last for need in NEEDS)
