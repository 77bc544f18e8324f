"""What every vendor's responder shares: work directories and a sliced share's caps. Pure.

A sliced container's caps come from the pending container it serves when there is one (its own
``.sliced.memory-*`` and ``.sliced.cores-percentage``), else from its token share of the card
(``tokens / logicalSliced.count``). Both round down, so a share never exceeds what it asked or
what its tokens are worth, and never drop below 1 (MiB, percent).

HAMi-core (:func:`hami_core`) is the slicing runtime of the CUDA-compatible vendors (NVIDIA,
Iluvatar): a preload library, the per-card memory caps, the SM cap, HAMi's node-wide lock
directory, ``/dev/shm`` and a per-allocation work directory at ``/tmp/vgpu``.

Work directories: kubelet's Allocate request names no pod, so a sliced container's work
directory is keyed by its allocation id (:func:`work_dir`); kubelet retrying the same container
gets the same directory.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from agent.deviceplugin import errors, pending
from agent.deviceplugin.allocation import Grant, card_name
from agent.deviceplugin.holdings import allocation_id
from agent.deviceplugin.injection import Injection, Mount
from agent.deviceplugin.resources import Card, device_id, resource_name

VGPU_DIR = "/tmp/vgpu"
"""HAMi-core's per-container work directory (container path)."""
VGPU_LIBRARY = "/usr/local/vgpu/libvgpu.so"
"""Where HAMi-core's preload library is mounted; the staged ``ld.so.preload`` names it."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Where:
    """The host paths a responder names, and how it asks whether an optional node exists."""

    host_lib_dir: str
    """Host directory of the staged slicing runtimes, one subdirectory per manufacturer."""
    host_work_dir: str
    """Host directory of the per-allocation work directories."""
    exists: Callable[[str], bool] = os.path.exists
    """Whether a host device node exists (optional per-card nodes are passed only if so)."""

    def lib(self, manufacturer: str, *parts: str) -> str:
        return os.path.join(self.host_lib_dir, manufacturer, *parts)


def visible(cards: list[Card] | tuple[Card, ...], number: Callable[[Card], int | str]) -> str:
    """A visible-devices value: the cards' numbers, comma separated, in grant order."""
    return ",".join(str(number(c)) for c in cards)


def no_partitions(manufacturer: str) -> errors.CannotInject:
    """The refusal of a partitioned grant on a vendor whose instances this build cannot make."""
    return errors.CannotInject(
        f"{manufacturer} partition instances are not created by this device plugin; "
        "a partitioned grant cannot name one"
    )


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


def grant_work_dir(grant: Grant, host_work_dir: str) -> str:
    return work_dir(host_work_dir, grant_allocation_id(grant))


def memory_limit(grant: Grant, card: Card, tokens: int) -> int:
    """MiB: the pending container's own cap when the grant serves one, else the token share.

    :raises errors.CannotInject: the card reports no memory size.
    """
    if grant.request is None:
        return memory_share(card, tokens)
    if not card.memory_mib:
        raise errors.CannotInject(f"card {card_name(card)} reports no memory size to slice")
    return max(1, pending.memory_cap_mib(grant.request, card.memory_mib))


def memory_share(card: Card, tokens: int) -> int:
    if not card.memory_mib or not card.sliced_count:
        raise errors.CannotInject(f"card {card_name(card)} reports no memory size to slice")
    return max(1, card.memory_mib * tokens // card.sliced_count)


def percent(card: Card, tokens: int) -> int:
    """``tokens`` of ``card``'s slices as a whole percentage of it, 1 to 100."""
    return max(1, min(100, 100 * tokens // max(1, card.sliced_count)))


def cores_percent(grant: Grant) -> int:
    """The compute cap in percent: the pending container's own, else the smallest token share
    among the granted cards."""
    if grant.request is not None:
        return pending.cores_percentage(grant.request)
    return min(percent(card, len(tokens)) for card, tokens in grant.cards)


def single_card(grant: Grant, runtime: str) -> tuple[Card, tuple[int, ...]]:
    """The one card of a sliced grant whose runtime confines a container to one card.

    :raises errors.CannotInject: the grant spans several cards.
    """
    if len(grant.cards) != 1:
        names = ", ".join(card_name(c) for c, _ in grant.cards)
        raise errors.CannotInject(f"{runtime} slices one card per container; granted {names}")
    return grant.cards[0]


def hami_core(grant: Grant, envs: dict[str, str], lib_dir: str, host_work_dir: str) -> Injection:
    """``envs`` (the vendor's visible-devices env) plus HAMi-core's caps and mounts.

    ``lib_dir`` is the host directory holding ``ld.so.preload`` and ``libvgpu.so``.
    """
    envs = dict(envs)
    for position, (card, tokens) in enumerate(grant.cards):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{position}"] = f"{memory_limit(grant, card, len(tokens))}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(cores_percent(grant))
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{VGPU_DIR}/cudevshr.cache"
    envs["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    envs["LIBCUDA_LOG_LEVEL"] = "0"
    vgpu = os.path.join(grant_work_dir(grant, host_work_dir), VGPU_DIR.lstrip("/"))
    mounts = (
        Mount("/etc/ld.so.preload", os.path.join(lib_dir, "ld.so.preload"), read_only=True),
        Mount(VGPU_LIBRARY, os.path.join(lib_dir, "libvgpu.so"), read_only=True),
        Mount("/tmp/vgpulock", "/tmp/vgpulock", read_only=False),  # HAMi's node-wide lock dir
        Mount(VGPU_DIR, vgpu, read_only=False),  # this container's shared usage cache
        Mount("/dev/shm", "/dev/shm", read_only=False),  # HAMi's shared-memory region
    )
    return Injection(envs=envs, mounts=mounts, host_dirs=(vgpu,))
