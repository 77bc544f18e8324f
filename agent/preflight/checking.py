"""What to establish per manufacturer, and the verdict on what the probes printed. Pure.

:func:`plan` turns detected groups into declared rows (read from the driver) and probes (an
injection plus the command that runs it); :func:`judge` turns a probe's output into rows. A row
is ``measured`` only when the probe printed the thing the verdict rests on: the preload library's
line in ``/proc/self/maps``, or the vendor reader reporting the cap. A greeting line proves
nothing, because a library that failed to load prints the same path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from agent.deviceplugin.resources import Mode
from agent.preflight import invocations
from agent.preflight.injection import Injection, InjectionError, respond
from agent.preflight.model import Row
from bus import devices

ProbeKind = Literal["sliced", "pair", "visibility"]


@dataclass(frozen=True)
class Result:
    """What one container run returned (combined stdout and stderr)."""

    code: int
    output: str


@dataclass(frozen=True)
class Probe:
    accelerator: str
    kind: ProbeKind
    injection: Injection
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Vendor:
    key: str
    host_cli: tuple[str, ...]
    """The vendor CLI that counts accelerators on the host."""
    host_counts: Callable[[str], int]
    cap_env: str
    """The env key carrying the first card's memory cap in the sliced injection."""
    reader: str
    """Shell command printing the memory the container sees (MiB); empty if none."""
    co_tenancy: bool
    declared: Callable[[devices.DeviceGroup, devices.Accelerator], Row | None]
    image: Callable[[devices.DeviceGroup], str]


def _mig(group: devices.DeviceGroup, acc: devices.Accelerator) -> Row | None:
    physical = acc.status.physical_sliced
    row = Row(
        accelerator=acc.id,
        capability="mig-partitioning",
        mode="partitioned",
        state="not-declared",
        depth="declared",
        detail="MIG is off on this card (or the card has none)",
    )
    if physical and physical.profiles:
        names = ", ".join(f"{p.name}×{p.count}" for p in physical.profiles)
        return msgspec.structs.replace(row, state="ok", detail=f"MIG on; profiles {names}")
    return row


def _cu_mask(group: devices.DeviceGroup, acc: devices.Accelerator) -> Row | None:
    if not _sliceable(acc):
        return None
    row = Row(
        accelerator=acc.id,
        capability="cu-mask-topology",
        mode="sliced",
        state="ok",
        depth="declared",
    )
    if not group.cores:
        return msgspec.structs.replace(
            row,
            state="unavailable",
            reason="kfd-topology-unread",
            detail="the KFD topology gave no SIMD and per-CU counts for this card",
        )
    step = 100 / group.cores
    detail = (
        f"KFD topology: {group.cores} compute units; HSA_CU_MASK allocates whole CUs, "
        f"an atom of {step:.2f} % of the card"
    )
    return msgspec.structs.replace(row, detail=detail)


def _count_prefix(prefix: str) -> Callable[[str], int]:
    return lambda out: sum(1 for line in out.splitlines() if line.startswith(prefix))


def _count_containing(text: str) -> Callable[[str], int]:
    return lambda out: sum(1 for line in out.splitlines() if text in line)


def _cuda_image(group: devices.DeviceGroup) -> str:
    major, _, minor = (group.runtime_version or "").partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return ""
    distro = "ubuntu24.04" if (int(major), int(minor)) >= (12, 5) else "ubuntu22.04"
    return f"nvidia/cuda:{major}.{minor}.0-base-{distro}"


VENDORS: dict[str, Vendor] = {
    "nvidia": Vendor(
        key="nvidia",
        host_cli=("nvidia-smi", "-L"),
        host_counts=_count_prefix("GPU "),
        cap_env="CUDA_DEVICE_MEMORY_LIMIT_0",
        reader="nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits",
        co_tenancy=True,
        declared=_mig,
        image=_cuda_image,
    ),
    "amd": Vendor(
        key="amd",
        host_cli=("rocm-smi", "--showuniqueid"),
        host_counts=_count_containing("Unique ID"),
        cap_env="VROCM_DEVICE_MEMORY_LIMIT_0",
        reader="",
        co_tenancy=False,
        declared=_cu_mask,
        image=lambda group: "ubuntu:24.04",
    ),
}
"""Manufacturers preflight can probe; the others get a detection block and a note."""


def _sliceable(acc: devices.Accelerator) -> bool:
    sliced = acc.status.logical_sliced
    return bool(sliced and sliced.count > 0 and not acc.status.physical_sliced)


@dataclass(frozen=True)
class Plan:
    rows: tuple[Row, ...]
    """Rows decided without a container: driver reads and refused injections."""
    probes: tuple[Probe, ...]


def plan(
    vendor: Vendor,
    groups: Sequence[devices.DeviceGroup],
    *,
    prefix: Sequence[str],
    image: str,
    host_lib_dir: str,
    hold_s: float,
) -> Plan:
    """The rows to establish for ``groups`` of one manufacturer (accelerators in index order)."""
    rows: list[Row] = []
    probes: list[Probe] = []
    for group in groups:
        probe_image = image or vendor.image(group)
        for acc in group.accelerators:
            declared = vendor.declared(group, acc)
            rows += [declared] if declared else []
            kinds: list[ProbeKind] = ["visibility"]
            if _sliceable(acc):
                kinds = (
                    ["sliced", "pair", "visibility"]
                    if vendor.co_tenancy
                    else ["sliced", "visibility"]
                )
            elif acc.status.physical_sliced:
                rows.append(_partition_sidecar(acc))
                kinds = []
            for kind in kinds:
                mode: Mode = "visibility" if kind == "visibility" else "sliced"
                try:
                    injection = respond(group, acc, mode, host_lib_dir=host_lib_dir)
                except InjectionError as e:
                    rows += _refused(acc.id, kind, str(e))
                    continue
                if not probe_image:
                    rows += _refused(acc.id, kind, "no default probe image; pass --probe-image")
                    continue
                script = invocations.probe_script(
                    vendor.reader if kind == "sliced" else "", hold_s if kind == "pair" else 0
                )
                argv = invocations.run_argv(prefix, vendor.key, injection, probe_image, script)
                probes.append(Probe(acc.id, kind, injection, tuple(argv)))
    return Plan(tuple(rows), tuple(probes))


_CAPABILITIES: dict[ProbeKind, tuple[tuple[str, str], ...]] = {
    "sliced": (("sliced-runtime-loaded", "sliced"), ("sliced-quota-in-force", "sliced")),
    "pair": (("co-tenancy", "sliced"),),
    "visibility": (("sidecar-visibility", "visibility"),),
}


def _refused(accelerator: str, kind: ProbeKind, why: str) -> list[Row]:
    return [
        Row(
            accelerator=accelerator,
            capability=cap,
            mode=mode,  # type: ignore[arg-type]
            state="unavailable",
            depth="simulated",
            reason="no-injection",
            detail=f"the allocator produced no injection: {why}",
        )
        for cap, mode in _CAPABILITIES[kind]
    ]


def _partition_sidecar(acc: devices.Accelerator) -> Row:
    return Row(
        accelerator=acc.id,
        capability="sidecar-visibility",
        mode="visibility",
        state="ok",
        depth="declared",
        detail="the card is in partition mode: a sidecar is granted the partition its "
        "owner holds, which exists only once a container holds one",
    )
