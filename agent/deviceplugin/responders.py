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

Work directories: kubelet's Allocate request names no pod, so a sliced container's work
directory is keyed by its allocation id (:func:`work_dir`); kubelet retrying the same container
gets the same directory. The responder only names it (``Injection.host_dirs``); the node creates
it before replying and removes it when the allocation is released.
"""

from __future__ import annotations

import hashlib
import os
import re

from agent.deviceplugin import errors, pending
from agent.deviceplugin.allocation import Grant, card_name
from agent.deviceplugin.injection import DeviceNode, Injection, Mount
from agent.deviceplugin.ledger import allocation_id
from agent.deviceplugin.resources import Card, device_id, resource_name

DEFAULT_CUDA_MAJOR = 12
"""The libvgpu build to mount when the driver reports no CUDA version."""
VGPU_DIR = "/tmp/vgpu"
"""HAMi-core's per-container work directory (container path)."""
VROCM_LIBRARY = "/usr/local/vrocm/libvrocm.so"
"""Where the AMD slicing runtime is mounted; ``<host_lib_dir>/amd/ld.so.preload`` names it."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def respond(grant: Grant, *, host_lib_dir: str, host_work_dir: str) -> Injection:
    """The runtime injection for ``grant``.

    :raises errors.CannotInject: the vendor is unsupported, a card lacks a needed fact, or a
        sliced AMD share is below one compute unit.
    """
    if not grant.cards:
        raise errors.CannotInject("nothing granted")
    manufacturer = grant.cards[0][0].manufacturer
    if manufacturer == "nvidia":
        return _nvidia(grant, host_lib_dir, host_work_dir)
    if manufacturer == "amd":
        return _amd(grant, host_lib_dir)
    raise errors.CannotInject(f"no runtime injection for manufacturer {manufacturer!r}")


def work_dir(host_work_dir: str, allocation: str) -> str:
    """The host directory of one allocation: a readable form of its id plus a hash of it.

    The hash keeps two ids that read the same once sanitized (``/`` and ``:`` become ``_``)
    apart; the name stays well under 255 bytes because token ids are at most 63 characters.
    """
    digest = hashlib.sha256(allocation.encode()).hexdigest()[:12]
    readable = _UNSAFE.sub("_", allocation).strip("._-")[:120]
    return os.path.join(host_work_dir, f"{readable}-{digest}")


def grant_allocation_id(grant: Grant) -> str:
    """The allocation id of ``grant``: its holding's, or derived from its tokens (visibility,
    or a grant built outside the ledger, as preflight does)."""
    if grant.holding is not None:
        return grant.holding.allocation_id
    card = grant.cards[0][0]
    ids = [device_id(c.group, c.id, i) for c, indexes in grant.cards for i in indexes]
    return allocation_id(resource_name(card.manufacturer, grant.mode), ids)


# ------------------------------------------------------------------ NVIDIA


def _nvidia(grant: Grant, host_lib_dir: str, host_work_dir: str) -> Injection:
    cards = [card for card, _ in grant.cards]
    if grant.mode == "partitioned":
        migs = [f"{card.index}:{i}" for card, indexes in grant.cards for i in indexes]
        return Injection(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(migs)})
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(c.id for c in cards)}
    if grant.mode != "sliced":
        return Injection(envs=envs)
    shares = [(card, len(indexes)) for card, indexes in grant.cards]
    for position, (card, tokens) in enumerate(shares):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{position}"] = f"{_memory_limit(grant, card, tokens)}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(
        pending.cores_percentage(grant.request)
        if grant.request is not None
        else min(_percent(card, tokens) for card, tokens in shares)
    )
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{VGPU_DIR}/cudevshr.cache"
    envs["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    envs["LIBCUDA_LOG_LEVEL"] = "0"
    lib = os.path.join(host_lib_dir, "nvidia")
    major = _cuda_major(cards)
    vgpu = os.path.join(work_dir(host_work_dir, grant_allocation_id(grant)), VGPU_DIR.lstrip("/"))
    mounts = (
        Mount("/etc/ld.so.preload", os.path.join(lib, "ld.so.preload"), read_only=True),
        Mount(
            "/usr/local/vgpu/libvgpu.so",
            os.path.join(lib, f"cuda-{major}", "libvgpu.so"),
            read_only=True,
        ),
        Mount("/tmp/vgpulock", "/tmp/vgpulock", read_only=False),  # HAMi's node-wide lock dir
        Mount(VGPU_DIR, vgpu, read_only=False),  # this container's shared usage cache
        Mount("/dev/shm", "/dev/shm", read_only=False),  # HAMi's shared-memory region
    )
    return Injection(envs=envs, mounts=mounts, host_dirs=(vgpu,))


def _memory_limit(grant: Grant, card: Card, tokens: int) -> int:
    """MiB: the pending container's own cap when the grant serves one, else the token share."""
    if grant.request is None:
        return _memory_share(card, tokens)
    if not card.memory_mib:
        raise errors.CannotInject(f"card {card_name(card)} reports no memory size to slice")
    return max(1, pending.memory_cap_mib(grant.request, card.memory_mib))


def _memory_share(card: Card, tokens: int) -> int:
    if not card.memory_mib or not card.sliced_count:
        raise errors.CannotInject(f"card {card_name(card)} reports no memory size to slice")
    return max(1, card.memory_mib * tokens // card.sliced_count)


def _percent(card: Card, tokens: int) -> int:
    return max(1, min(100, 100 * tokens // max(1, card.sliced_count)))


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
        envs[f"VROCM_DEVICE_MEMORY_LIMIT_{position}"] = str(_memory_limit(grant, card, len(tokens)))
        percent = pending.cores_percentage(grant.request) if grant.request is not None else None
        masks.append(f"{position}:{cu_mask(card, tokens, percent=percent)}")
    envs["HSA_CU_MASK"] = ";".join(masks)
    envs["LIBVROCM_LOG_LEVEL"] = "1"
    lib = os.path.join(host_lib_dir, "amd")
    mounts = (
        Mount("/etc/ld.so.preload", os.path.join(lib, "ld.so.preload"), read_only=True),
        Mount(VROCM_LIBRARY, os.path.join(lib, "libvrocm.so"), read_only=True),
    )
    return Injection(envs=envs, mounts=mounts, devices=tuple(devices))


def cu_mask(card: Card, tokens: tuple[int, ...], *, percent: int | None = None) -> str:
    """The compute units a sliced share of ``card`` may use, as an ``HSA_CU_MASK`` CU list.

    ``percent``: the container's own ``.sliced.cores-percentage`` (a pending request): the run
    is ``floor(C·percent/100)`` CUs, starting where its lowest slice falls but moved down so it
    ends on the last CU at the latest. Otherwise, the token share:

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
    if percent is not None:
        count = total * percent // 100
        if count < 1:
            least = -(-100 // total)
            raise errors.CannotInject(
                f"{percent}% of the {total} compute units of card {card_name(card)} is below "
                f"one; ask for at least {least}% cores"
            )
        start = min(total * min(tokens) // slices, total - count)
        return str(start) if count == 1 else f"{start}-{start + count - 1}"
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
