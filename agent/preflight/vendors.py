"""What preflight establishes per manufacturer: the host CLI, the driver reads, the probe.

Tiers (how deep each manufacturer's rows can go):

- **full** (NVIDIA, Ascend, AMD, T-Head): driver reads and a container probe;
- **probe only** (Hygon): a container probe, no driver read (its probe has no default image);
- **driver read and injection** (Cambricon, MetaX): the mode the slicing needs is read, the
  injection is the allocator's own, and no container runs;
- **injection only** (Iluvatar, MThreads): the allocator's injection, nothing read or run.

A declared row reads the host through :class:`HostView` (files under the host root), never a
vendor library: where only the vendor library could answer (Ascend's container-share flag,
Cambricon's sMLU mode) the row says the driver was not askable, which is ``unavailable``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.deviceplugin.vendors import ascend, cambricon, hygon, metax, mthreads, thead
from agent.preflight.injection import Injection
from agent.preflight.model import Row, RowMode, State
from bus import devices


class HostView(Protocol):
    """Reads of the host's files, by host path (the implementation prefixes the host root)."""

    def exists(self, path: str) -> bool: ...

    def read(self, path: str) -> str | None:
        """The file's text; None when it is absent or unreadable."""

    def is_link(self, path: str) -> bool: ...


Declared = Callable[[devices.DeviceGroup, devices.Accelerator, HostView], list[Row]]


@dataclass(frozen=True)
class Vendor:
    key: str
    host_cli: tuple[str, ...]
    """The vendor CLI that counts accelerators on the host; empty: no cross-check."""
    host_counts: Callable[[str], int]
    cap: Callable[[Injection], int | None]
    """The first card's memory cap (MiB) as the sliced injection states it."""
    cap_source: str
    """Where that cap is stated, for the row that finds none."""
    reader: str
    """Shell command printing the memory the container sees (MiB); empty if none."""
    co_tenancy: bool
    declared: Declared
    image: Callable[[devices.DeviceGroup], str]
    enforcer: Callable[[Injection], str] = lambda i: next(
        (m.container_path for m in i.library_mounts()), ""
    )
    """What enforces a slice in the injection (the preload library, a quota variable, a driver
    step); empty: nothing does."""
    probes: bool = True
    """Whether probe containers run (else every row is judged from the injection)."""


def declared_row(
    acc: devices.Accelerator,
    capability: str,
    mode: RowMode,
    state: State,
    detail: str,
    reason: str = "",
) -> Row:
    """A row read from the driver or the host's files (depth ``declared``, no command)."""
    return Row(
        accelerator=acc.id,
        capability=capability,
        mode=mode,
        state=state,
        depth="declared",
        detail=detail,
        reason=reason,
    )


def sliceable(acc: devices.Accelerator) -> bool:
    sliced = acc.status.logical_sliced
    return bool(sliced and sliced.count > 0 and not acc.status.physical_sliced)


def _nothing(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
    return []


def _env_cap(key: str, shift: int = 0) -> Callable[[Injection], int | None]:
    def cap(injection: Injection) -> int | None:
        digits = injection.envs.get(key, "").lower().removesuffix("m")
        return int(digits) >> shift if digits.isdigit() else None

    return cap


def _file_cap(pattern: str) -> Callable[[Injection], int | None]:
    regex = re.compile(pattern, re.MULTILINE)

    def cap(injection: Injection) -> int | None:
        for file in injection.files:
            match = regex.search(file.content)
            if match:
                return int(match.group(1))
        return None

    return cap


def _step_cap(kind: str, key: str) -> Callable[[Injection], int | None]:
    def cap(injection: Injection) -> int | None:
        for step in injection.steps:
            value = dict(step.parameters).get(key, "") if step.kind == kind else ""
            if value.isdigit():
                return int(value)
        return None

    return cap


def _step_enforcer(kind: str) -> Callable[[Injection], str]:
    return lambda i: next((s.describe() for s in i.steps if s.kind == kind), "")


def _env_enforcer(key: str) -> Callable[[Injection], str]:
    return lambda i: f"{key}={i.envs[key]}" if key in i.envs else ""


def _file_enforcer(container_path: str) -> Callable[[Injection], str]:
    return lambda i: next(
        (f"{m.container_path} (mounted)" for m in i.mounts if m.container_path == container_path),
        "",
    )


def _count_prefix(prefix: str) -> Callable[[str], int]:
    return lambda out: sum(1 for line in out.splitlines() if line.strip().startswith(prefix))


def _count_containing(text: str) -> Callable[[str], int]:
    return lambda out: sum(1 for line in out.splitlines() if text in line)


# ------------------------------------------------------------------ NVIDIA, AMD


def _mig(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
    physical = acc.status.physical_sliced
    if physical and physical.profiles:
        names = ", ".join(f"{p.name}×{p.count}" for p in physical.profiles)
        detail = f"MIG on; profiles {names}"
    elif physical and physical.count:
        detail = f"partition mode on; {physical.count} partition tokens, profiles not reported"
    else:
        detail = "MIG is off on this card (or the card has none)"
        return [declared_row(acc, "mig-partitioning", "partitioned", "not-declared", detail)]
    return [declared_row(acc, "mig-partitioning", "partitioned", "ok", detail)]


def _cu_mask(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
    if not sliceable(acc):
        return []
    if not group.cores:
        detail = "the KFD topology gave no SIMD and per-CU counts for this card"
        return [
            declared_row(
                acc, "cu-mask-topology", "sliced", "unavailable", detail, "kfd-topology-unread"
            )
        ]
    step = 100 / group.cores
    detail = (
        f"KFD topology: {group.cores} compute units; HSA_CU_MASK allocates whole CUs, "
        f"an atom of {step:.2f} % of the card"
    )
    return [declared_row(acc, "cu-mask-topology", "sliced", "ok", detail)]


def _cuda_image(group: devices.DeviceGroup) -> str:
    major, _, minor = (group.runtime_version or "").partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return ""
    distro = "ubuntu24.04" if (int(major), int(minor)) >= (12, 5) else "ubuntu22.04"
    return f"nvidia/cuda:{major}.{minor}.0-base-{distro}"


NVIDIA = Vendor(
    key="nvidia",
    host_cli=("nvidia-smi", "-L"),
    host_counts=_count_prefix("GPU "),
    cap=_env_cap("CUDA_DEVICE_MEMORY_LIMIT_0"),
    cap_source="CUDA_DEVICE_MEMORY_LIMIT_0",
    reader="nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits",
    co_tenancy=True,
    declared=_mig,
    image=_cuda_image,
)
AMD = Vendor(
    key="amd",
    host_cli=("rocm-smi", "--showuniqueid"),
    host_counts=_count_containing("Unique ID"),
    cap=_env_cap("VROCM_DEVICE_MEMORY_LIMIT_0"),
    cap_source="VROCM_DEVICE_MEMORY_LIMIT_0",
    reader="",
    co_tenancy=False,
    declared=_cu_mask,
    image=lambda group: "ubuntu:24.04",
)


# ------------------------------------------------------------------ the seven others

ASCEND_RUNTIME_HOME = "/usr/local/Ascend/Ascend-Docker-Runtime"
ASCEND_RUNTIME_MIN = (26, 0, 0)
HCCL_RANKTABLE = "/etc/hccl_rootinfo.json"


def _not_askable(acc: devices.Accelerator, capability: str, detail: str) -> Row:
    return declared_row(acc, capability, "sliced", "unavailable", detail, "driver-not-askable")


def _ascend(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
    rows = []
    if sliceable(acc):
        rows.append(
            _not_askable(
                acc,
                "container-share",
                "the container-share flag shared, visibility and sliced grants need is read "
                "and set through DCMI, which preflight does not call; `npu-smi info -t "
                "device-share` on the host shows it",
            )
        )
    if "950" in (group.family or ""):  # A5: the runtime and HCCL's ranktable must be new
        rows += [_ascend_runtime(acc, view), _ranktable(acc, view)]
    return rows


def _ascend_runtime(acc: devices.Accelerator, view: HostView) -> Row:
    capability = "ascend-docker-runtime"
    if not view.exists(ASCEND_RUNTIME_HOME):
        detail = f"no Ascend Docker Runtime under {ASCEND_RUNTIME_HOME}"
        return declared_row(acc, capability, "unnamed", "unavailable", detail, "not-installed")
    text = view.read(f"{ASCEND_RUNTIME_HOME}/version.info") or ""
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        detail = f"{ASCEND_RUNTIME_HOME}/version.info names no version"
        return declared_row(acc, capability, "unnamed", "unavailable", detail, "version-unread")
    version = tuple(int(g) for g in match.groups())
    shown = ".".join(map(str, version))
    if version < ASCEND_RUNTIME_MIN:
        detail = f"Ascend Docker Runtime {shown}; Ascend 950 needs 26.0.0 or newer"
        return declared_row(acc, capability, "unnamed", "unavailable", detail, "too-old")
    return declared_row(acc, capability, "unnamed", "ok", f"Ascend Docker Runtime {shown}")


def _ranktable(acc: devices.Accelerator, view: HostView) -> Row:
    capability, path = "hccl-ranktable", HCCL_RANKTABLE
    if view.is_link(path):
        detail = f"{path} is a symbolic link; the runtime would mount what it names"
        return declared_row(acc, capability, "unnamed", "unavailable", detail, "symlink")
    text = view.read(path)
    if text is None:
        return declared_row(acc, capability, "unnamed", "ok", f"no {path}")
    try:
        version = json.loads(text).get("version")
    except (ValueError, AttributeError):
        detail = f"{path} is not a JSON object"
        return declared_row(acc, capability, "unnamed", "unavailable", detail, "unparsable")
    if version != "2.0":
        detail = f"{path} is ranktable {version!r}; HCCL on Ascend 950 needs 2.0"
        return declared_row(acc, capability, "unnamed", "unavailable", detail, "old-ranktable")
    return declared_row(acc, capability, "unnamed", "ok", f"{path} is ranktable 2.0")


def _ascend_image(group: devices.DeviceGroup) -> str:
    family = "".join(ch for ch in (group.family or "").lower() if ch.isalnum())
    if not (group.runtime_version and family):
        return ""
    return f"quay.io/ascend/cann:{group.runtime_version}-{family}"


def _cambricon(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
    if not sliceable(acc):
        return []
    return [
        _not_askable(
            acc,
            "smlu-mode",
            "sMLU mode, which sliced grants need, is read and set through CNDev, which "
            "preflight does not call; `cnmon` on the host shows it",
        )
    ]


def _metax(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
    if not sliceable(acc):
        return []
    bdf = acc.topology.pci_bus_id if acc.topology else None
    if not bdf:
        detail = "detection reported no PCI address for this card"
        return [declared_row(acc, "sgpu-mode", "sliced", "unavailable", detail, "no-pci-address")]
    registry = f"/sys/bus/pci/devices/{bdf}/sgpu"
    if not view.exists(registry):
        detail = f"no {registry}: the driver offers no sGPU on this card"
        return [declared_row(acc, "sgpu-mode", "sliced", "unavailable", detail, "no-sgpu-registry")]
    made = "can" if view.exists(f"{registry}/create") else "cannot"
    detail = f"sGPU registry at {registry}; subdevices {made} be created there"
    return [declared_row(acc, "sgpu-mode", "sliced", "ok", detail)]


ASCEND = Vendor(
    key="ascend",
    host_cli=("npu-smi", "info", "-l"),
    host_counts=_count_prefix("NPU ID"),
    cap=_file_cap(r"^memory-quota=(\d+)$"),
    cap_source="memory-quota in npu_info.config",
    reader=ascend.MONITOR,
    co_tenancy=True,
    declared=_ascend,
    image=_ascend_image,
)
CAMBRICON = Vendor(
    key="cambricon",
    host_cli=(),
    host_counts=len,
    cap=_step_cap(cambricon.SMLU, "memory-mib"),
    cap_source="an sMLU memory size",
    reader="",
    co_tenancy=False,
    declared=_cambricon,
    image=lambda group: "",
    enforcer=_step_enforcer(cambricon.SMLU),
    probes=False,
)
HYGON = Vendor(
    key="hygon",
    host_cli=(),
    host_counts=len,
    cap=_file_cap(r"^mem: (\d+) MiB$"),
    cap_source="mem in vdev0.conf",
    reader="",
    co_tenancy=False,
    declared=_nothing,
    image=lambda group: "",
    enforcer=_file_enforcer(hygon.VDEV_DIR),
    probes=False,
)
ILUVATAR = Vendor(
    key="iluvatar",
    host_cli=(),
    host_counts=len,
    cap=_env_cap("CUDA_DEVICE_MEMORY_LIMIT_0"),
    cap_source="CUDA_DEVICE_MEMORY_LIMIT_0",
    reader="",
    co_tenancy=False,
    declared=_nothing,
    image=lambda group: "",
    probes=False,
)
METAX = Vendor(
    key="metax",
    host_cli=(),
    host_counts=len,
    cap=_step_cap(metax.SGPU, "vram-mib"),
    cap_source="an sGPU VRAM cap",
    reader="",
    co_tenancy=False,
    declared=_metax,
    image=lambda group: "",
    enforcer=_step_enforcer(metax.SGPU),
    probes=False,
)
MTHREADS = Vendor(
    key="mthreads",
    host_cli=(),
    host_counts=len,
    cap=_env_cap(mthreads.MEMORY_LIMIT, shift=20),
    cap_source=mthreads.MEMORY_LIMIT,
    reader="",
    co_tenancy=False,
    declared=_nothing,
    image=lambda group: "",
    enforcer=_env_enforcer(mthreads.MEMORY_LIMIT),
    probes=False,
)
THEAD = Vendor(
    key="thead",
    host_cli=(),
    host_counts=len,
    cap=_env_cap("HGGC_DEVICE_MEMORY_LIMIT_0"),
    cap_source="HGGC_DEVICE_MEMORY_LIMIT_0",
    reader=thead.MONITOR,
    co_tenancy=True,
    declared=_mig,
    image=lambda group: "",
)

VENDORS: dict[str, Vendor] = {
    v.key: v for v in (AMD, ASCEND, CAMBRICON, HYGON, ILUVATAR, METAX, MTHREADS, NVIDIA, THEAD)
}
"""Every manufacturer preflight knows, by key."""
