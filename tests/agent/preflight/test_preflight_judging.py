"""Verdicts, injections and staging as pure functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.preflight import checking, invocations, judging, staging
from agent.preflight.checking import Probe, Result
from agent.preflight.injection import DeviceNode, Injection, Mount
from agent.preflight.kubeletconfig import Choice

LIB = "/usr/local/vgpu/libvgpu.so"
SLICED = Injection(
    envs={"NVIDIA_VISIBLE_DEVICES": "GPU-1", "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m"},
    mounts=(
        Mount(LIB, "/var/lib/gpustack/operator/lib/nvidia/cuda-12/libvgpu.so", True),
        Mount("/etc/ld.so.preload", "/var/lib/gpustack/operator/lib/nvidia/ld.so.preload", True),
        Mount("/tmp/vgpulock", "/tmp/vgpulock", False),
    ),
)
NVIDIA = checking.VENDORS["nvidia"]


def output(maps: list[str], reader: list[str] | None = None) -> str:
    lines = [
        "Unable to find image locally",
        "gpustack-preflight-maps-begin",
        *maps,
        "gpustack-preflight-maps-end",
    ]
    if reader is not None:
        lines += ["gpustack-preflight-reader-begin", *reader, "gpustack-preflight-reader-end"]
    return "\n".join(lines) + "\n"


def probe(kind: checking.ProbeKind = "sliced", injection: Injection = SLICED) -> Probe:
    return Probe("GPU-1", kind, injection, ("chroot", "/host", "docker", "run"))


def test_the_mapping_line_is_the_verdict_not_a_greeting() -> None:
    greeting = output([f"libvgpu: loaded {LIB}"], ["4096"])
    loaded, quota = judging.judge(NVIDIA, probe(), [Result(0, greeting)])
    assert (loaded.state, loaded.depth, loaded.reason) == (
        "unavailable",
        "measured",
        "library-not-mapped",
    )
    mapped = output([f"7f00-7f10 r-xp 00000000 fc:00 42 {LIB}"], ["4096"])
    loaded, quota = judging.judge(NVIDIA, probe(), [Result(0, mapped)])
    assert (loaded.state, loaded.depth) == ("ok", "measured") and LIB in loaded.evidence
    assert (quota.state, quota.depth) == ("ok", "measured")


@pytest.mark.parametrize(
    ("reader", "expected"),
    [
        (["81559"], ("unavailable", "measured")),
        ([], ("ok", "simulated")),
        (None, ("ok", "simulated")),
    ],
)
def test_quota_is_measured_only_where_the_reader_reports(
    reader: list[str] | None, expected: tuple[str, str]
) -> None:
    result = Result(0, output([f"7f00-7f10 r-xp 00000000 fc:00 42 {LIB}"], reader))
    quota = judging.judge(NVIDIA, probe(), [result])[1]
    assert (quota.state, quota.depth) == expected


def test_a_probe_that_fails_is_unavailable_and_not_measured() -> None:
    loaded, quota = judging.judge(NVIDIA, probe(), [Result(125, "docker: unknown runtime nvidia")])
    assert (loaded.state, loaded.depth, loaded.reason) == (
        "unavailable",
        "simulated",
        "probe-failed",
    )
    assert "unknown runtime" in loaded.evidence and quota.reason == "probe-failed"


def test_not_run_rows_are_simulated_without_evidence_unless_blocked() -> None:
    rows = judging.judge(NVIDIA, probe(), None, why="this is a dry run")
    assert {(r.state, r.depth, r.evidence) for r in rows} == {("ok", "simulated", "")}
    rows = judging.judge(NVIDIA, probe(), None, why="locked", blocked="preflight-locked")
    assert {(r.state, r.reason) for r in rows} == {("unavailable", "preflight-locked")}


def test_an_injection_without_library_or_cap_is_unavailable_even_when_emitted() -> None:
    bare = Injection(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-1"})
    rows = judging.judge(NVIDIA, probe(injection=bare), None, why="this is a dry run")
    assert [(r.state, r.reason) for r in rows] == [
        ("unavailable", "no-preload-library"),
        ("unavailable", "no-cap"),
    ]


def test_co_tenancy_needs_both_probes_sliced() -> None:
    good = Result(0, output([f"7f00-7f10 r-xp 00000000 fc:00 42 {LIB}"]))
    [row] = judging.judge(NVIDIA, probe("pair"), [good, good])
    assert (row.state, row.depth) == ("ok", "measured")
    [row] = judging.judge(NVIDIA, probe("pair"), [good, Result(1, "CUDA error: out of memory")])
    assert (row.state, row.reason) == ("unavailable", "co-tenant-failed")
    assert "out of memory" in row.evidence


def test_probe_flags_are_sorted_labelled_and_never_privileged() -> None:
    injection = Injection(
        envs={"B": "2", "A": "1"},
        mounts=(Mount("/z", "/hz", True), Mount("/a", "/ha", False)),
        devices=(
            DeviceNode("/dev/kfd", "/dev/kfd", "rw"),
            DeviceNode("/dev/dri/card1", "/dev/dri/card1", "rw"),
        ),
    )
    prefix = invocations.cli_prefix("/usr/sbin/chroot", "/host", Choice("docker"))
    argv = invocations.run_argv(prefix, "amd", injection, "ubuntu:24.04", "true")
    assert argv == [
        "/usr/sbin/chroot",
        "/host",
        "docker",
        "run",
        "--rm",
        "--label",
        "gpustack.ai/preflight=true",
        "-e",
        "A=1",
        "-e",
        "B=2",
        "-v",
        "/ha:/a",
        "-v",
        "/hz:/z:ro",
        "--device",
        "/dev/dri/card1:/dev/dri/card1:rw",
        "--device",
        "/dev/kfd:/dev/kfd:rw",
        "ubuntu:24.04",
        "sh",
        "-c",
        "true",
    ]


def test_staging_names_what_the_image_lacks(tmp_path: Path) -> None:
    (tmp_path / "nvidia/cuda-13").mkdir(parents=True)
    (tmp_path / "nvidia/cuda-13/libvgpu.so").write_bytes(b"x")
    steps, missing = staging.plan_staging("nvidia", [SLICED], str(tmp_path))
    assert missing == [
        "/var/lib/gpustack/operator/lib/nvidia/ld.so.preload",
        "/var/lib/gpustack/operator/lib/nvidia/cuda-12/libvgpu.so",
    ]
    assert [s.describe() for s in steps] == [
        (
            f"copy {tmp_path}/nvidia/cuda-13/libvgpu.so to "
            "/var/lib/gpustack/operator/lib/nvidia/cuda-13/libvgpu.so"
        ),
        "create directory /tmp/vgpulock",
    ]


def test_a_toggled_driver_mode_is_restored_either_way() -> None:
    mode = [False]
    writes: list[bool] = []

    def write(value: bool) -> None:
        writes.append(value)
        mode[0] = value

    with pytest.raises(RuntimeError), staging.driver_mode(lambda: mode[0], write):
        assert mode[0]
        raise RuntimeError("probe crashed")
    assert mode == [False] and writes == [True, False]
    mode[0] = True
    with staging.driver_mode(lambda: mode[0], write) as before:
        assert before
    assert writes == [True, False]
