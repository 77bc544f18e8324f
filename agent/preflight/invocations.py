"""The exact argument vectors preflight runs on the host: probes, the sweep, and ``command -v``.

Pure. A probe gets the preflight label and the allocator's injection and nothing more: no
``--privileged``, no extra devices. Environment is sorted by key, mounts and devices by container
path, so equal injections always give byte-equal commands.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from agent.preflight.injection import Injection
from agent.preflight.kubeletconfig import NAMESPACE, Choice

LABEL = "gpustack.ai/preflight=true"
MAPS_BEGIN = "gpustack-preflight-maps-begin"
MAPS_END = "gpustack-preflight-maps-end"
READER_BEGIN = "gpustack-preflight-reader-begin"
READER_END = "gpustack-preflight-reader-end"

_VENDOR_RUNTIME = {
    ("docker", "nvidia"): ("--runtime", "nvidia"),
    ("nerdctl", "nvidia"): ("--gpus", "all"),
    ("docker", "ascend"): ("--runtime", "ascend"),
}
"""How each CLI hands a container to the vendor's runtime (others need nothing)."""


def cli_prefix(chroot: str, host_root: str, choice: Choice) -> list[str]:
    """``chroot <root> <cli>`` plus, for nerdctl, the kubelet's socket and our namespace."""
    argv = [chroot, host_root, choice.dialect]
    if choice.dialect == "nerdctl":
        argv += ["--address", choice.address, "--namespace", NAMESPACE]
    return argv


def injection_flags(injection: Injection) -> list[str]:
    """``-e``, ``-v`` and ``--device`` flags for ``injection``, each kind sorted."""
    flags: list[str] = []
    for key in sorted(injection.envs):
        flags += ["-e", f"{key}={injection.envs[key]}"]
    for m in sorted(injection.mounts):
        flags += ["-v", f"{m.host_path}:{m.container_path}" + (":ro" if m.read_only else "")]
    for d in sorted(injection.devices):
        access = f":{d.permissions}" if d.permissions else ""
        flags += ["--device", f"{d.host_path}:{d.container_path}{access}"]
    return flags


def run_argv(
    prefix: Sequence[str],
    manufacturer: str,
    injection: Injection,
    image: str,
    script: str,
) -> list[str]:
    """One probe container: removed on exit, labelled, injected, running ``sh -c script``."""
    dialect = prefix[2]
    vendor = list(_VENDOR_RUNTIME.get((dialect, manufacturer), ()))
    return [
        *prefix,
        "run",
        "--rm",
        *vendor,
        "--label",
        LABEL,
        *injection_flags(injection),
        image,
        "sh",
        "-c",
        script,
    ]


def list_argv(prefix: Sequence[str]) -> list[str]:
    """Every container, running or not, carrying the preflight label (ids only)."""
    return [*prefix, "ps", "-a", "-q", "--filter", f"label={LABEL}"]


def remove_argv(prefix: Sequence[str], ids: Sequence[str]) -> list[str]:
    return [*prefix, "rm", "-f", *ids]


def probe_script(reader: str, hold_s: float = 0.0) -> str:
    """Print this process's mappings, then the vendor reader, each between markers.

    ``cat`` is a fresh dynamically linked process, so whatever ``/etc/ld.so.preload`` names is in
    its ``/proc/self/maps`` if and only if the loader actually mapped it.
    """
    parts = [f"echo {MAPS_BEGIN}", "cat /proc/self/maps", f"echo {MAPS_END}"]
    if reader:
        parts += [f"echo {READER_BEGIN}", f"{reader} 2>&1", f"echo {READER_END}"]
    if hold_s > 0:
        parts.append(f"sleep {hold_s:g}")
    return "; ".join(parts)


def render(argv: Sequence[str]) -> str:
    """The command as a person would paste it into a shell."""
    return shlex.join(argv)


def block(output: str, begin: str, end: str) -> list[str] | None:
    """The lines between ``begin`` and ``end`` markers; None when the block never started."""
    lines = output.splitlines()
    try:
        start = lines.index(begin)
    except ValueError:
        return None
    rest = lines[start + 1 :]
    return rest[: rest.index(end)] if end in rest else rest
