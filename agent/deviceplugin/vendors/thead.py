"""T-Head PPU: device nodes (no runtime, no visible-devices env), HGGC quotas when sliced.

No container runtime serves the PPU, so every mode passes the granted cards'
``/dev/alixpu_ppu<N>`` (N: the card's ordinal, its accelerator index) and the two shared control
nodes ``/dev/alixpu`` and ``/dev/alixpu_ctl``; the PPU SDK lives in the workload image.

A sliced grant adds the pair of preload libraries from the flat ``<lib>/thead`` directory —
``hggc_quota.so`` (enforcement) and ``hgml_dlsym_hook.so`` (so ``ppu-smi`` reports the quota) —
the ``ppu-monitor`` reader, ``HGGC_DEVICE_SM_LIMIT`` (always set, even at 100: the library
refuses a card whose figure is missing), ``HGGC_DEVICE_MEMORY_LIMIT_<i>`` per card in grant
order, and ``HGGC_LEDGER_PATH``, a per-container directory in the allocation's work directory
where the library keeps its usage region.
"""

from __future__ import annotations

import os

from agent.deviceplugin.allocation import Grant
from agent.deviceplugin.injection import DeviceNode, Injection, Mount
from agent.deviceplugin.slicing import (
    Where,
    cores_percent,
    grant_work_dir,
    memory_limit,
    no_partitions,
)

CONTROL_NODES = ("/dev/alixpu", "/dev/alixpu_ctl")
VPPU = "/usr/local/vppu"
QUOTA_LIBRARY = f"{VPPU}/hggc_quota.so"
HOOK_LIBRARY = f"{VPPU}/hgml_dlsym_hook.so"
MONITOR = f"{VPPU}/ppu-monitor"
LEDGER = "/tmp/hggc"


def respond(grant: Grant, where: Where) -> Injection:
    if grant.mode == "partitioned":
        raise no_partitions("thead")
    nodes = [*CONTROL_NODES, *(f"/dev/alixpu_ppu{c.index}" for c, _ in grant.cards)]
    devices = tuple(DeviceNode(n, n, "rw") for n in nodes)
    if grant.mode != "sliced":
        return Injection(devices=devices)
    envs = {"HGGC_DEVICE_SM_LIMIT": str(cores_percent(grant))}
    for position, (card, tokens) in enumerate(grant.cards):
        envs[f"HGGC_DEVICE_MEMORY_LIMIT_{position}"] = f"{memory_limit(grant, card, len(tokens))}m"
    envs |= {"HGGC_LEDGER_PATH": LEDGER, "LIBHGGC_LOG_LEVEL": "1"}
    lib = where.lib("thead")
    ledger = os.path.join(grant_work_dir(grant, where.host_work_dir), LEDGER.lstrip("/"))
    mounts = (
        Mount("/etc/ld.so.preload", os.path.join(lib, "ld.so.preload"), read_only=True),
        Mount(QUOTA_LIBRARY, os.path.join(lib, "hggc_quota.so"), read_only=True),
        Mount(HOOK_LIBRARY, os.path.join(lib, "hgml_dlsym_hook.so"), read_only=True),
        Mount(MONITOR, os.path.join(lib, "ppu-monitor"), read_only=True),
        Mount(LEDGER, ledger, read_only=False),
    )
    return Injection(envs=envs, mounts=mounts, devices=devices, host_dirs=(ledger,))
