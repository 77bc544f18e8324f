"""Secrets never printed: a real run's whole output is searched for every secret it was given.

The secrets come in every way an operator hands them over: ``--nats-password`` and
``--nats-token`` on the command line or as ``GPUSTACK_*`` environment variables, and a password
inside ``--nats-url``. The bus is a closed port, so the run shows what is shown most often: a
connection warning on every retry (``model-manager``, which retries forever) or the final error
(``bus watch``, which gives up at once), plus ``--print-cmdline`` at ``-v=2``, in both formats.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bus.embedded import free_port

CLI = shutil.which("gpustack-operator", path=os.path.dirname(sys.executable)) or "gpustack-operator"

URL_SECRET = "s3cr3t-word"
PASSWORD = "other-s3cr3t"
TOKEN = "t0ken-s3cr3t"


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSTACK_")}
    full_env.update(env)
    with log.open("wb") as out:
        return subprocess.Popen([CLI, *args], stdout=out, stderr=subprocess.STDOUT, env=full_env)


def _run_until(args: list[str], env: dict[str, str], log: Path, marker: str) -> str:
    """Run until ``marker`` is in the output (or the process ends), then SIGTERM it."""
    proc = _start(args, env, log)
    try:
        deadline = time.monotonic() + 30
        while marker not in log.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return log.read_text()


def _secret_flags(via_env: bool) -> tuple[list[str], dict[str, str]]:
    url = f"--nats-url=nats://agent:{URL_SECRET}@127.0.0.1:{free_port()}"
    if via_env:
        return [url], {"GPUSTACK_NATS_PASSWORD": PASSWORD, "GPUSTACK_NATS_TOKEN": TOKEN}
    return [url, f"--nats-password={PASSWORD}", f"--nats-token={TOKEN}"], {}


def _assert_no_secret(output: str, fmt: str) -> None:
    assert "cannot connect to nats://agent:REDACTED@127.0.0.1" in output, output
    assert "--nats-password=REDACTED" in output and "--nats-token=REDACTED" in output
    for secret in (URL_SECRET, PASSWORD, TOKEN):
        assert secret not in output
    if fmt == "json":
        for line in output.splitlines():
            json.loads(line)


@pytest.mark.parametrize("via_env", [False, True], ids=["flags", "env"])
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_bus_watch_prints_no_secret(tmp_path: Path, fmt: str, via_env: bool) -> None:
    flags, env = _secret_flags(via_env)
    args = ["bus", "watch", *flags, "--print-cmdline", "-v=2", f"--logging-format={fmt}"]
    output = _run_until(args, env, tmp_path / "watch.log", "cannot connect to")
    _assert_no_secret(output, fmt)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_retrying_agent_prints_no_secret(tmp_path: Path, fmt: str) -> None:
    flags, env = _secret_flags(via_env=fmt == "json")
    args = [
        "model-manager", "--node-name=n1", f"--kubelet-dir={tmp_path}/kubelet",
        f"--cache-root={tmp_path}/cache", f"--csi-socket={tmp_path}/csi.sock",
        "--secure-port=0", "--bind-address=127.0.0.1",
        *flags, "--print-cmdline", "-v=2", f"--logging-format={fmt}",
    ]  # fmt: skip
    output = _run_until(args, env, tmp_path / "mm.log", "retrying in")
    _assert_no_secret(output, fmt)
