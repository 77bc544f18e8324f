"""Declared rows: what preflight reads per manufacturer without running a container.

A declared row (depth ``declared``, no command) comes from the detection report or from the
host's files, read through :class:`HostView` (files under the host root), never through a vendor
library: where only the vendor library could answer (Ascend's container-share flag, Cambricon's
sMLU mode) the row says the driver was not askable, which is ``unavailable``. Each manufacturer's
function here is its :attr:`~agent.preflight.vendors.Vendor.declared`. Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Protocol

from agent.preflight.model import Row, RowMode, State
from bus import devices


class HostView(Protocol):
    """Reads of the host's files, by host path (the implementation prefixes the host root)."""

    def exists(self, path: str) -> bool: ...

    def read(self, path: str) -> str | None:
        """The file's text; None when it is absent or unreadable."""

    def is_link(self, path: str) -> bool: ...


Declared = Callable[[devices.DeviceGroup, devices.Accelerator, HostView], list[Row]]
"""A manufacturer's declared rows for one card of a group."""


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
    """The card is offered as logical slices (and is not partitioned): slice rows apply."""
    sliced = acc.status.logical_sliced
    return bool(sliced and sliced.count > 0 and not acc.status.physical_sliced)


def nothing(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
    """For the manufacturers with no driver read."""
    return []


# ------------------------------------------------------------------ NVIDIA, AMD, T-Head


def mig(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
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


def cu_mask(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
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


# ------------------------------------------------------------------ Ascend, Cambricon, MetaX

ASCEND_RUNTIME_HOME = "/usr/local/Ascend/Ascend-Docker-Runtime"
ASCEND_RUNTIME_MIN = (26, 0, 0)
HCCL_RANKTABLE = "/etc/hccl_rootinfo.json"


def _not_askable(acc: devices.Accelerator, capability: str, detail: str) -> Row:
    return declared_row(acc, capability, "sliced", "unavailable", detail, "driver-not-askable")


def ascend(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
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


def cambricon(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
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


def metax(group: devices.DeviceGroup, acc: devices.Accelerator, view: HostView) -> list[Row]:
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
