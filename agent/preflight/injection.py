"""What a probe container receives: exactly the device plugin's Allocate injection.

The responders (:mod:`agent.deviceplugin.responders`) return plain data
(:class:`agent.deviceplugin.injection.Injection`), the same value the plugin encodes for kubelet,
so preflight uses it as it is and never touches the generated gRPC stubs (an import-linter
contract keeps grpclib out of this one-shot).

One difference from production, by design: the per-allocation work directories a sliced
injection mounts are rooted under preflight's scratch directory (:data:`WORK_DIR`), which is
removed at the end of the pass, instead of under the plugin's
``/var/lib/gpustack/operator/pods``; every other path is the plugin's own.
"""

from __future__ import annotations

import msgspec

from agent.deviceplugin import errors, responders
from agent.deviceplugin.allocation import Grant
from agent.deviceplugin.injection import DeviceNode, Injection, Mount
from agent.deviceplugin.resources import Mode, cards_of
from agent.errors import AgentError
from agent.preflight.settings import SCRATCH_DIR
from bus import devices

__all__ = ["WORK_DIR", "DeviceNode", "Injection", "InjectionError", "Mount", "respond"]

WORK_DIR = f"{SCRATCH_DIR}/pods"
"""Host root of the probes' work directories (inside the scratch preflight clears)."""


class InjectionError(AgentError):
    """The allocator refused to describe the injection for a card (the message says why)."""


def respond(
    group: devices.DeviceGroup,
    accelerator: devices.Accelerator,
    mode: Mode,
    *,
    host_lib_dir: str,
) -> Injection:
    """The injection the device plugin gives a container holding ``accelerator`` in ``mode``.

    Sliced asks for half the card (its first half of slice tokens), as the reference probe does.

    :raises InjectionError: when the responder refuses (the card lacks a needed fact).
    """
    one = msgspec.structs.replace(group, accelerators=(accelerator,))
    card = cards_of([one])[accelerator.id]
    tokens = tuple(range(max(1, card.sliced_count // 2))) if mode == "sliced" else (0,)
    grant = Grant(mode=mode, cards=((card, tokens),), holding=None)
    try:
        return responders.respond(grant, host_lib_dir=host_lib_dir, host_work_dir=WORK_DIR)
    except errors.DevicePluginError as e:
        raise InjectionError(str(e)) from e
