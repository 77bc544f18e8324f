"""The installed console script, run as a user runs it: documents on stdout, logs on stderr."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.devices.simulation import profiles, sysfs

CLI = shutil.which("gpustack-operator", path=os.path.dirname(sys.executable)) or "gpustack-operator"
HEAVY = ("kubernetes_asyncio", "nats", "grpclib", "aiohttp", "prometheus_client")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSTACK_")}
    full_env.update(env or {})
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, env=full_env, timeout=60, check=False
    )


def test_detect_simulated_h200_prints_one_group_of_eight_as_yaml() -> None:
    result = run("dm", "detect", "--simulate", "nvidia-h200x8")
    assert result.returncode == 0, result.stderr
    groups = yaml.safe_load(result.stdout)
    assert [g["id"] for g in groups] == ["nvidia-h200"]
    group = groups[0]
    assert group["simulated"] is True
    assert (group["cores"], group["runtimeVersion"], group["computeCapability"]) == (
        132,
        "12.8",
        "9.0",
    )
    assert [a["index"] for a in group["accelerators"]] == list(range(8))
    assert all(a["id"].startswith("GPU-") for a in group["accelerators"])
    assert "simulating accelerators" in result.stderr


def test_detect_json_is_exactly_one_json_document() -> None:
    result = run("device-manager", "detect", "-o", "json", "--simulate", "nvidia-h200x8")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # raises on any stray byte
    assert len(document[0]["accelerators"]) == 8


def test_detect_and_monitor_wide_are_kubectl_tables() -> None:
    detect = run("dm", "detect", "-o", "wide", "--simulate", "nvidia-h100x8-mig")
    assert detect.returncode == 0, detect.stderr
    header, *rows = detect.stdout.splitlines()
    assert header.split() == [
        "INDEX", "ID", "MANUFACTURER", "PRODUCT", "MEMORY", "HEALTH", "SLICED", "PARTITIONS"
    ]  # fmt: skip
    assert [r.split()[0] for r in rows] == [str(i) for i in range(8)]
    assert all("NVIDIA H100 80GB HBM3   79.6 GiB   Healthy" in r for r in rows)
    assert "1g.10gbx7" in rows[0] and rows[7].split()[-2:] == ["128", "<none>"]
    monitor = run("dm", "monitor", "-o", "wide", "--simulate", "amd-rx7800xt-x2")
    assert monitor.returncode == 0, monitor.stderr
    header, first, second = monitor.stdout.splitlines()
    assert header.split()[:5] == ["INDEX", "ID", "MANUFACTURER", "MEMORY", "USED"]
    cells = first.split()
    assert cells[:5] == ["0", "GPU-5c88007d760374f3", "amd", "16.0", "GiB"]
    assert cells[6] in ("MiB", "GiB") and cells[-1] == "Healthy"
    # The profile's load pattern moves the usage (agent/devices/simulation/moving.py): its
    # bounds, not a snapshot (temperature 38-86 °C, power 8-263 W).
    (util, mem_util, temperature, power) = cells[7:11]
    assert 0 <= int(util.rstrip("%")) <= 100 and 0 <= int(mem_util.rstrip("%")) <= 100
    assert 38 <= int(temperature.rstrip("C")) <= 86 and 8 <= int(power.rstrip("W")) <= 263
    assert second.split()[:2] == ["1", "GPU-d99e7fe92c7bdf75"]


def test_monitor_wide_indexes_are_detect_wides() -> None:
    """The INDEX column of ``dm monitor -o wide`` names each card as ``dm detect -o wide`` does."""
    found = {}
    for command in ("detect", "monitor"):
        result = run("dm", command, "-o", "wide", "--simulate", "nvidia-h200x8")
        assert result.returncode == 0, result.stderr
        header, *rows = result.stdout.splitlines()
        assert header.split()[:2] == ["INDEX", "ID"]
        found[command] = [tuple(r.split()[:2]) for r in rows]
    assert found["monitor"] == found["detect"] and len(found["detect"]) == 8


def test_wide_with_nothing_found_says_so_on_stderr(tmp_path: Path) -> None:
    result = run(
        "dm", "detect", "-o", "wide", "--no-fast-failed", env={"GPUSTACK_HOST_ROOT": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and "No resources found." in result.stderr


SEED_AMD_SAMPLE = {
    "id": "GPU-5c88007d760374f3",
    "memory": 16368,
    "memoryUsage": 174,
    "memoryUtilization": 1,
    "coresUtilization": 0,
    "temperature": 44,
    "powerUsage": 8,
    "unhealthy": False,
}
"""The seed's ``device-manager monitor`` example (an idle RX 7800 XT)."""


def test_monitor_simulated_amd_matches_the_seed_sample(tmp_path: Path) -> None:
    """The packaged profile's snapshot is the seed's sample, figure for figure: read without its
    load pattern (which makes the packaged profile's figures move), every unit conversion shows."""
    packaged = resources.files(profiles.PACKAGED).joinpath("amd-rx7800xt-x2.yaml")
    document = yaml.safe_load(packaged.read_text())
    del document["amd"]["load"]
    still = tmp_path / "amd-still.yaml"
    still.write_text(yaml.safe_dump(document))
    result = run("dm", "monitor", "-o=json", f"--simulate={still}")
    assert result.returncode == 0, result.stderr
    (sample,) = json.loads(result.stdout)
    assert sample["manufacturer"] == "amd"
    assert sample["accelerators"][0] == SEED_AMD_SAMPLE
    assert "T" in sample["timestamp"] and "." in sample["timestamp"]
    # The packaged profile moves: the same card and fields, its figures within the pattern's.
    moving = run("dm", "monitor", "-o=json", "--simulate=amd-rx7800xt-x2")
    assert moving.returncode == 0, moving.stderr
    (busy, _) = json.loads(moving.stdout)[0]["accelerators"]
    assert set(busy) == set(SEED_AMD_SAMPLE) and busy["memory"] == SEED_AMD_SAMPLE["memory"]
    assert 38 <= busy["temperature"] <= 86 and 8 <= busy["powerUsage"] <= 263


def test_captured_amd_tree_is_read_as_real_hardware(tmp_path: Path) -> None:
    """GPUSTACK_HOST_ROOT points the real AMD path at a captured tree: no simulation mark."""
    sysfs.materialize(profiles.load("amd-rx7800xt-x2"), tmp_path)
    result = run("dm", "detect", env={"GPUSTACK_HOST_ROOT": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    (group,) = yaml.safe_load(result.stdout)
    assert "simulated" not in group
    assert group["id"] == "radeon-rx-7800-xt" and len(group["accelerators"]) == 2


def test_nvidia_cards_on_pci_without_a_driver_is_a_real_error(tmp_path: Path) -> None:
    """The real pynvml finds no libnvidia-ml here: with cards on PCI that must fail loudly."""
    sysfs.materialize(profiles.load("nvidia-h200x8"), tmp_path)
    result = run("dm", "detect", "-o", "json", env={"GPUSTACK_HOST_ROOT": str(tmp_path)})
    assert result.returncode == 1
    assert json.loads(result.stdout) == []
    errors = [line for line in result.stderr.splitlines() if line.startswith("E")]
    assert len(errors) == 1 and "nvidia" in errors[0] and "NVML" in errors[0]


def test_a_node_without_accelerators_prints_an_empty_list(tmp_path: Path) -> None:
    result = run("dm", "detect", env={"GPUSTACK_HOST_ROOT": str(tmp_path)})
    assert (result.returncode, result.stdout) == (0, "[]\n")


def test_fast_failed_detects_again_for_one_named_manufacturer(tmp_path: Path) -> None:
    env = {"GPUSTACK_HOST_ROOT": str(tmp_path)}
    held = run("dm", "detect", "--manufacturer=amd", env=env)
    assert held.returncode == 0 and held.stderr.count("detecting again") == 2
    fast = run("dm", "detect", "--manufacturer=amd", "--no-fast-failed", env=env)
    assert fast.returncode == 0 and "detecting again" not in fast.stderr


def test_manufacturer_filter(tmp_path: Path) -> None:
    result = run(
        "dm", "detect", "--manufacturer=amd", "--simulate", "nvidia-h200x8", "--no-fast-failed"
    )
    assert (result.returncode, result.stdout) == (0, "[]\n")


def test_unknown_manufacturer_is_a_usage_error() -> None:
    result = run("dm", "detect", "--manufacturer=intel")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "unknown manufacturer 'intel'" in result.stderr


def test_a_manufacturer_with_no_card_here_is_an_empty_list(tmp_path: Path) -> None:
    result = run(
        "dm",
        "detect",
        "--manufacturer=ascend",
        "--no-fast-failed",
        env={"GPUSTACK_HOST_ROOT": str(tmp_path)},
    )
    assert result.returncode == 0 and result.stdout == "[]\n"
    assert "not available" not in result.stderr


def test_bad_profile_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\nnvidia:\n  driverVersion: 1\n  cudaDriverVersion: 12080\n")
    result = run("dm", "detect", "--simulate", str(bad))
    assert result.returncode == 2 and result.stdout == ""
    assert "driverVersion" in result.stderr
    missing = run("dm", "detect", "--simulate", "no-such-profile")
    assert missing.returncode == 2 and "no profile 'no-such-profile'" in missing.stderr


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["wg", "--worker-conn-mode=loopback", "--kubeconfig=none"], "cannot be 'none'"),
        (
            [
                "worker-gateway",
                "--worker-conn-mode=loopback",
                "--worker-readiness-check-timeout=6m",
            ],
            "must not exceed --kube-conn-timeout (300s)",
        ),
        (
            ["wg", "--worker-conn-mode=loopback", "--worker-conn-gpustack-api-scheme=ftp"],
            "http or https",
        ),
        (["wg", "--worker-conn-mode=udp"], "--worker-conn-mode"),
        (["wg", "--worker-readiness-check-timeout=0.5s"], "timeout"),
        (
            ["wg", "--kubeconfig=none", "--bind-unix-path="],
            "--metrics-auth=review needs the Kubernetes API",
        ),
    ],
)
def test_the_gateway_refuses_bad_flags_in_one_line(argv: list[str], needle: str) -> None:
    result = run(*argv)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and result.stdout == ""
    assert "Traceback" not in result.stderr


def test_flags_from_the_environment_and_print_cmdline(tmp_path: Path) -> None:
    env = {
        "GPUSTACK_HOST_ROOT": str(tmp_path),
        "GPUSTACK_OUTPUT": "json",
        "GPUSTACK_NO_FAST_FAILED": "true",
    }
    result = run("dm", "detect", "--print-cmdline", "--manufacturer=nvidia", env=env)
    assert result.returncode == 0 and json.loads(result.stdout) == []
    assert (
        "gpustack-operator device-manager detect --manufacturer=nvidia "
        "--no-fast-failed=true --output=json"
    ) in result.stderr


def test_version_and_help() -> None:
    assert run("--version").stdout.startswith("gpustack-operator ")
    help_text = run("dm", "serve", "--help").stdout
    assert "--monitor-period" in help_text and "(default 15s)" in help_text
    assert "--kube-socket" in help_text and "GPUSTACK_KUBE_SOCKET" in help_text


def test_bad_flag_is_a_usage_error() -> None:
    result = run("dm", "detect", "--frobnicate")
    assert result.returncode == 2 and "unknown flag: --frobnicate" in result.stderr


def test_console_script_exits_with_mains_code_and_skips_the_exit_collection() -> None:
    """``console`` (the installed script) freezes the heap before exit, so the interpreter's
    last collection scans nothing; ``atexit`` handlers still run, and the exit code is main's."""
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('FROZEN', gc.get_freeze_count() > 0, file=sys.stderr))\n"
        "from gpustack_operator.main import console\n"
        "sys.argv = ['gpustack-operator', *sys.argv[1:]]\n"
        "console()\n"
    )
    for args, want in ((["--version"], 0), (["dm", "detect", "--frobnicate"], 2)):
        result = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == want, result.stderr
        assert "FROZEN True" in result.stderr


def test_console_script_collects_nothing_until_the_command_is_loaded() -> None:
    """Start-up runs without the collector; the command itself runs with it on and with what
    start-up made frozen out of its scans."""
    code = (
        "import atexit, gc, sys\n"
        "from gpustack_operator.main import console\n"
        "seen = []\n"
        "gc.callbacks.append(lambda phase, info: seen.append(gc.get_freeze_count()))\n"
        "atexit.register(lambda: print('GC', gc.isenabled(), min(seen, default=-1) > 0,\n"
        "                              file=sys.stderr))\n"
        "sys.argv = ['gpustack-operator', *sys.argv[1:]]\n"
        "console()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "dm", "detect", "--simulate", "nvidia-h200x8", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # Enabled at exit, and every collection (the command's own) ran with start-up frozen.
    assert "GC True True" in result.stderr


def test_main_calls_loaded_once_before_the_command_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpustack_operator import main as entry

    order: list[str] = []
    real = entry._load

    def load(target: str) -> Any:
        loaded = real(target)
        if not target.endswith(":detect_command"):
            return loaded

        def ran(settings: object) -> Any:
            order.append("ran")
            return loaded(settings)

        return ran

    monkeypatch.setattr(entry, "_load", load)
    argv = ["dm", "detect", "--simulate", "nvidia-h200x8", "-o", "json"]
    assert entry.main(argv, loaded=lambda: order.append("loaded")) == 0
    assert order == ["loaded", "ran"]


def test_detect_imports_none_of_the_service_stacks() -> None:
    code = (
        "import sys\n"
        "from gpustack_operator.main import main\n"
        "rc = main(['dm', 'detect', '--simulate', 'nvidia-h200x8', '-o', 'json'])\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stderr


def test_an_accelerator_whose_library_is_missing_is_one_clear_line(tmp_path: Path) -> None:
    device = tmp_path / "sys/devices/pci0000:00/0000:05:00.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x19e5\n")
    (device / "class").write_text("0x120000\n")
    links = tmp_path / "sys/bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:05:00.0").symlink_to("../../../devices/pci0000:00/0000:05:00.0")
    result = run("dm", "detect", env={"GPUSTACK_HOST_ROOT": str(tmp_path)})
    assert (result.returncode, result.stdout) == (1, "[]\n")
    (line,) = [line for line in result.stderr.splitlines() if "ascend" in line]
    assert "ascend: 1 ascend PCI device found but load DCMI (libdcmi.so) failed" in line
    assert "libdcmi.so" in line.split("failed:", 1)[1]


def test_json_logging_format_writes_one_object_per_stderr_line() -> None:
    result = run(
        "dm", "detect", "--simulate", "nvidia-h200x8", "--logging-format=json", "-v=2",
        "--print-cmdline", "-o", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == 1
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert any("simulating accelerators" in e["msg"] for e in entries)
    assert any("--logging-format=json" in e["msg"] for e in entries)
    for entry in entries:
        assert isinstance(entry["ts"], float) and abs(entry["ts"] - time.time()) < 600
        assert re.fullmatch(r"[\w.]+\.py:\d+", entry["caller"])
        assert entry["v"] == 0


def test_unknown_logging_format_is_a_usage_error() -> None:
    result = run("dm", "detect", "--logging-format=xml")
    assert result.returncode == 2 and "must be one of text, json" in result.stderr


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["mm", "pull", "a/b", "--cache-root=/tmp"], {"HF_ENDPOINT": "http://u:s3cret@hub:99999"}),
        (["mm", "manifest", "a/b", "--hf-endpoint=http://u:s3cret@[::1"], {}),
    ],
)
def test_a_refused_url_is_quoted_without_its_password(argv: list[str], env: dict[str, str]) -> None:
    result = run(*argv, env=env)
    assert result.returncode == 2, result.stderr
    assert "s3cret" not in result.stderr and "u:REDACTED@" in result.stderr, result.stderr


def test_output_name_prints_kind_slash_id_per_accelerator(tmp_path: Path) -> None:
    """As ``kubectl get -o name``: one ``kind/name`` per line; none: the line on stderr."""
    detect = run("dm", "detect", "-o", "name", "--simulate", "nvidia-h200x8")
    as_json = run("dm", "detect", "-o", "json", "--simulate", "nvidia-h200x8")
    assert detect.returncode == 0 and as_json.returncode == 0, detect.stderr
    ids = [a["id"] for g in json.loads(as_json.stdout) for a in g["accelerators"]]
    assert detect.stdout.splitlines() == [f"accelerator/{i}" for i in ids] and len(ids) == 8
    monitor = run("dm", "monitor", "-o", "name", "--simulate", "amd-rx7800xt-x2")
    assert monitor.stdout.splitlines() == [
        "accelerator/GPU-5c88007d760374f3", "accelerator/GPU-d99e7fe92c7bdf75"
    ]  # fmt: skip
    empty = run(
        "dm", "detect", "-o", "name", "--no-fast-failed", env={"GPUSTACK_HOST_ROOT": str(tmp_path)}
    )
    assert empty.returncode == 0 and empty.stdout == ""
    assert "No resources found." in empty.stderr
