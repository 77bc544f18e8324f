"""Whole passes for the seven other manufacturers against constructed host roots.

Their detection is not this module's subject, so the detected groups are hand-made and handed to
the pass in place of detection's; everything after it (reading the host root, planning, the
sweep, staging, judging, the document) is the real pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from preflight_hosts import FAKE_RUNTIME, HostRoot
from test_preflight_vendors import group

from agent.preflight import model, running
from agent.preflight.model import Detection
from agent.preflight.settings import PreflightSettings
from bus import devices


def detected(monkeypatch: pytest.MonkeyPatch, *groups: devices.DeviceGroup) -> None:
    def _detect(settings: PreflightSettings, host: Any) -> list[running._Pass]:
        return [
            running._Pass(g.manufacturer, [g], Detection(state="ok", accelerators=1))
            for g in groups
        ]

    monkeypatch.setattr(running, "_detect", _detect)


def settings(host: HostRoot, lib_source: Path, *manufacturers: str, **kw: Any) -> PreflightSettings:
    return PreflightSettings(
        manufacturers=manufacturers,
        host_root=str(host.root),
        lib_source=str(lib_source),
        hold_s=0,
        **kw,
    )


def docker_host(host: HostRoot) -> None:
    host.write(
        "/var/lib/kubelet/config.yaml", "containerRuntimeEndpoint: unix:///run/cri-dockerd.sock\n"
    )
    host.install("docker", FAKE_RUNTIME)


def test_injection_only_manufacturers_start_no_container(
    host: HostRoot, lib_source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker_host(host)
    detected(monkeypatch, group("iluvatar"), group("mthreads"))
    document = running.run(settings(host, lib_source, "iluvatar", "mthreads"))

    calls = host.calls()
    assert [c[1] for c in calls] == ["ps"]  # the sweep only: no probe runs for either
    assert model.exit_code(document) == 0
    for g in document.accelerators:
        assert {(r.state, r.depth) for r in g.checks} == {("ok", "simulated")}
        assert g.note.startswith(
            f"preflight judges {g.manufacturer} from the allocator's injection"
        )


def test_metax_reads_the_sgpu_registry_under_the_host_root(
    host: HostRoot, lib_source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.write("/sys/bus/pci/devices/0000:01:00.0/sgpu/create", "")
    detected(monkeypatch, group("metax"))
    document = running.run(settings(host, lib_source, "metax", dry_run=True))

    (g,) = document.accelerators
    sgpu = [r for r in g.checks if r.capability == "sgpu-mode"]
    assert [(r.state, r.depth) for r in sgpu] == [("ok", "declared")]
    assert (
        "driver step the device plugin takes (not preflight): metax-sgpu on METAX-0"
        in (g.staging[-1])
    )
    assert g.note.startswith("this is a dry run")


def test_an_old_ranktable_on_an_ascend_950_host_fails_the_pass(
    host: HostRoot, lib_source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.write("/etc/hccl_rootinfo.json", '{"version": "1.0"}')
    host.write("/usr/local/Ascend/Ascend-Docker-Runtime/version.info", "Version=26.0.1\n")
    detected(monkeypatch, group("ascend", family="950", runtime="9.0", physical=lambda i: (i,)))
    document = running.run(settings(host, lib_source, "ascend", dry_run=True))

    (g,) = document.accelerators
    states = {r.capability: (r.state, r.reason) for r in g.checks}
    assert states["ascend-docker-runtime"] == ("ok", "")
    assert states["hccl-ranktable"] == ("unavailable", "old-ranktable")
    assert model.exit_code(document) == model.EXIT_UNAVAILABLE
    order = [r.capability for r in g.checks]
    assert order.index("container-share") < order.index("ascend-docker-runtime")
    assert any(
        s.startswith("would write /var/lib/gpustack/operator/preflight/pods/") for s in g.staging
    )


def test_nerdctl_cannot_probe_ascend_so_its_probes_are_emitted(
    host: HostRoot, lib_source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.write(
        "/var/lib/kubelet/config.yaml",
        "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n",
    )
    host.install("nerdctl", FAKE_RUNTIME)
    detected(monkeypatch, group("ascend", family="910b", runtime="8.2", physical=lambda i: (i,)))
    document = running.run(settings(host, lib_source, "ascend"))

    assert [c[1:2] for c in host.calls()] == [["--address"]]  # the sweep only
    (g,) = document.accelerators
    assert g.note == "nerdctl cannot hand a container to the Ascend runtime; run it with docker"
    loaded = [r for r in g.checks if r.capability == "sliced-runtime-loaded"]
    assert [(r.state, r.depth) for r in loaded] == [("ok", "simulated")]


def test_detection_of_a_manufacturer_without_a_host_cli_is_not_cross_checked(
    host: HostRoot, lib_source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(running, "WITH_BACKEND", ("iluvatar", "metax"))
    probe = running.Host(settings(host, lib_source, "iluvatar"))
    found = running._detection("iluvatar", [group("iluvatar", cards=2)], None, probe, False)
    none = running._detection("metax", [], None, probe, False)

    assert (found.state, found.accelerators, found.host) == ("ok", 2, None)
    assert (none.state, none.host) == ("not-declared", None)
    assert host.calls() == []  # no vendor CLI was run through the host root
