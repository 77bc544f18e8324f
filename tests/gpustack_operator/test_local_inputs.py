"""Local inputs are bounded and refused in words: every path or file flag that cannot be used
exits 2 with one line naming the flag, before anything starts (issue 31, item 5)."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpustack_operator import process
from kit import files

CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "HOME": str(tmp_path),
        "NATS_URL": "",
    }
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, check=False, timeout=60, env=env
    )


def _refused(result: subprocess.CompletedProcess[str], flag: str) -> str:
    """The one line of a refusal that names ``flag`` (exit 2, nothing started)."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert flag in lines[0]
    return lines[0]


def test_simulate_dev_zero_is_refused_not_read(tmp_path: Path) -> None:
    # The old loader read /dev/zero to the end: 12 GB in 18 s, and on.
    line = _refused(
        _run("dm", "detect", "--simulate", "/dev/zero", tmp_path=tmp_path), "--simulate"
    )
    assert "not a regular file" in line


def test_simulate_an_oversized_profile_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (2 * 1024 * 1024))
    line = _refused(_run("dm", "detect", "--simulate", str(big), tmp_path=tmp_path), "--simulate")
    assert "larger than" in line


@pytest.mark.parametrize(
    "command",
    [
        ("dm", "serve", "--secure-port", "0", "--nats-url", "nats://127.0.0.1:1"),
        ("standalone", "--run-for", "1s"),
    ],
)
def test_a_service_refuses_a_missing_profile_at_start(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    args = (*command, "--simulate", str(tmp_path / "nonexistent.yaml"))
    if command[0] == "dm":
        args = (*args, "--state-dir", str(tmp_path / "dm"))
    line = _refused(_run(*args, tmp_path=tmp_path), "--simulate")
    assert "nonexistent.yaml" in line


def test_standalone_state_dir_that_cannot_hold_files(tmp_path: Path) -> None:
    line = _refused(
        _run("standalone", "--state-dir=/proc/self", "--run-for", "1s", tmp_path=tmp_path),
        "--state-dir",
    )
    assert "[Errno" not in line and "/proc/self" in line


def test_worker_audit_log_path_in_a_missing_directory(tmp_path: Path) -> None:
    line = _refused(
        _run(
            "worker",
            "--kubeconfig=none",
            "--metrics-auth=none",
            "--secure-port=0",
            "--nats-url=nats://127.0.0.1:1",
            "--audit-log-path",
            "/proc/nonexistent/x",
            tmp_path=tmp_path,
        ),
        "--audit-log-path",
    )
    assert "does not exist" in line


@pytest.mark.parametrize("flag", ["--audit-policy-file", "--audit-webhook-config-file"])
def test_worker_audit_files_are_read_bounded(tmp_path: Path, flag: str) -> None:
    line = _refused(
        _run(
            "worker",
            "--kubeconfig=none",
            "--metrics-auth=none",
            "--secure-port=0",
            "--nats-url=nats://127.0.0.1:1",
            flag,
            "/dev/zero",
            tmp_path=tmp_path,
        ),
        flag,
    )
    assert "not a regular file" in line


def test_worker_kubeconfig_that_is_no_regular_file(tmp_path: Path) -> None:
    line = _refused(
        _run("worker", "--kubeconfig=/dev/zero", "--secure-port=0", tmp_path=tmp_path),
        "--kubeconfig",
    )
    assert "not a regular file" in line


def test_a_full_disk_is_said_in_words(caplog: pytest.LogCaptureFixture) -> None:
    """A real ENOSPC (``/dev/full``) as the process runner reports it: a reason, no errno."""
    with pytest.raises(OSError) as caught, open("/dev/full", "wb", buffering=0) as f:
        f.write(b"x")
    assert caught.value.errno == errno.ENOSPC
    error = OSError(caught.value.errno, os.strerror(caught.value.errno), "/var/lib/models/new")
    with caplog.at_level(logging.ERROR):
        assert process.exit_code_for("model-manager", error) == process.EXIT_FAILED
    assert "no space left on the device holding /var/lib/models/new" in caplog.text
    assert "Errno" not in caplog.text


def test_read_capped_refuses_what_is_no_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, expected in ((fifo, "not a regular file"), (tmp_path, "a directory")):
        with pytest.raises(files.InputRefused, match=expected):
            files.read_capped(path)  # a FIFO with no writer does not block the open
    with pytest.raises(files.InputRefused) as missing:
        files.read_capped(tmp_path / "nothing")
    assert missing.value.missing and "does not exist" in str(missing.value)
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 100)
    assert files.read_capped(exact, limit=100) == b"x" * 100
    with pytest.raises(files.InputRefused, match="larger than"):
        files.read_capped(exact, limit=99)


def test_worker_callout_issuer_seed_is_read_bounded_at_start(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    line = _refused(
        _run(
            "worker",
            f"--kubeconfig={kubeconfig}",
            "--secure-port=0",
            "--nats-callout-issuer-seed=/dev/zero",
            tmp_path=tmp_path,
        ),
        "--nats-callout-issuer-seed",
    )
    assert "not a regular file" in line


def test_a_nats_file_flag_past_the_cap_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    with token.open("wb") as f:
        f.truncate(files.INPUT_BYTES + 1)  # sparse: a regular file larger than any token
    line = _refused(
        _run(
            "bus", "watch", f"--nats-token-file={token}", "--nats-url=nats://127.0.0.1:1",
            tmp_path=tmp_path,
        ),
        "--nats-token-file",
    )  # fmt: skip
    assert "larger than" in line


@pytest.mark.parametrize("command", [("mm", "pull", "Qwen/Qwen3-0.6B"), ("mm", "--secure-port=0")])
def test_a_cache_root_that_cannot_be_made_is_the_flags_fault(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Found only when the cache is opened, yet still one line naming the flag, exit 2, and the
    reason in words (a full disk reads "no space left on the device holding <path>")."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    line = _refused(
        _run(*command, f"--cache-root={blocker}/models", tmp_path=tmp_path), "--cache-root"
    )
    assert "a part of the path is not a directory" in line.split("--cache-root", 1)[1]
    assert "Errno" not in line


@pytest.mark.parametrize(
    "args",
    [
        ("worker", "--kubeconfig=none", "--metrics-auth=none", "--secure-port=0",
         "--nats-url=nats://127.0.0.1:1", "--worker-gateway-unix-path=/proc/nonexistent/s"),
        ("wg", "--bind-unix-path=/proc/nonexistent/s"),  # the default gpustack-api mode
    ],
)  # fmt: skip
def test_a_socket_in_a_missing_directory_is_refused_at_start(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    flag = args[-1].split("=", 1)[0]
    line = _refused(_run(*args, tmp_path=tmp_path), flag)
    assert "/proc/nonexistent: does not exist" in line


@pytest.mark.parametrize(
    "args",
    [
        ("worker", "--kubeconfig=none", "--metrics-auth=none", "--secure-port=0",
         "--nats-url=nats://127.0.0.1:1", "--worker-gateway-unix-path="),
        ("wg", "--bind-unix-path="),
    ],
)  # fmt: skip
def test_a_socket_path_longer_than_a_unix_address_takes_is_refused_at_start(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Its directory exists, so only the length is wrong: 108 bytes, one more than fit."""
    directory = tmp_path / "d"
    directory.mkdir()
    path = directory / ("s" * (108 - len(os.fsencode(directory)) - 1))
    flag = args[-1].split("=", 1)[0]
    line = _refused(_run(*args[:-1], f"{args[-1]}{path}", tmp_path=tmp_path), flag)
    assert "a unix socket path of 108 bytes; at most 107 fit" in line
