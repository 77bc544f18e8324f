"""The desired ``Devices`` and ``NodeModelStore`` of a node, from its ledger state (pure).

Both are cluster-scoped, named after the node and owned by the Node (an owner reference, so the
garbage collector removes them with it; the reconciler also deletes them explicitly). Bodies are
plain JSON-ready dicts in the CRD's camelCase shape; ``spec.groups`` is exactly what
``dm detect`` prints, because both are encoded from the same :mod:`bus.devices` Structs.

Both objects' ``spec`` and ``status`` are owned whole (:data:`~.planning.WHOLE`): the control
plane alone writes them (a user's edit of the NodeModelStore spec is kept by the three-way merge
of :mod:`controlplane.stores.storespec` before planning), and every field their CRDs default is named, so
a key the desired object stops naming (a finished download's ``status.downloading``, a proxy
removed from the settings) is removed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

import msgspec

from bus import events
from controlplane.reconciling import allocating, storing
from controlplane.reconciling.nodestates import NodeState
from controlplane.reconciling.planning import WHOLE, Desired

__all__ = ["NMS_SPEC_DEFAULT", "devices", "node_model_store", "owner_references"]

NMS_SPEC_DEFAULT: Final[dict[str, Any]] = {
    "watermarks": {"highPercent": 80, "lowPercent": 70},
    "download": {"concurrency": 8, "bytesPerSecond": 0, "peerSync": True},
    "hub": {"huggingFaceEndpoint": "https://huggingface.co"},
}


def owner_references(node: str, uid: str | None) -> list[dict[str, Any]]:
    """The Node as owner; none without a uid (standalone mode has no Node objects)."""
    if not uid:
        return []
    return [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]


def _metadata(node: str, uid: str | None) -> dict[str, Any]:
    owners = owner_references(node, uid)
    return {"ownerReferences": owners} if owners else {}


def devices(node: str, uid: str | None, state: NodeState) -> tuple[Desired | None, int]:
    """The desired ``Devices`` (None before the first devices event) and unknown device tokens."""
    if state.groups is None:
        return None, 0
    status = allocating.devices_status(state.groups, state.allocations)
    # Through JSON, not ``to_builtins``: that keeps tuples, which never equal the lists an
    # observed object holds, so every reconcile would re-patch an unchanged spec.
    spec = {"groups": msgspec.json.decode(msgspec.json.encode(state.groups))}
    desired = Desired(metadata=_metadata(node, uid), spec=spec, status=status.body, whole=WHOLE)
    return desired, status.unknown_tokens


def node_model_store(
    node: str,
    uid: str | None,
    state: NodeState,
    spec: dict[str, Any] | None = None,
    *,
    now: datetime | None = None,
) -> Desired | None:
    """The desired ``NodeModelStore``: the spec the control plane sets, status from ``models``.

    Conditions are stamped ``now``; the reconciler settles them against the observed object
    (see :mod:`controlplane.reconciling.storing`).
    """
    if state.models is None and state.groups is None:
        return None
    spec = spec or NMS_SPEC_DEFAULT
    status = storing.store_status(
        state.models, state.store, spec=spec, now=now if now is not None else events.now()
    )
    return Desired(metadata=_metadata(node, uid), spec=spec, status=status, whole=WHOLE)
