"""What each vendor's container runtime needs to see the granted cards: env, mounts, devices.

Pure: a :class:`allocation.Grant` in, a ``ContainerAllocateResponse`` out. Per-card keys
(``CUDA_DEVICE_MEMORY_LIMIT_<i>``) follow the order of the visible-devices list, which is
ascending accelerator index, because that is the order the CUDA runtime numbers them in.

- NVIDIA: ``NVIDIA_VISIBLE_DEVICES=<UUIDs>``; sliced adds the HAMi-core limits and mounts the
  preload library from the host library directory; partitioned names MIG devices as
  ``<GPU index>:<MIG index>`` (the instance must already exist: this plugin creates none).
- AMD: ``/dev/kfd`` and each card's ``/dev/dri/card<N>`` and ``/dev/dri/renderD<M>`` as devices,
  ``ROCR_VISIBLE_DEVICES=<UUIDs>``, and ``AMD_VISIBLE_DEVICES=none`` so AMD's container toolkit
  does not add every card on top.
"""

from __future__ import annotations

import os

from agent.deviceplugin import errors
from agent.deviceplugin.allocation import Grant, card_name
from agent.deviceplugin.resources import Card
from proto.deviceplugin import v1beta1 as dp

DEFAULT_CUDA_MAJOR = 12
"""The libvgpu build to mount when the driver reports no CUDA version."""


def respond(grant: Grant, *, host_lib_dir: str) -> dp.ContainerAllocateResponse:
    """The runtime injection for ``grant``.

    :raises errors.CannotInject: the vendor is unsupported or a card lacks a needed fact.
    """
    if not grant.cards:
        raise errors.CannotInject("nothing granted")
    manufacturer = grant.cards[0][0].manufacturer
    if manufacturer == "nvidia":
        return _nvidia(grant, host_lib_dir)
    if manufacturer == "amd":
        return _amd(grant)
    raise errors.CannotInject(f"no runtime injection for manufacturer {manufacturer!r}")


def _nvidia(grant: Grant, host_lib_dir: str) -> dp.ContainerAllocateResponse:
    cards = [card for card, _ in grant.cards]
    if grant.mode == "partitioned":
        migs = [f"{card.index}:{i}" for card, indexes in grant.cards for i in indexes]
        return dp.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(migs)})
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(c.id for c in cards)}
    if grant.mode != "sliced":
        return dp.ContainerAllocateResponse(envs=envs)
    shares = [(card, len(indexes)) for card, indexes in grant.cards]
    for position, (card, tokens) in enumerate(shares):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{position}"] = f"{_memory_share(card, tokens)}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(min(_percent(card, tokens) for card, tokens in shares))
    envs["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    envs["LIBCUDA_LOG_LEVEL"] = "0"
    lib = os.path.join(host_lib_dir, "nvidia")
    major = _cuda_major(cards)
    mounts = [
        dp.Mount("/etc/ld.so.preload", os.path.join(lib, "ld.so.preload"), read_only=True),
        dp.Mount(
            "/usr/local/vgpu/libvgpu.so",
            os.path.join(lib, f"cuda-{major}", "libvgpu.so"),
            read_only=True,
        ),
        dp.Mount("/tmp/vgpulock", "/tmp/vgpulock", read_only=False),  # HAMi's lock dir
    ]
    return dp.ContainerAllocateResponse(envs=envs, mounts=mounts)


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


def _amd(grant: Grant) -> dp.ContainerAllocateResponse:
    devices = [dp.DeviceSpec("/dev/kfd", "/dev/kfd", "rw")]
    for card, _ in grant.cards:
        if len(card.physical_indexes) < 2:
            raise errors.CannotInject(f"card {card_name(card)} lacks its /dev/dri node numbers")
        card_node, render_node = card.physical_indexes[:2]
        nodes = (f"/dev/dri/card{card_node}", f"/dev/dri/renderD{render_node}")
        devices.extend(dp.DeviceSpec(node, node, "rw") for node in nodes)
    envs = {
        "ROCR_VISIBLE_DEVICES": ",".join(card.id for card, _ in grant.cards),
        "AMD_VISIBLE_DEVICES": "none",
    }
    return dp.ContainerAllocateResponse(envs=envs, devices=devices)
