"""What preflight establishes per manufacturer: the host CLI, the driver reads, the probe.

Tiers (how deep each manufacturer's rows can go):

- **full** (NVIDIA, Ascend, AMD, T-Head): driver reads and a container probe;
- **probe only** (Hygon): a container probe, no driver read (its probe has no default image);
- **driver read and injection** (Cambricon, MetaX): the mode the slicing needs is read, the
  injection is the allocator's own, and no container runs;
- **injection only** (Iluvatar, MThreads): the allocator's injection, nothing read or run.

Each :class:`Vendor` names its driver reads (:mod:`agent.preflight.declaring`), how the sliced
injection states and enforces the memory cap, and the probe's image and reader.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from agent.deviceplugin.vendors import ascend, cambricon, hygon, metax, mthreads, thead
from agent.preflight import declaring
from agent.preflight.injection import Injection
from bus import devices


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
    declared: declaring.Declared
    image: Callable[[devices.DeviceGroup], str]
    enforcer: Callable[[Injection], str] = lambda i: next(
        (m.container_path for m in i.library_mounts()), ""
    )
    """What enforces a slice in the injection (the preload library, a quota variable, a driver
    step); empty: nothing does."""
    probes: bool = True
    """Whether probe containers run (else every row is judged from the injection)."""


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
    declared=declaring.mig,
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
    declared=declaring.cu_mask,
    image=lambda group: "ubuntu:24.04",
)


# ------------------------------------------------------------------ the seven others


def _ascend_image(group: devices.DeviceGroup) -> str:
    family = "".join(ch for ch in (group.family or "").lower() if ch.isalnum())
    if not (group.runtime_version and family):
        return ""
    return f"quay.io/ascend/cann:{group.runtime_version}-{family}"


ASCEND = Vendor(
    key="ascend",
    host_cli=("npu-smi", "info", "-l"),
    host_counts=_count_prefix("NPU ID"),
    cap=_file_cap(r"^memory-quota=(\d+)$"),
    cap_source="memory-quota in npu_info.config",
    reader=ascend.MONITOR,
    co_tenancy=True,
    declared=declaring.ascend,
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
    declared=declaring.cambricon,
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
    declared=declaring.nothing,
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
    declared=declaring.nothing,
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
    declared=declaring.metax,
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
    declared=declaring.nothing,
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
    declared=declaring.mig,
    image=lambda group: "",
)

VENDORS: dict[str, Vendor] = {
    v.key: v for v in (AMD, ASCEND, CAMBRICON, HYGON, ILUVATAR, METAX, MTHREADS, NVIDIA, THEAD)
}
"""Every manufacturer preflight knows, by key."""
