"""Iluvatar CoreX: ``IX_VISIBLE_DEVICES`` for ix-container-runtime, HAMi-core when sliced.

The runtime (RuntimeClass ``iluvatar``) makes ``/dev/iluvatar<minor>`` and mounts corex from the
env, so every mode answers with the env alone, naming the cards by enumeration index (the
numbering the runtime's own examples use). CoreX is CUDA-compatible, so a sliced grant adds
HAMi-core exactly as NVIDIA's does, from one flat library directory (no CUDA-major subdirectory:
the CUDA 12 build serves corex's ``libcuda.so.1``).
"""

from __future__ import annotations

from agent.deviceplugin.allocation import Grant
from agent.deviceplugin.injection import Injection
from agent.deviceplugin.slicing import Where, hami_core, no_partitions, visible

VISIBLE = "IX_VISIBLE_DEVICES"


def respond(grant: Grant, where: Where) -> Injection:
    if grant.mode == "partitioned":
        raise no_partitions("iluvatar")
    envs = {VISIBLE: visible([c for c, _ in grant.cards], lambda c: c.index)}
    if grant.mode != "sliced":
        return Injection(envs=envs)
    return hami_core(grant, envs, where.lib("iluvatar"), where.host_work_dir)
