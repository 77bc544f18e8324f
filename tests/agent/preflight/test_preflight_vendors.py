"""The seven other manufacturers' preflight rows, planned and judged as a dry run: pure.

Groups are hand-made as detection reports them; the host's files are a dict (``View``). A dry
run judges every probe as emitted, so each row's state and depth here is exactly what
``dm preflight --dry-run`` prints for such a node.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.devices.manufacturers import MANUFACTURERS
from agent.preflight import checking, invocations, judging
from agent.preflight.model import Row
from agent.preflight.resolving import Choice
from bus import devices

LIB = "/var/lib/gpustack/operator/lib"
PREFIX = invocations.cli_prefix("/usr/sbin/chroot", "/host", Choice("docker"))


class View:
    """:class:`checking.HostView` over a dict of host files (a value of None: a symlink)."""

    def __init__(self, files: dict[str, str | None] | None = None, dirs: tuple[str, ...] = ()):
        self.files = files or {}
        self.dirs = dirs

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.dirs

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def is_link(self, path: str) -> bool:
        return path in self.files and self.files[path] is None


def group(
    manufacturer: str,
    *,
    cards: int = 1,
    family: str | None = None,
    runtime: str | None = None,
    cores: int | None = None,
    physical: Callable[[int], tuple[int, ...]] = lambda i: (i, 128 + i),
    partitions: int = 0,
) -> devices.DeviceGroup:
    slices = MANUFACTURERS[manufacturer].logical_slices
    status = devices.AcceleratorStatus(
        unhealthy=False,
        logical_sliced=None
        if partitions
        else devices.LogicalSliced(cores_percentage_overcommit=False, count=slices),
        physical_sliced=devices.PhysicalSliced(count=partitions) if partitions else None,
    )
    return devices.DeviceGroup(
        id=f"{manufacturer}-x",
        manufacturer=manufacturer,
        name=f"{manufacturer} X",
        memory=65536,
        cores=cores,
        family=family,
        runtime_version=runtime,
        accelerators=tuple(
            devices.Accelerator(
                id=f"{manufacturer.upper()}-{i}",
                index=i,
                physical_indexes=physical(i),
                topology=devices.Topology(pci_bus_id=f"0000:{i + 1:02x}:00.0"),
                status=status,
            )
            for i in range(cards)
        ),
    )


def dry_run(g: devices.DeviceGroup, view: View | None = None, image: str = "") -> list[Row]:
    vendor = checking.VENDORS[g.manufacturer]
    plan = checking.plan(
        vendor, [g], prefix=PREFIX, image=image, host_lib_dir=LIB, hold_s=0, view=view or View()
    )
    rows = list(plan.rows)
    for probe in plan.probes:
        rows += judging.judge(vendor, probe, None, why="this is a dry run")
    return rows


def table(rows: list[Row]) -> list[tuple[str, str, str, str]]:
    return [(r.capability, r.state, r.depth, r.reason) for r in rows]


def test_every_manufacturer_has_a_preflight_vendor() -> None:
    assert sorted(checking.VENDORS) == sorted(MANUFACTURERS)


@pytest.mark.parametrize("manufacturer", ["iluvatar", "mthreads"])
def test_injection_only_manufacturers_are_judged_from_the_injection(manufacturer: str) -> None:
    rows = dry_run(group(manufacturer))
    assert table(rows) == [
        ("sliced-runtime-loaded", "ok", "simulated", ""),
        ("sliced-quota-in-force", "ok", "simulated", ""),
        ("sidecar-visibility", "ok", "simulated", ""),
    ]
    assert all(r.command == "" for r in rows)  # no container would run for them


def test_iluvatar_names_hami_core_and_the_cap() -> None:
    loaded, quota, seen = dry_run(group("iluvatar"))
    assert (
        loaded.detail
        == "the slice is enforced by /usr/local/vgpu/libvgpu.so; not run: this is a dry run"
    )
    assert quota.detail == "the injection caps memory at 32768 MiB; not run: this is a dry run"
    assert seen.detail == "a sidecar is injected IX_VISIBLE_DEVICES=0; never run"
