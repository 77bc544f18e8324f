"""Moore Threads: ``MTHREADS_VISIBLE_DEVICES`` for the MT container toolkit, QoS env when sliced.

The toolkit (RuntimeClass ``mthreads``) injects the driver and the device nodes, so every mode
answers with the env alone, naming cards by index. Slicing is the host's sGPU kernel module,
configured per container by the toolkit from two variables: ``MTHREADS_QOS_MEMORY_LIMIT``, a hard
memory cap in **bytes**, and ``MTHREADS_QOS_COMPUTING_POWER_WEIGHT``, the cores percentage as a
scheduling **weight** (not a cap: a tenant alone on a card may use all of it). One variable per
container, so a sliced grant is one card.
"""

from __future__ import annotations

from agent.deviceplugin.allocation import Grant
from agent.deviceplugin.injection import Injection
from agent.deviceplugin.slicing import (
    Where,
    cores_percent,
    memory_limit,
    no_partitions,
    single_card,
    visible,
)

VISIBLE = "MTHREADS_VISIBLE_DEVICES"
MEMORY_LIMIT = "MTHREADS_QOS_MEMORY_LIMIT"
WEIGHT = "MTHREADS_QOS_COMPUTING_POWER_WEIGHT"


def respond(grant: Grant, where: Where) -> Injection:
    if grant.mode == "partitioned":
        raise no_partitions("mthreads")
    envs = {VISIBLE: visible([c for c, _ in grant.cards], lambda c: c.index)}
    if grant.mode != "sliced":
        return Injection(envs=envs)
    card, tokens = single_card(grant, "the sGPU module")
    envs[MEMORY_LIMIT] = str(memory_limit(grant, card, len(tokens)) << 20)
    envs[WEIGHT] = str(cores_percent(grant))
    return Injection(envs=envs)
