"""Ascend: ``ASCEND_VISIBLE_DEVICES`` for the Ascend Docker Runtime, vcann-rt when sliced.

The runtime (RuntimeClass ``ascend``) makes ``/dev/davinci<N>`` and the shared nodes from the
env, so every mode answers with the env, naming the cards by **physical id** (the number in
``/dev/davinci<N>``; DCMI's logic id, the accelerator index, differs on some hosts). Detection
reports it as the accelerator's first physical index; a card without one is refused rather than
guessed from its index.

Shared, visibility and sliced grants can put a second tenant on a card, which the driver allows
only with its container-share flag on: those grants carry an ``ascend-container-share`` step per
card. Exclusive never touches the flag.

A sliced grant is one card per container (vcann-rt virtualises one NPU) and adds vcann-rt: the
preload list and ``libvruntime.so`` from ``<lib>/ascend/cann-<major>-<variant>/`` (the CANN major
of ``runtimeVersion``, 8 when the host reports none; the CANN variant is the group's ``family``),
its ``enpu-monitor`` reader, ``/dev/shm``, and a per-container ``npu_info.config`` the plugin
writes in the allocation's work directory: the physical id, a virtual NPU id (the lowest slice
token held, unique among the card's live tenants because tokens are exclusive), the AI-core
quota in percent and the memory quota in MiB.
"""

from __future__ import annotations

import os

from agent.deviceplugin import errors
from agent.deviceplugin.allocation import Grant, card_name
from agent.deviceplugin.injection import DriverStep, HostFile, Injection, Mount
from agent.deviceplugin.resources import Card
from agent.deviceplugin.slicing import (
    Where,
    cores_percent,
    grant_work_dir,
    memory_limit,
    no_partitions,
    single_card,
    visible,
)

VISIBLE = "ASCEND_VISIBLE_DEVICES"
CONTAINER_SHARE = "ascend-container-share"
DEFAULT_CANN_MAJOR = 8
VCANN = "/opt/enpu/vcann-rt"
RUNTIME_LIBRARY = f"{VCANN}/lib/libvruntime.so"
MONITOR = f"{VCANN}/tools/enpu-monitor"
CONFIG = "/etc/enpu/vcann-rt/npu_info.config"


def physical_id(card: Card) -> int:
    """:raises errors.CannotInject: detection reported no physical id for the card."""
    if not card.physical_indexes:
        raise errors.CannotInject(
            f"card {card_name(card)} reports no physical id (the N of /dev/davinci<N>)"
        )
    return card.physical_indexes[0]


def respond(grant: Grant, where: Where) -> Injection:
    if grant.mode == "partitioned":
        raise no_partitions("ascend")
    cards = [c for c, _ in grant.cards]
    envs = {VISIBLE: visible(cards, physical_id)}
    steps: tuple[DriverStep, ...] = ()
    if grant.mode != "exclusive":
        steps = tuple(
            DriverStep(CONTAINER_SHARE, c.id, (("physical-id", str(physical_id(c))),))
            for c in cards
        )
    if grant.mode != "sliced":
        return Injection(envs=envs, steps=steps)
    card, tokens = single_card(grant, "vcann-rt")
    lib = where.lib("ascend", f"cann-{_cann_major(card)}-{_variant(card)}")
    work = grant_work_dir(grant, where.host_work_dir)
    config = os.path.join(work, "npu_info.config")
    lines = (
        f"physical-npu-id={physical_id(card)}",
        f"vnpu-id={min(tokens)}",
        f"aicore-quota={cores_percent(grant)}",
        f"memory-quota={memory_limit(grant, card, len(tokens))}",
    )
    envs |= {"ENPU_LOG_LEVEL": "1", "ENPU_DSMI_HOOK": "1"}
    mounts = (
        Mount("/etc/ld.so.preload", os.path.join(lib, "ld.so.preload"), read_only=True),
        Mount(RUNTIME_LIBRARY, os.path.join(lib, "libvruntime.so"), read_only=True),
        Mount(MONITOR, os.path.join(lib, "enpu-monitor"), read_only=True),
        Mount(CONFIG, config, read_only=True),
        Mount("/dev/shm", "/dev/shm", read_only=False),
    )
    return Injection(
        envs=envs,
        mounts=mounts,
        host_dirs=(work,),
        files=(HostFile(config, "\n".join(lines) + "\n"),),
        steps=steps,
    )


def _cann_major(card: Card) -> int:
    major = (card.runtime_version or "").split(".")[0]
    return int(major) if major.isdigit() else DEFAULT_CANN_MAJOR


def _variant(card: Card) -> str:
    """The CANN variant vcann-rt is built for (``910b``, ``310p``, ``a3``, ``950``…).

    :raises errors.CannotInject: the group reports no family.
    """
    family = "".join(ch for ch in (card.family or "").lower() if ch.isalnum())
    if not family:
        raise errors.CannotInject(
            f"card {card_name(card)} reports no family, so no vcann-rt build can be chosen"
        )
    return family
