"""MetaX: device nodes (no runtime), an sGPU subdevice when sliced.

No container runtime serves MetaX, so every mode passes the control node ``/dev/mxcd`` (plus
``/dev/mxnd`` and ``/dev/mxgd`` where the host has them) and each card's ``/dev/dri/card<N>``
and ``/dev/dri/renderD<M>`` (the accelerator's two physical indexes).

A sliced grant is one card per container and needs an sGPU subdevice on it: a ``metax-sgpu``
step asks for one under the card's PCI address (``/sys/bus/pci/devices/<BDF>/sgpu``), with the
subdevice index (the lowest slice token held, unique among the card's live tenants), the compute
quota in percent under the ``fixed-share`` class and the memory cap in MiB; the container is told
which one it got through ``METAX_SGPUS``. No control performs the step in this build (the sysfs
syntax is unpublished; ``docs/injection.md``), so sliced grants are refused.
"""

from __future__ import annotations

from agent.deviceplugin import errors
from agent.deviceplugin.allocation import Grant, card_name
from agent.deviceplugin.injection import DeviceNode, DriverStep, Injection
from agent.deviceplugin.slicing import (
    Where,
    cores_percent,
    grant_allocation_id,
    memory_limit,
    no_partitions,
    single_card,
)

CONTROL = "/dev/mxcd"
OPTIONAL_CONTROLS = ("/dev/mxnd", "/dev/mxgd")
SGPU = "metax-sgpu"


def respond(grant: Grant, where: Where) -> Injection:
    if grant.mode == "partitioned":
        raise no_partitions("metax")
    nodes = [CONTROL, *(n for n in OPTIONAL_CONTROLS if where.exists(n))]
    for card, _ in grant.cards:
        if len(card.physical_indexes) < 2:
            raise errors.CannotInject(f"card {card_name(card)} lacks its /dev/dri node numbers")
        first, render = card.physical_indexes[:2]
        nodes += [f"/dev/dri/card{first}", f"/dev/dri/renderD{render}"]
    devices = tuple(DeviceNode(n, n, "rw") for n in nodes)
    if grant.mode != "sliced":
        return Injection(devices=devices)
    card, tokens = single_card(grant, "sGPU")
    if not card.pci_bus_id:
        raise errors.CannotInject(f"card {card_name(card)} reports no PCI address for its sGPU")
    compute, vram = cores_percent(grant), memory_limit(grant, card, len(tokens))
    alias = grant_allocation_id(grant).rsplit(":", 1)[-1]
    index = min(tokens)
    step = DriverStep(
        SGPU,
        card.id,
        (
            ("bdf", card.pci_bus_id),
            ("index", str(index)),
            ("policy", "fixed-share"),
            ("compute", str(compute)),
            ("vram-mib", str(vram)),
        ),
    )
    envs = {
        "METAX_SGPUS": f"sgpu={card.pci_bus_id}#{index};compute={compute};vram={vram};"
        f"alias={card.group}-{alias}"
    }
    return Injection(envs=envs, devices=devices, steps=(step,))
