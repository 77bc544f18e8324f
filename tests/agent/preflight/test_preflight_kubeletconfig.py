"""Runtime resolution and the topology policy, from files under a host root (no chroot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.preflight import kubeletconfig


def write(root: Path, host_path: str, text: str) -> None:
    path = root / host_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def resolve(root: Path, present: set[str], override: str = "") -> kubeletconfig.Choice:
    srcs, _ = kubeletconfig.kubelet_sources(kubeletconfig.HostFiles(str(root)))
    return kubeletconfig.choose(srcs, override, present.__contains__, lambda s: False)


DOCKER = "containerRuntimeEndpoint: unix:///var/run/cri-dockerd.sock\n"
CONTAINERD = "containerRuntimeEndpoint: unix:///run/k3s/containerd/containerd.sock\n"


def test_kubeadm_flags_win_over_the_config_file(tmp_path: Path) -> None:
    write(tmp_path, "/var/lib/kubelet/config.yaml", DOCKER)
    write(
        tmp_path,
        "/var/lib/kubelet/kubeadm-flags.env",
        'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock"\n',
    )
    choice = resolve(tmp_path, {"docker", "nerdctl"})
    assert (choice.dialect, choice.driven, choice.address) == (
        "nerdctl",
        True,
        "/run/containerd/containerd.sock",
    )
    assert choice.source == "/var/lib/kubelet/kubeadm-flags.env"


def test_the_config_file_alone_names_docker(tmp_path: Path) -> None:
    write(tmp_path, "/var/lib/kubelet/config.yaml", DOCKER)
    choice = resolve(tmp_path, {"docker", "nerdctl"})
    assert (choice.dialect, choice.driven, choice.endpoint) == (
        "docker",
        True,
        "unix:///var/run/cri-dockerd.sock",
    )


def test_the_running_kubelet_flag_beats_its_dropins_which_beat_its_config(tmp_path: Path) -> None:
    write(tmp_path, "/etc/kubelet.yaml", DOCKER + "topologyManagerPolicy: restricted\n")
    write(tmp_path, "/etc/kubelet.d/10.conf", CONTAINERD)
    write(
        tmp_path,
        "/proc/77/cmdline",
        "kubelet\0--config\0/etc/kubelet.yaml\0--config-dir=/etc/kubelet.d\0",
    )
    srcs, visible = kubeletconfig.kubelet_sources(kubeletconfig.HostFiles(str(tmp_path)))
    assert visible and srcs[0].values["containerRuntimeEndpoint"].endswith(
        "/k3s/containerd/containerd.sock"
    )
    assert kubeletconfig.topology_policy(srcs, visible)[0] == "restricted"
    write(
        tmp_path,
        "/proc/77/cmdline",
        "/usr/bin/kubelet\0--config=/etc/kubelet.yaml\0--config-dir=/etc/kubelet.d\0"
        "--container-runtime-endpoint\0unix:///run/crio/crio.sock\0",
    )
    choice = resolve(tmp_path, {"docker", "nerdctl"})
    assert not choice.driven and "crio.sock" in choice.why_not


def test_rancher_dropins_in_one_directory_are_merged(tmp_path: Path) -> None:
    base = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d"
    write(tmp_path, f"{base}/00-defaults.conf", DOCKER)
    write(tmp_path, f"{base}/10-override.conf", CONTAINERD)
    choice = resolve(tmp_path, {"nerdctl"})
    assert choice.driven and choice.address == "/run/k3s/containerd/containerd.sock"


def test_rancher_directories_that_disagree_stop_driving(tmp_path: Path) -> None:
    write(tmp_path, "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/a.conf", CONTAINERD)
    write(tmp_path, "/var/lib/rancher/rke2/agent/etc/kubelet.conf.d/a.conf", DOCKER)
    choice = resolve(tmp_path, {"docker", "nerdctl"})
    assert not choice.driven
    assert "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d names" in choice.why_not
    assert "/var/lib/rancher/rke2/agent/etc/kubelet.conf.d names" in choice.why_not
    assert resolve(tmp_path, {"docker"}, override="docker").driven


def test_an_earlier_source_wins_over_a_conflicting_glob(tmp_path: Path) -> None:
    write(tmp_path, "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/a.conf", CONTAINERD)
    write(tmp_path, "/var/lib/rancher/rke2/agent/etc/kubelet.conf.d/a.conf", DOCKER)
    write(tmp_path, "/var/lib/kubelet/config.yaml", DOCKER)
    assert resolve(tmp_path, {"docker"}).driven


@pytest.mark.parametrize(
    ("present", "dialect", "driven"),
    [
        ({"docker", "nerdctl", "ctr"}, "docker", True),
        ({"nerdctl", "ctr"}, "nerdctl", True),
        ({"ctr"}, "nerdctl", False),
        (set(), "docker", False),
    ],
)
def test_nothing_named_probes_docker_nerdctl_ctr_in_order(
    tmp_path: Path, present: set[str], dialect: str, driven: bool
) -> None:
    choice = resolve(tmp_path, present)
    assert (choice.dialect, choice.driven) == (dialect, driven)


def test_containerd_without_nerdctl_is_emitted_never_driven_with_ctr(tmp_path: Path) -> None:
    write(tmp_path, "/var/lib/kubelet/config.yaml", CONTAINERD)
    choice = resolve(tmp_path, {"ctr", "docker"})
    assert (choice.dialect, choice.driven) == ("nerdctl", False)
    assert "ctr is never driven" in choice.why_not


def test_an_override_the_host_lacks_is_emitted(tmp_path: Path) -> None:
    choice = resolve(tmp_path, {"docker"}, override="nerdctl")
    assert not choice.driven and choice.why_not == "nerdctl is not on the host"
    assert not resolve(tmp_path, {"ctr"}, override="ctr").driven


def test_malformed_files_cost_only_their_source(tmp_path: Path) -> None:
    write(tmp_path, "/var/lib/kubelet/config.yaml", "containerRuntimeEndpoint: [unclosed\n")
    write(tmp_path, "/var/lib/kubelet/kubeadm-flags.env", 'KUBELET_KUBEADM_ARGS="--unbalanced\n')
    srcs, _ = kubeletconfig.kubelet_sources(kubeletconfig.HostFiles(str(tmp_path)))
    assert any("does not parse" in n for s in srcs for n in s.notes)
    assert any("unbalanced" in n for s in srcs for n in s.notes)
    assert resolve(tmp_path, {"docker"}).driven


def test_topology_policy_default_and_unknown(tmp_path: Path) -> None:
    host = kubeletconfig.HostFiles(str(tmp_path))
    srcs, visible = kubeletconfig.kubelet_sources(host)
    policy, _, note = kubeletconfig.topology_policy(srcs, visible)
    assert policy == "unknown" and "process table is not visible" in note
    write(tmp_path, "/var/lib/kubelet/config.yaml", DOCKER)
    srcs, visible = kubeletconfig.kubelet_sources(host)
    assert kubeletconfig.topology_policy(srcs, visible)[0] == "none"
    write(tmp_path, "/var/lib/kubelet/config.yaml", "topologyManagerPolicy: sideways\n")
    srcs, visible = kubeletconfig.kubelet_sources(host)
    assert kubeletconfig.topology_policy(srcs, visible)[0] == "unknown"
