"""The responders of the seven manufacturers beyond NVIDIA and AMD, one module each.

Each module's ``respond(grant, where)`` is pure: a :class:`allocation.Grant` and the host paths
(:class:`slicing.Where`) in, an :class:`injection.Injection` out. The rule they share: a vendor
whose container runtime makes the device nodes (Ascend, Iluvatar, MThreads: the Pod runs under
that RuntimeClass) gets only its visible-devices env; the others (Cambricon, Hygon, MetaX,
T-Head) get the granted cards' device nodes and the node-level control nodes. Sliced grants add
the vendor's slicing runtime; a change of driver state a grant needs (Ascend's container-share
flag, a Cambricon sMLU instance, a MetaX sGPU) travels as a :class:`injection.DriverStep`.

Modules: :mod:`.ascend`, :mod:`.cambricon`, :mod:`.hygon`, :mod:`.iluvatar`, :mod:`.metax`,
:mod:`.mthreads`, :mod:`.thead`.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.deviceplugin.allocation import Grant
from agent.deviceplugin.injection import Injection
from agent.deviceplugin.slicing import Where
from agent.deviceplugin.vendors import ascend, cambricon, hygon, iluvatar, metax, mthreads, thead

Responder = Callable[[Grant, Where], Injection]

RESPONDERS: dict[str, Responder] = {
    "ascend": ascend.respond,
    "cambricon": cambricon.respond,
    "hygon": hygon.respond,
    "iluvatar": iluvatar.respond,
    "metax": metax.respond,
    "mthreads": mthreads.respond,
    "thead": thead.respond,
}
