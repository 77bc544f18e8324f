"""What to establish per manufacturer, and the verdict on what the probes printed. Pure.

:func:`plan` turns detected groups into declared rows (read from the driver) and probes (an
injection plus the command that runs it); :func:`judge` turns a probe's output into rows. A row
is ``measured`` only when the probe printed the thing the verdict rests on: the preload library's
line in ``/proc/self/maps``, or the vendor reader reporting the cap. A greeting line proves
nothing, because a library that failed to load prints the same path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agent.deviceplugin.resources import Mode
from agent.preflight import invocations
from agent.preflight.declaring import HostView, sliceable
from agent.preflight.injection import Injection, InjectionError, respond
from agent.preflight.model import Row
from agent.preflight.vendors import VENDORS, Vendor
from bus import devices

__all__ = ["VENDORS", "HostView", "Plan", "Probe", "ProbeKind", "Result", "Vendor", "plan"]

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
    view: HostView,
) -> Plan:
    """The rows to establish for ``groups`` of one manufacturer (accelerators in index order).

    ``view`` is what the driver-read rows read (files under the host root)."""
    rows: list[Row] = []
    probes: list[Probe] = []
    for group in groups:
        probe_image = image or vendor.image(group)
        for acc in group.accelerators:
            rows += vendor.declared(group, acc, view)
            kinds: list[ProbeKind] = ["visibility"]
            if sliceable(acc):
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
                if not probe_image and vendor.probes:
                    rows += _refused(acc.id, kind, "no default probe image; pass --probe-image")
                    continue
                script = invocations.probe_script(
                    vendor.reader if kind == "sliced" else "", hold_s if kind == "pair" else 0
                )
                argv = (
                    invocations.run_argv(prefix, vendor.key, injection, probe_image, script)
                    if vendor.probes
                    else []
                )
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
