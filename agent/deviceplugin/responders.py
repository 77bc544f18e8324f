"""What each vendor's container runtime needs to see the granted cards: env, mounts, devices.

Pure: a :class:`allocation.Grant` in, an :class:`injection.Injection` out (plain data; the gRPC
layer encodes it). Per-card keys (``CUDA_DEVICE_MEMORY_LIMIT_<i>``, ``VROCM_DEVICE_MEMORY_LIMIT_<i>``,
the ``<i>:`` sets of ``HSA_CU_MASK``) are positional in ascending accelerator index, the order
of the visible-devices list, because that is the order the runtimes number the cards in.

- NVIDIA: ``NVIDIA_VISIBLE_DEVICES=<UUIDs>``. Partitioned grants are answered by
  :meth:`node.Node.allocate_partitioned`, which creates the MIG instance and names its
  ``MIG-`` UUID; this module's ``<GPU index>:<MIG index>`` form is only the fallback of a node
  run without MIG control (instances made by someone else).
  Sliced adds HAMi-core: the preload library from the host library directory, the memory and SM
  caps, HAMi's lock directory, ``/dev/shm``, and a per-allocation work directory at
  ``/tmp/vgpu`` holding the shared usage cache (:func:`work_dir`).
- AMD: ``/dev/kfd`` and each card's ``/dev/dri/card<N>`` and ``/dev/dri/renderD<M>`` as devices,
  ``ROCR_VISIBLE_DEVICES=<UUIDs>``, and ``AMD_VISIBLE_DEVICES=none`` so AMD's container toolkit
  does not add every card on top. Sliced adds libvrocm: the preload library, a memory cap per
  card and a compute-unit mask (:func:`cu_mask`).

The seven other manufacturers answer from :mod:`vendors`, one module each.

Work directories: kubelet's Allocate request names no pod, so a sliced container's work
directory is keyed by its allocation id (:func:`slicing.work_dir`); kubelet retrying the same
container gets the same directory. The responder only names it (``Injection.host_dirs``, and the
files to write there, ``Injection.files``); the node creates them before replying and removes
them when the allocation is released.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from agent.deviceplugin import errors, vendors
from agent.deviceplugin.allocation import Grant, card_name
from agent.deviceplugin.injection import DeviceNode, Injection, Mount
from agent.deviceplugin.resources import Card
from agent.deviceplugin.slicing import (
    VGPU_DIR,
    Where,
    grant_allocation_id,
    hami_core,
    memory_limit,
    work_dir,
)

__all__ = ["VGPU_DIR", "cu_mask", "grant_allocation_id", "respond", "work_dir"]

DEFAULT_CUDA_MAJOR = 12
"""The libvgpu build to mount when the driver reports no CUDA version."""
VROCM_LIBRARY = "/usr/local/vrocm/libvrocm.so"
"""Where the AMD slicing runtime is mounted; ``<host_lib_dir>/amd/ld.so.preload`` names it."""


def respond(
    grant: Grant,
    *,
    host_lib_dir: str,
    host_work_dir: str,
    exists: Callable[[str], bool] = os.path.exists,
) -> Injection:
    """The runtime injection for ``grant``.

    ``exists`` says whether an optional host device node is there (the vendors that pass
    optional per-card or control nodes ask it).

    :raises errors.CannotInject: the vendor is unsupported, a card lacks a needed fact, or a
        sliced share cannot be expressed (below one compute unit, several cards for a runtime
        that slices one).
    """
    if not grant.cards:
        raise errors.CannotInject("nothing granted")
    manufacturer = grant.cards[0][0].manufacturer
    if manufacturer == "nvidia":
        return _nvidia(grant, host_lib_dir, host_work_dir)
    if manufacturer == "amd":
        return _amd(grant, host_lib_dir)
    responder = vendors.RESPONDERS.get(manufacturer)
    if responder is None:
        raise errors.CannotInject(f"no runtime injection for manufacturer {manufacturer!r}")
    return responder(grant, Where(host_lib_dir, host_work_dir, exists))


# ------------------------------------------------------------------ NVIDIA


def _nvidia(grant: Grant, host_lib_dir: str, host_work_dir: str) -> Injection:
    cards = [card for card, _ in grant.cards]
    if grant.mode == "partitioned":
        migs = [f"{card.index}:{i}" for card, indexes in grant.cards for i in indexes]
        return Injection(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(migs)})
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(c.id for c in cards)}
    if grant.mode != "sliced":
        return Injection(envs=envs)
    lib = os.path.join(host_lib_dir, "nvidia", f"cuda-{_cuda_major(cards)}")
    injection = hami_core(grant, envs, lib, host_work_dir)
    preload = Mount(
        "/etc/ld.so.preload", os.path.join(host_lib_dir, "nvidia", "ld.so.preload"), read_only=True
    )  # one preload list for every CUDA major
    return Injection(
        envs=injection.envs,
        mounts=(preload, *injection.mounts[1:]),
        host_dirs=injection.host_dirs,
    )


def _cuda_major(cards: list[Card]) -> int:
    majors = {(c.runtime_version or "").split(".")[0] for c in cards}
    if len(majors) > 1:
        raise errors.CannotInject(f"cards with different CUDA majors: {sorted(majors)}")
    major = majors.pop()
    return int(major) if major.isdigit() else DEFAULT_CUDA_MAJOR


# ------------------------------------------------------------------ AMD


def _amd(grant: Grant, host_lib_dir: str) -> Injection:
    devices = [DeviceNode("/dev/kfd", "/dev/kfd", "rw")]
    for card, _ in grant.cards:
        if len(card.physical_indexes) < 2:
            raise errors.CannotInject(f"card {card_name(card)} lacks its /dev/dri node numbers")
        card_node, render_node = card.physical_indexes[:2]
        nodes = (f"/dev/dri/card{card_node}", f"/dev/dri/renderD{render_node}")
        devices.extend(DeviceNode(node, node, "rw") for node in nodes)
    envs = {
        "ROCR_VISIBLE_DEVICES": ",".join(card.id for card, _ in grant.cards),
        "AMD_VISIBLE_DEVICES": "none",
    }
    if grant.mode != "sliced":
        return Injection(envs=envs, devices=tuple(devices))
    masks = []
    for position, (card, tokens) in enumerate(grant.cards):
        envs[f"VROCM_DEVICE_MEMORY_LIMIT_{position}"] = str(memory_limit(grant, card, len(tokens)))
        masks.append(f"{position}:{cu_mask(card, tokens)}")
    envs["HSA_CU_MASK"] = ";".join(masks)
    envs["LIBVROCM_LOG_LEVEL"] = "1"
    lib = os.path.join(host_lib_dir, "amd")
    mounts = (
        Mount("/etc/ld.so.preload", os.path.join(lib, "ld.so.preload"), read_only=True),
        Mount(VROCM_LIBRARY, os.path.join(lib, "libvrocm.so"), read_only=True),
    )
    return Injection(envs=envs, mounts=mounts, devices=tuple(devices))


def cu_mask(card: Card, tokens: tuple[int, ...]) -> str:
    """The compute units a sliced share of ``card`` may use, as an ``HSA_CU_MASK`` CU list.

    With ``C`` compute units and ``S`` slices, holding ``k`` slices whose lowest index is ``m``
    gives ``floor(C·k/S)`` CUs starting at CU ``floor(C·m/S)``. Both round down, so a share
    never exceeds its fraction of the card, and the run never passes the last CU (``m + k ≤ S``).
    Co-tenants holding contiguous slices (GetPreferredAllocation hands them out in index order)
    get disjoint runs.

    :raises errors.CannotInject: the card's CU count is unknown, or the share is below one CU.
    """
    total, slices = card.compute_units or 0, card.sliced_count
    if total <= 0 or slices <= 0:
        raise errors.CannotInject(f"card {card_name(card)} reports no compute units to slice")
    count = total * len(tokens) // slices
    if count < 1:
        least = -(-slices // total)
        raise errors.CannotInject(
            f"{len(tokens)} of {slices} slices of card {card_name(card)} is below one of its "
            f"{total} compute units; ask for at least {least} slices"
        )
    start = total * min(tokens) // slices
    last = start + count - 1
    return str(start) if count == 1 else f"{start}-{last}"
