"""Whole passes against constructed host roots, entered with a real chroot, with fake runtimes."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from preflight_hosts import BINDS, FAKE_NVIDIA_SMI, FAKE_RUNTIME, HostRoot

from agent.deviceplugin import responders
from agent.preflight import model, running
from agent.preflight.injection import WORK_DIR
from agent.preflight.settings import PreflightSettings
from gpustack_operator import main as launcher

CARD0 = "GPU-6f1c2b9e-3a47-5d81-9c0e-1b2a3c4d5e60"


def settings(host: HostRoot, lib_source: Path, **kw: Any) -> PreflightSettings:
    base: dict[str, Any] = {
        "manufacturers": ("nvidia",),
        "host_root": str(host.root),
        "simulate": "nvidia-h200x8",
        "lib_source": str(lib_source),
        "hold_s": 0,
    }
    base.update(kw)
    return PreflightSettings(**base)


def docker_host(host: HostRoot) -> None:
    host.write(
        "/var/lib/kubelet/config.yaml", "containerRuntimeEndpoint: unix:///run/cri-dockerd.sock\n"
    )
    host.install("docker", FAKE_RUNTIME)
    host.install("nvidia-smi", FAKE_NVIDIA_SMI)


def rows(document: model.Document, capability: str) -> list[model.Row]:
    return [r for g in document.accelerators for r in g.checks if r.capability == capability]


def tree_digest(root: Path) -> str:
    """Every path, mode, link target and byte under ``root``, skipping the bind mounts."""
    digest = hashlib.sha256()
    skip = {str(root / rel) for rel in BINDS}
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if os.path.join(directory, d) not in skip)
        for name in sorted(dirs + files):
            path = os.path.join(directory, name)
            st = os.lstat(path)
            digest.update(f"{os.path.relpath(path, root)} {st.st_mode}\n".encode())
            if os.path.islink(path):
                digest.update(os.readlink(path).encode())
            elif os.path.isfile(path):
                digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def test_a_docker_node_is_measured_with_exactly_the_injection(
    host: HostRoot, lib_source: Path
) -> None:
    docker_host(host)
    document = running.run(settings(host, lib_source))
    assert model.exit_code(document) == 0
    calls = host.calls()
    prefix = ["docker"]
    assert calls[0] == [*prefix, "ps", "-a", "-q", "--filter", "label=gpustack.ai/preflight=true"]
    runs = [c for c in calls if c[1] == "run"]
    assert len(runs) == 8 * 3  # per card: one sliced probe and a co-tenant pair
    # the plugin's per-allocation work directory, rooted in preflight's scratch
    first = f"nvidia.com/gpu.sliced/nvidia-h200:{CARD0}:0000"
    vgpu = responders.work_dir(WORK_DIR, first) + "/tmp/vgpu"
    assert vgpu.startswith("/var/lib/gpustack/operator/preflight/pods/")
    assert runs[0] == [
        "docker",
        "run",
        "--rm",
        "--runtime",
        "nvidia",
        "--label",
        "gpustack.ai/preflight=true",
        "-e",
        "CUDA_DEVICE_MEMORY_LIMIT_0=71885m",
        "-e",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/cudevshr.cache",
        "-e",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "-e",
        "CUDA_DEVICE_SM_LIMIT=50",
        "-e",
        "LIBCUDA_LOG_LEVEL=0",
        "-e",
        f"NVIDIA_VISIBLE_DEVICES={CARD0}",
        "-v",
        "/dev/shm:/dev/shm",
        "-v",
        "/var/lib/gpustack/operator/lib/nvidia/ld.so.preload:/etc/ld.so.preload:ro",
        "-v",
        f"{vgpu}:/tmp/vgpu",
        "-v",
        "/tmp/vgpulock:/tmp/vgpulock",
        "-v",
        "/var/lib/gpustack/operator/lib/nvidia/cuda-12/libvgpu.so:/usr/local/vgpu/libvgpu.so:ro",
        "nvidia/cuda:12.8.0-base-ubuntu24.04",
        "sh",
        "-c",
        (
            "echo gpustack-preflight-maps-begin; cat /proc/self/maps; echo gpustack-preflight-maps-end;"
            " echo gpustack-preflight-reader-begin;"
            " nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>&1;"
            " echo gpustack-preflight-reader-end"
        ),
    ]
    assert not any("--privileged" in c for c in calls)
    loaded = rows(document, "sliced-runtime-loaded")
    assert {(r.state, r.depth) for r in loaded} == {("ok", "measured")}
    assert "/usr/local/vgpu/libvgpu.so" in loaded[0].evidence
    assert loaded[0].evidence.startswith("gpustack-preflight-maps-begin\n")
    assert loaded[0].command.startswith(f"/usr/sbin/chroot {host.root} docker run --rm")
    quota = rows(document, "sliced-quota-in-force")
    assert {(r.state, r.depth) for r in quota} == {("ok", "measured")}
    assert {(r.state, r.depth) for r in rows(document, "co-tenancy")} == {("ok", "measured")}
    assert {(r.state, r.depth) for r in rows(document, "sidecar-visibility")} == {
        ("ok", "simulated")
    }
    assert {r.state for r in rows(document, "mig-partitioning")} == {"not-declared"}
    group = document.accelerators[0]
    assert group.detection.state == "ok" and group.detection.accelerators == 8
    assert group.detection.host is not None and group.detection.host.accelerators == 8
    staged = host.root / "var/lib/gpustack/operator/lib/nvidia/cuda-12/libvgpu.so"
    assert staged.read_bytes() == (lib_source / "nvidia/cuda-12/libvgpu.so").read_bytes()
    assert (host.root / "tmp/vgpulock").is_dir()
    scratch = host.root / "var/lib/gpustack/operator/preflight"
    assert sorted(os.listdir(scratch)) == ["lock"]


def test_dry_run_changes_no_byte_and_starts_nothing(host: HostRoot, lib_source: Path) -> None:
    docker_host(host)
    before = tree_digest(host.root)
    document = running.run(settings(host, lib_source, dry_run=True))
    assert tree_digest(host.root) == before
    assert host.calls() == []
    assert model.exit_code(document) == 0
    probed = rows(document, "sliced-runtime-loaded") + rows(document, "co-tenancy")
    assert {(r.state, r.depth, r.evidence) for r in probed} == {("ok", "simulated", "")}
    assert all(
        r.command.startswith("/usr/sbin/chroot ") and " run --rm " in r.command for r in probed
    )
    staging = document.accelerators[0].staging
    assert "would copy" in staging[0]
    assert any(
        s.endswith("/var/lib/gpustack/operator/lib/nvidia/cuda-12/libvgpu.so") for s in staging
    )
    assert "dry run" in document.accelerators[0].note


def test_a_library_missing_from_maps_is_unavailable_and_fails_the_run(
    host: HostRoot, lib_source: Path
) -> None:
    docker_host(host)
    host.fake("mode", "nolib\n")
    document = running.run(settings(host, lib_source))
    loaded = rows(document, "sliced-runtime-loaded")
    assert {(r.state, r.depth, r.reason) for r in loaded} == {
        ("unavailable", "measured", "library-not-mapped")
    }
    assert {r.state for r in rows(document, "co-tenancy")} == {"unavailable"}
    assert model.exit_code(document) == 1


def test_a_reader_showing_the_whole_card_means_no_cap(host: HostRoot, lib_source: Path) -> None:
    docker_host(host)
    host.fake("mode", "nocap\n")
    quota = rows(running.run(settings(host, lib_source)), "sliced-quota-in-force")
    assert {(r.state, r.depth, r.reason) for r in quota} == {
        ("unavailable", "measured", "cap-not-in-force")
    }


def test_a_silent_reader_leaves_the_quota_simulated(host: HostRoot, lib_source: Path) -> None:
    docker_host(host)
    host.fake("mode", "silent\n")
    quota = rows(running.run(settings(host, lib_source)), "sliced-quota-in-force")
    assert {(r.state, r.depth, r.evidence) for r in quota} == {("ok", "simulated", "")}


def test_stale_containers_are_swept_before_probing(host: HostRoot, lib_source: Path) -> None:
    docker_host(host)
    host.fake("ps-ids", "abc123\ndef456\n")
    running.run(settings(host, lib_source))
    calls = host.calls()
    assert calls[1] == ["docker", "rm", "-f", "abc123", "def456"]
    assert calls[2][1] == "run"


@pytest.mark.parametrize("failing", ["ps-fail", "rm-fail"])
def test_a_failed_sweep_makes_rows_unavailable(
    host: HostRoot, lib_source: Path, failing: str
) -> None:
    docker_host(host)
    host.fake("ps-ids", "abc123\n")
    host.fake(failing)
    document = running.run(settings(host, lib_source))
    assert not [c for c in host.calls() if c[1] == "run"]
    sweep = rows(document, "stale-container-sweep")
    assert len(sweep) == 8 and {r.state for r in sweep} == {"unavailable"}
    assert {r.reason for r in rows(document, "sliced-runtime-loaded")} == {"stale-container-sweep"}
    assert model.exit_code(document) == 1


def test_a_second_concurrent_run_reports_every_row_unavailable(
    host: HostRoot, lib_source: Path
) -> None:
    docker_host(host)
    lock = host.root / "var/lib/gpustack/operator/preflight/lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        document = running.run(settings(host, lib_source))
    assert host.calls() == []
    checks = document.accelerators[0].checks
    assert checks and {(r.state, r.reason) for r in checks} == {("unavailable", "preflight-locked")}
    assert model.exit_code(document) == 1


def test_a_containerd_node_is_driven_with_nerdctl(host: HostRoot, lib_source: Path) -> None:
    host.write(
        "/var/lib/kubelet/kubeadm-flags.env",
        'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock '
        '--pod-infra-container-image=registry.k8s.io/pause:3.10"\n',
    )
    host.install("nerdctl", FAKE_RUNTIME)
    host.install("nvidia-smi", FAKE_NVIDIA_SMI)
    document = running.run(settings(host, lib_source))
    assert document.runtime.name == "nerdctl" and document.runtime.driven
    ns = [
        "nerdctl",
        "--address",
        "/run/containerd/containerd.sock",
        "--namespace",
        "gpustack-preflight",
    ]
    calls = host.calls()
    assert calls[0][:5] == ns and calls[0][5] == "ps"
    run = next(c for c in calls if "run" in c)
    assert run[:9] == [*ns, "run", "--rm", "--gpus", "all"]
    assert model.exit_code(document) == 0


def test_conflicting_distribution_dropins_stop_driving(host: HostRoot, lib_source: Path) -> None:
    for distro, sock in (
        ("k3s", "/run/k3s/containerd/containerd.sock"),
        ("rke2", "/run/other.sock"),
    ):
        host.write(
            f"/var/lib/rancher/{distro}/agent/etc/kubelet.conf.d/00-defaults.conf",
            f"containerRuntimeEndpoint: unix://{sock}\n",
        )
    host.install("docker", FAKE_RUNTIME)
    host.install("nvidia-smi", FAKE_NVIDIA_SMI)
    before = tree_digest(host.root)
    document = running.run(settings(host, lib_source))
    assert host.calls() == [] and tree_digest(host.root) == before
    assert not document.runtime.driven
    assert "k3s" in document.runtime.note and "rke2" in document.runtime.note
    loaded = rows(document, "sliced-runtime-loaded")
    assert {(r.state, r.depth) for r in loaded} == {("ok", "simulated")}
    assert model.exit_code(document) == 0


def test_no_kubelet_and_no_runtime_emits_the_steps(host: HostRoot, lib_source: Path) -> None:
    document = running.run(settings(host, lib_source))
    assert not document.runtime.driven
    assert "none of docker, nerdctl, ctr" in document.runtime.note
    assert document.topology.policy == "unknown"
    host_check = document.accelerators[0].detection.host
    assert host_check is not None and host_check.accelerators is None
    assert host_check.reason == "exit 127"


def test_no_kubelet_probes_the_host_path_and_never_drives_ctr(
    host: HostRoot, lib_source: Path
) -> None:
    host.install("ctr", FAKE_RUNTIME)
    document = running.run(settings(host, lib_source))
    assert document.runtime.name == "nerdctl" and not document.runtime.driven
    assert "ctr is never driven" in document.runtime.note
    assert host.calls() == []
    command = rows(document, "sliced-runtime-loaded")[0].command
    assert (
        " nerdctl --address /run/containerd/containerd.sock --namespace gpustack-preflight run"
        in command
    )


def test_a_running_kubelet_wins_and_names_the_topology_policy(
    host: HostRoot, lib_source: Path
) -> None:
    docker_host(host)
    host.write("/etc/kubernetes/kubelet.yaml", "topologyManagerPolicy: best-effort\n")
    host.write(
        "/etc/kubernetes/kubelet.conf.d/50-policy.conf", "topologyManagerPolicy: single-numa-node\n"
    )
    host.kubelet(
        4242,
        "/usr/bin/kubelet",
        "--config=/etc/kubernetes/kubelet.yaml",
        "--config-dir",
        "/etc/kubernetes/kubelet.conf.d",
        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
    )
    document = running.run(settings(host, lib_source, dry_run=True))
    assert document.runtime.source == "kubelet command line (/proc)"
    assert document.runtime.name == "nerdctl" and not document.runtime.driven
    assert document.topology.policy == "single-numa-node"


def test_host_network_is_told_from_the_hosts_pid_one(host: HostRoot, lib_source: Path) -> None:
    docker_host(host)
    (host.root / "proc/1/ns").mkdir(parents=True)
    (host.root / "proc/1/ns/net").symlink_to(os.readlink("/proc/self/ns/net"))
    document = running.run(settings(host, lib_source, dry_run=True))
    assert document.runtime.host_network is True and "network" not in document.runtime.note
    os.unlink(host.root / "proc/1/ns/net")
    (host.root / "proc/1/ns/net").symlink_to("net:[1]")
    document = running.run(settings(host, lib_source, dry_run=True))
    assert document.runtime.host_network is False and "--network=host" in document.runtime.note


def test_the_host_cli_disagreeing_on_real_hardware_fails_detection(
    host: HostRoot, lib_source: Path
) -> None:
    docker_host(host)
    document = running.run(settings(host, lib_source, simulate=None, dry_run=True))
    group = document.accelerators[0]
    assert group.detection.state == "unavailable" and group.detection.reason == "host-disagrees"
    assert group.checks == ()


def test_an_amd_node_probes_the_vrocm_injection_and_sees_it_loaded(
    host: HostRoot, lib_source: Path
) -> None:
    docker_host(host)
    document = running.run(
        settings(host, lib_source, manufacturers=("amd",), simulate="amd-rx7800xt-x2")
    )
    runs = [c for c in host.calls() if c[1] == "run"]
    assert len(runs) == 2  # one sliced probe per card; AMD has no co-tenancy probe
    run = runs[0]
    flags = [(a, run[i + 1]) for i, a in enumerate(run) if a in ("-e", "-v", "--device")]
    assert flags == [
        ("-e", "AMD_VISIBLE_DEVICES=none"),
        ("-e", "HSA_CU_MASK=0:0-29"),  # half of 128 slices of 60 CUs, from the first
        ("-e", "LIBVROCM_LOG_LEVEL=1"),
        ("-e", "ROCR_VISIBLE_DEVICES=GPU-5c88007d760374f3"),
        ("-e", f"VROCM_DEVICE_MEMORY_LIMIT_0={16368 // 2}"),
        ("-v", "/var/lib/gpustack/operator/lib/amd/ld.so.preload:/etc/ld.so.preload:ro"),
        (
            "-v",
            "/var/lib/gpustack/operator/lib/amd/libvrocm.so:/usr/local/vrocm/libvrocm.so:ro",
        ),
        ("--device", "/dev/dri/card1:/dev/dri/card1:rw"),
        ("--device", "/dev/dri/renderD128:/dev/dri/renderD128:rw"),
        ("--device", "/dev/kfd:/dev/kfd:rw"),
    ]
    assert "--runtime" not in run and "--privileged" not in run and "ubuntu:24.04" in run
    assert {r.state for r in rows(document, "cu-mask-topology")} == {"ok"}
    loaded = rows(document, "sliced-runtime-loaded")
    assert {(r.state, r.depth) for r in loaded} == {("ok", "measured")}
    assert "/usr/local/vrocm/libvrocm.so" in loaded[0].evidence
    # no in-container reader for AMD yet: the cap is set, nothing read it back
    quota = rows(document, "sliced-quota-in-force")
    assert {(r.state, r.depth) for r in quota} == {("ok", "simulated")}
    staged = host.root / "var/lib/gpustack/operator/lib/amd/libvrocm.so"
    assert staged.read_bytes() == (lib_source / "amd/libvrocm.so").read_bytes()
    assert model.exit_code(document) == 0


def test_an_image_without_the_amd_slicing_runtime_names_it_and_runs_nothing(
    host: HostRoot, lib_source: Path
) -> None:
    docker_host(host)
    (lib_source / "amd/libvrocm.so").unlink()
    document = running.run(
        settings(host, lib_source, manufacturers=("amd",), simulate="amd-rx7800xt-x2")
    )
    assert not [c for c in host.calls() if c[1] == "run"]
    loaded = rows(document, "sliced-runtime-loaded")
    assert {(r.state, r.depth) for r in loaded} == {("ok", "simulated")}
    assert all("this image carries no" in r.detail for r in loaded)
    assert all("/var/lib/gpustack/operator/lib/amd/libvrocm.so" in r.detail for r in loaded)


def test_the_command_prints_json_and_reports_every_manufacturer(
    host: HostRoot,
    lib_source: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docker_host(host)
    monkeypatch.setenv("GPUSTACK_PREFLIGHT_LIB_SOURCE", str(lib_source))
    argv = ["dm", "preflight", "--manufacturer=nvidia,ascend", "--dry-run", "-o", "json",
            f"--host-root={host.root}", "--simulate=nvidia-h100x8-mig"]  # fmt: skip
    assert launcher.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    groups = {g["manufacturer"]: g for g in printed["accelerators"]}
    assert groups["ascend"]["detection"]["state"] == "not-declared"  # detected: none here
    mig = [r for r in groups["nvidia"]["checks"] if r["capability"] == "mig-partitioning"]
    assert [r["state"] for r in mig] == ["ok"] * 4 + ["not-declared"] * 4
    assert printed["topology"]["policy"] == "none"


def test_a_host_root_that_cannot_be_listed_is_reported_not_raised(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # one component over NAME_MAX (255): sysfs under it cannot be listed (ENAMETOOLONG), nor
    # chrooted; a whole path over 4096 characters is refused as a flag value (exit 2)
    too_long = "/" + "x" * 300
    argv = ["dm", "preflight", "--manufacturer=nvidia", "--dry-run", "-o", "json",
            f"--host-root={too_long}"]  # fmt: skip
    assert launcher.main(argv) == 0  # the exit code counts capability rows; none was checked
    (group,) = json.loads(capsys.readouterr().out)["accelerators"]
    assert group["detection"]["state"] == "unavailable"
    assert "File name too long" in group["detection"]["detail"]


def test_bad_input_is_refused_with_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert launcher.main(["dm", "preflight", "--manufacturer=nvidai"]) == 2
    assert launcher.main(["dm", "preflight", "extra"]) == 2
    assert launcher.main(["dm", "preflight", "--manufacturer=nvidia", "--simulate=no-such"]) == 2
    assert capsys.readouterr().out == ""
