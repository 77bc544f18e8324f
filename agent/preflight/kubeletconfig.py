"""Which container runtime starts this node's containers, read from the kubelet's own settings.

Pure reads of the host root, then a pure choice:

1. the running kubelet's command line in the host's ``/proc`` (``--container-runtime-endpoint``
   overrides ``--config-dir`` drop-ins, which override ``--config``);
2. ``var/lib/kubelet/kubeadm-flags.env``; 3. ``var/lib/kubelet/config.yaml``;
4. ``var/lib/rancher/*/agent/etc/kubelet.conf.d/*.conf`` (one merged value per directory).

The first source that names an endpoint wins. Directories of the one glob that name different
endpoints are a conflict: nothing is driven and the steps name it. The topology-manager policy is
read from the same sources in the same order.
"""

from __future__ import annotations

import glob
import os
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import yaml

NAMESPACE = "gpustack-preflight"
CONTAINERD_SOCKETS = (
    "/run/containerd/containerd.sock",
    "/run/k3s/containerd/containerd.sock",
    "/var/run/containerd/containerd.sock",
)
_ENDPOINT = "containerRuntimeEndpoint"
_POLICY = "topologyManagerPolicy"
_KEYS = {
    "container-runtime-endpoint": "containerRuntimeEndpoint",
    "topology-manager-policy": "topologyManagerPolicy",
}


@dataclass(frozen=True)
class Source:
    """What one place on the host says about the kubelet."""

    name: str
    values: dict[str, str] = field(default_factory=dict)
    """camelCase KubeletConfiguration keys found (``containerRuntimeEndpoint`` …)."""
    conflict: str = ""
    """Non-empty when directories of one glob disagree on the endpoint."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Choice:
    """The runtime to drive, or why the steps are only emitted (``why_not`` non-empty)."""

    dialect: str
    """The CLI the steps are written for: ``docker`` or ``nerdctl``."""
    address: str = ""
    """containerd socket (nerdctl only)."""
    driven: bool = False
    why_not: str = ""
    endpoint: str = ""
    source: str = ""


class HostFiles:
    """Reads under a host root; a missing or unreadable file is ``None``, never an exception."""

    def __init__(self, root: str) -> None:
        self.root = root

    def path(self, host_path: str) -> str:
        return os.path.join(self.root, host_path.lstrip("/"))

    def read(self, host_path: str) -> str | None:
        try:
            with open(self.path(host_path), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def glob(self, pattern: str) -> list[str]:
        """Host paths matching ``pattern`` (a host path), sorted."""
        hits = glob.glob(self.path(pattern))
        return sorted("/" + os.path.relpath(h, self.root) for h in hits)

    def kubelet_argv(self) -> list[str] | None:
        """The running kubelet's argv from the host's ``/proc``; None if none is visible."""
        for entry in self.glob("/proc/[0-9]*/cmdline"):
            raw = self.read(entry)
            argv = [a for a in (raw or "").split("\0") if a]
            if argv and os.path.basename(argv[0]) == "kubelet":
                return argv
        return None


def flag_values(argv: Iterable[str]) -> dict[str, str]:
    """``--name=value`` and ``--name value`` flags of a command line, last one winning."""
    out: dict[str, str] = {}
    items = list(argv)
    for i, arg in enumerate(items):
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        if not eq:
            follows = i + 1 < len(items) and not items[i + 1].startswith("-")
            value = items[i + 1] if follows else ""
        out[name] = value
    return out


def config_values(text: str | None) -> dict[str, str] | None:
    """The keys we read from a KubeletConfiguration YAML; None when it does not parse."""
    if text is None:
        return {}
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(loaded, dict):
        return {} if loaded is None else None
    return {k: str(loaded[k]) for k in _KEYS.values() if loaded.get(k)}


def _from_flags(flags: dict[str, str]) -> dict[str, str]:
    return {camel: flags[flag] for flag, camel in _KEYS.items() if flags.get(flag)}


def _merge_files(host: HostFiles, paths: Iterable[str], notes: list[str]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for path in paths:
        values = config_values(host.read(path))
        if values is None:
            notes.append(f"{path} does not parse as YAML; ignored")
            continue
        merged.update(values)
    return merged


def running_kubelet(host: HostFiles, argv: list[str]) -> Source:
    """The running kubelet: its config file, then drop-ins over it, then its flags over both."""
    notes: list[str] = []
    flags = flag_values(argv[1:])
    values = _merge_files(host, [flags["config"]] if flags.get("config") else [], notes)
    if flags.get("config-dir"):
        dropins = host.glob(os.path.join(flags["config-dir"], "*.conf"))
        values.update(_merge_files(host, dropins, notes))
    values.update(_from_flags(flags))
    return Source("kubelet command line (/proc)", values, notes=tuple(notes))


def kubeadm_flags(host: HostFiles) -> Source:
    name = "/var/lib/kubelet/kubeadm-flags.env"
    values: dict[str, str] = {}
    for line in (host.read(name) or "").splitlines():
        _, eq, value = line.partition("=")
        if eq:
            try:
                words = [w for token in shlex.split(value) for w in shlex.split(token)]
                values.update(_from_flags(flag_values(words)))
            except ValueError:
                return Source(name, notes=(f"{name}: unbalanced quotes; ignored",))
    return Source(name, values)


def kubelet_config(host: HostFiles) -> Source:
    notes: list[str] = []
    name = "/var/lib/kubelet/config.yaml"
    return Source(name, _merge_files(host, [name], notes), notes=tuple(notes))


def rancher_dropins(host: HostFiles) -> Source:
    """One merged value per distribution directory; directories that disagree conflict."""
    pattern = "/var/lib/rancher/*/agent/etc/kubelet.conf.d/*.conf"
    notes: list[str] = []
    by_dir: dict[str, list[str]] = {}
    for path in host.glob(pattern):
        by_dir.setdefault(os.path.dirname(path), []).append(path)
    per_dir = {d: _merge_files(host, paths, notes) for d, paths in sorted(by_dir.items())}
    values: dict[str, str] = {}
    for merged in per_dir.values():
        for key, value in merged.items():
            values.setdefault(key, value)
    named = {d: v[_ENDPOINT] for d, v in per_dir.items() if v.get(_ENDPOINT)}
    conflict = ""
    if len(set(named.values())) > 1:
        conflict = "; ".join(f"{d} names {e}" for d, e in named.items())
    return Source(pattern, values, conflict=conflict, notes=tuple(notes))


def kubelet_sources(host: HostFiles) -> tuple[list[Source], bool]:
    """The sources in order, and whether the host's process table was visible at all."""
    argv = host.kubelet_argv()
    proc_visible = bool(host.glob("/proc/[0-9]*"))
    first = [running_kubelet(host, argv)] if argv else []
    return first + [kubeadm_flags(host), kubelet_config(host), rancher_dropins(host)], proc_visible


def first_naming(sources: list[Source], key: str) -> Source | None:
    """The first source naming ``key`` (or stopping on a conflict, for the endpoint)."""
    for source in sources:
        if key == _ENDPOINT and source.conflict:
            return source
        if source.values.get(key):
            return source
    return None


def choose(
    sources: list[Source],
    override: str,
    present: Callable[[str], bool],
    socket_exists: Callable[[str], bool],
) -> Choice:
    """Decide the runtime. ``present(cli)`` says whether the host carries ``cli``."""
    source = first_naming(sources, _ENDPOINT)
    endpoint = source.values.get(_ENDPOINT, "") if source else ""
    origin = source.name if source else ""
    address = _address(endpoint, socket_exists)
    if override:
        return _overridden(override, present, address, endpoint)
    if source and source.conflict:
        why = f"{source.name}: directories disagree ({source.conflict}); pick one with --runtime"
        return Choice("docker", address, why_not=why, endpoint=endpoint, source=origin)
    if endpoint:
        return _for_endpoint(endpoint, origin, address, present)
    for cli in ("docker", "nerdctl", "ctr"):
        if present(cli):
            picked = _overridden(cli, present, address, "")
            return replace(picked, source=f"{cli} found on the host PATH")
    why = "no container runtime named by the kubelet and none of docker, nerdctl, ctr on the host"
    return Choice("docker", why_not=why)


def _address(endpoint: str, socket_exists: Callable[[str], bool]) -> str:
    if "containerd" in endpoint:
        return endpoint.removeprefix("unix://")
    return next((s for s in CONTAINERD_SOCKETS if socket_exists(s)), CONTAINERD_SOCKETS[0])


def _overridden(cli: str, present: Callable[[str], bool], address: str, endpoint: str) -> Choice:
    if cli == "ctr":
        why = "ctr is never driven (ctr run has no --device); steps are emitted for nerdctl"
        if not present("ctr"):
            why = "ctr is not on the host; " + why
        return Choice("nerdctl", address, why_not=why, endpoint=endpoint, source="--runtime")
    if not present(cli):
        return Choice(
            cli,
            address if cli == "nerdctl" else "",
            why_not=f"{cli} is not on the host",
            endpoint=endpoint,
            source="--runtime",
        )
    return Choice(
        cli, address if cli == "nerdctl" else "", driven=True, endpoint=endpoint, source="--runtime"
    )


def _for_endpoint(
    endpoint: str, origin: str, address: str, present: Callable[[str], bool]
) -> Choice:
    if "containerd" in endpoint:
        if present("nerdctl"):
            return Choice("nerdctl", address, driven=True, endpoint=endpoint, source=origin)
        why = "the kubelet uses containerd and nerdctl is not on the host"
        if present("ctr"):
            why += "; ctr is never driven (ctr run has no --device)"
        return Choice("nerdctl", address, why_not=why, endpoint=endpoint, source=origin)
    if "docker" in endpoint:
        if present("docker"):
            return Choice("docker", driven=True, endpoint=endpoint, source=origin)
        why = "the kubelet uses docker and docker is not on the host"
        return Choice("docker", why_not=why, endpoint=endpoint, source=origin)
    why = f"no client this command drives speaks to {endpoint}"
    return Choice("docker", why_not=why, endpoint=endpoint, source=origin)


_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


def topology_policy(sources: list[Source], proc_visible: bool) -> tuple[str, str, str]:
    """``(policy, source, note)``: the kubelet default ``none`` when a config exists unnamed."""
    source = first_naming(sources, _POLICY)
    if source is not None:
        policy = source.values[_POLICY]
        if policy in _POLICIES:
            return policy, source.name, ""
        return "unknown", source.name, f"{source.name} names an unknown policy {policy!r}"
    if any(s.values or s.name.startswith("kubelet command line") for s in sources):
        return "none", "", "no source names a policy; the kubelet's default is none"
    note = "nothing on the host names a kubelet configuration"
    if not proc_visible:
        note += " (the host's process table is not visible under the host root)"
    return "unknown", "", note
