"""Cambricon: device nodes and ``CAMBRICON_VISIBLE_DEVICES``, an sMLU instance when sliced.

Every mode passes each card's ``/dev/cambricon_dev<N>`` (N: the card's slot, its first physical
index, else its index), the per-card nodes the host has for that slot (``cambricon_ipcm``,
``commu``, ``cmsg_ctrl``, ``cambr-msgq:``, ``cambr-rpc:``), the control node
``/dev/cambricon_ctl`` and, where present, ``/dev/cambricon_gdr``; and names the slots in
``CAMBRICON_VISIBLE_DEVICES`` for hosts where the Cambricon runtime is the default.

A sliced grant is one card per container and needs an sMLU instance on it: a ``cambricon-smlu``
step asks for sMLU mode on the card and an instance of the profile ``mluQuota = cores%``,
``memorySize`` = the memory cap in MiB. No control performs it in this build, so sliced grants
are refused (``docs/injection.md`` says why: the instance's device node is known only once it
exists, and a control returns nothing the response could carry).
"""

from __future__ import annotations

from agent.deviceplugin.allocation import Grant
from agent.deviceplugin.injection import DeviceNode, DriverStep, Injection
from agent.deviceplugin.resources import Card
from agent.deviceplugin.slicing import (
    Where,
    cores_percent,
    memory_limit,
    no_partitions,
    single_card,
    visible,
)

VISIBLE = "CAMBRICON_VISIBLE_DEVICES"
CONTROL = "/dev/cambricon_ctl"
OPTIONAL_CONTROLS = ("/dev/cambricon_gdr",)
PER_CARD = ("/dev/cambricon_ipcm{}", "/dev/commu{}", "/dev/cmsg_ctrl{}", "/dev/cambr-msgq:{}",
            "/dev/cambr-rpc:{}")  # fmt: skip
SMLU = "cambricon-smlu"


def slot(card: Card) -> int:
    return card.physical_indexes[0] if card.physical_indexes else card.index


def respond(grant: Grant, where: Where) -> Injection:
    if grant.mode == "partitioned":
        raise no_partitions("cambricon")
    cards = [c for c, _ in grant.cards]
    nodes = [CONTROL, *(n for n in OPTIONAL_CONTROLS if where.exists(n))]
    for card in cards:
        nodes.append(f"/dev/cambricon_dev{slot(card)}")
        nodes += [p.format(slot(card)) for p in PER_CARD if where.exists(p.format(slot(card)))]
    devices = tuple(DeviceNode(n, n, "rw") for n in nodes)
    envs = {VISIBLE: visible(cards, slot)}
    if grant.mode != "sliced":
        return Injection(envs=envs, devices=devices)
    card, tokens = single_card(grant, "sMLU")
    step = DriverStep(
        SMLU,
        card.id,
        (
            ("slot", str(slot(card))),
            ("mlu-quota", str(cores_percent(grant))),
            ("memory-mib", str(memory_limit(grant, card, len(tokens)))),
        ),
    )
    return Injection(envs=envs, devices=devices, steps=(step,))
