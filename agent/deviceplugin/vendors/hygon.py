"""Hygon DCU: device nodes and the hyhal tree (no runtime), a ``vdev0.conf`` when sliced.

No container runtime serves the DCU, so every mode passes ``/dev/kfd``, ``/dev/mkfd`` and the
card's ``/dev/dri/card<N>`` and ``/dev/dri/renderD<M>`` (the accelerator's two physical indexes,
as detection reads them from sysfs), and mounts the host's ``/opt/hyhal`` read-only, which the
DTK in the workload image loads.

A sliced grant is one card per container (the runtime reads ``vdev0.conf`` only) and adds that
file, written in the allocation's work directory and mounted read-only at ``/etc/vdev/docker``:
the card's PCI address, a compute-unit mask as two 64-bit words (low, high), the CU count, the
memory cap in MiB, and the virtual device and pipe ids (the lowest slice token held, unique among
the card's live tenants). The mask gives ``floor(CUs × cores% / 100)`` units starting at the
share's position on the card (``floor(CUs × first token / slices)``, moved down when the run
would pass the last CU), so co-tenants holding other tokens get other units where they fit.
"""

from __future__ import annotations

import os

from agent.deviceplugin import errors
from agent.deviceplugin.allocation import Grant, card_name
from agent.deviceplugin.injection import DeviceNode, HostFile, Injection, Mount
from agent.deviceplugin.resources import Card
from agent.deviceplugin.slicing import (
    Where,
    cores_percent,
    grant_work_dir,
    memory_limit,
    no_partitions,
    single_card,
)

HYHAL = "/opt/hyhal"
VDEV_DIR = "/etc/vdev/docker"
MAX_CUS = 128
"""Two 64-bit mask words."""


def respond(grant: Grant, where: Where) -> Injection:
    if grant.mode == "partitioned":
        raise no_partitions("hygon")
    devices = [
        DeviceNode("/dev/kfd", "/dev/kfd", "rw"),
        DeviceNode("/dev/mkfd", "/dev/mkfd", "rwm"),
    ]
    for card, _ in grant.cards:
        if len(card.physical_indexes) < 2:
            raise errors.CannotInject(f"card {card_name(card)} lacks its /dev/dri node numbers")
        first, render = card.physical_indexes[:2]
        nodes = (f"/dev/dri/card{first}", f"/dev/dri/renderD{render}")
        devices.extend(DeviceNode(node, node, "rw") for node in nodes)
    mounts = [Mount(HYHAL, HYHAL, read_only=True)]
    if grant.mode != "sliced":
        return Injection(mounts=tuple(mounts), devices=tuple(devices))
    card, tokens = single_card(grant, "the DCU virtualisation")
    if not card.pci_bus_id:
        raise errors.CannotInject(f"card {card_name(card)} reports no PCI address for vdev0.conf")
    count, low, high = cu_mask(card, tokens, cores_percent(grant))
    slot = min(tokens)
    lines = (
        f"PciBusId: {card.pci_bus_id}",
        f"cu_mask: 0x{low:016x}",
        f"cu_mask: 0x{high:016x}",
        f"cu_count: {count}",
        f"mem: {memory_limit(grant, card, len(tokens))} MiB",
        "device_id: 0",
        f"vdev_id: {slot}",
        f"pipe_id: {slot}",
        "enable: 1",
    )
    vdev = os.path.join(grant_work_dir(grant, where.host_work_dir), VDEV_DIR.lstrip("/"))
    mounts.append(Mount(VDEV_DIR, vdev, read_only=True))
    return Injection(
        mounts=tuple(mounts),
        devices=tuple(devices),
        host_dirs=(vdev,),
        files=(HostFile(os.path.join(vdev, "vdev0.conf"), "\n".join(lines) + "\n"),),
    )


def cu_mask(card: Card, tokens: tuple[int, ...], cores: int) -> tuple[int, int, int]:
    """(CU count, low word, high word) of a share of ``cores`` percent.

    :raises errors.CannotInject: the CU count is unknown or above two words, or the share is
        below one CU.
    """
    total, slices = card.compute_units or 0, max(1, card.sliced_count)
    if not 0 < total <= MAX_CUS:
        raise errors.CannotInject(f"card {card_name(card)} reports no compute units to mask")
    count = total * cores // 100
    if count < 1:
        least = -(-100 // total)
        raise errors.CannotInject(
            f"{cores} % of card {card_name(card)} is below one of its {total} compute units; "
            f"ask for at least {least} %"
        )
    start = min(total * min(tokens) // slices, total - count)
    mask = ((1 << count) - 1) << start
    return count, mask & (2**64 - 1), mask >> 64
