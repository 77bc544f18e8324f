"""The kinds a subscription may name, and the pure decisions about a cluster's readiness.

The eight ``worker.gpustack.ai/v1`` kinds the reference gateway mirrors (:data:`KINDS`, with
their scope); a subscribed kind is kept by list+watch, the others are listed live per request.
A kind a cluster does not serve (this build's worker serves no Instance kinds) answers 404 and
is read as empty: the request is still answered for every other kind and cluster.

Readiness: a cluster is read only once both APIServices, ``v1.worker.gpustack.ai`` and
``v1.gpustack.ai``, have the condition ``Available`` with status ``"True"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

import msgspec

__all__ = [
    "APISERVICES",
    "GROUP",
    "KINDS",
    "Kind",
    "backoff",
    "collection_path",
    "not_ready_reason",
    "parse_gvk",
]

GROUP: Final = "worker.gpustack.ai"
VERSION: Final = "v1"
APISERVICES: Final = ("v1.worker.gpustack.ai", "v1.gpustack.ai")


class Kind(msgspec.Struct, frozen=True):
    kind: str
    plural: str
    namespaced: bool


KINDS: Final[Mapping[str, Kind]] = {
    k.kind: k
    for k in (
        Kind("Devices", "devices", False),
        Kind("InstanceTypeFlavor", "instancetypeflavors", False),
        Kind("InstanceType", "instancetypes", False),
        Kind("Instance", "instances", True),
        Kind("InstancePersistentVolumeType", "instancepersistentvolumetypes", False),
        Kind("InstancePersistentVolume", "instancepersistentvolumes", True),
        Kind("InstanceImagePullSecret", "instanceimagepullsecrets", True),
        Kind("InstanceSSHPublicKey", "instancesshpublickeys", True),
    )
}
BY_PLURAL: Final[Mapping[str, Kind]] = {k.plural: k for k in KINDS.values()}


class BadGvk(ValueError):
    pass


def parse_gvk(text: str) -> tuple[str, str, str]:
    """``group/version/kind``, or ``version/kind`` for the core group; :raises BadGvk:."""
    parts = text.split("/")
    if len(parts) == 2:
        parts.insert(0, "")
    if len(parts) != 3 or not all(parts[1:]):
        raise BadGvk(f"gvk {text[:100]!r}: group/version/kind or version/kind")
    return parts[0], parts[1], parts[2]


def served(gvk: tuple[str, str, str]) -> Kind | None:
    """The kind a gvk names among :data:`KINDS`; None for any other (skipped, as the reference)."""
    group, version, kind = gvk
    return KINDS.get(kind) if (group, version) == (GROUP, VERSION) else None


def collection_path(kind: Kind, namespace: str | None = None) -> str:
    if namespace and kind.namespaced:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{kind.plural}"
    return f"/apis/{GROUP}/{VERSION}/{kind.plural}"


def apiservice_path(name: str) -> str:
    return f"/apis/apiregistration.k8s.io/v1/apiservices/{name}"


def not_ready_reason(name: str, body: Mapping[str, Any]) -> str | None:
    """Why the APIService ``body`` is not available; None when ``Available`` is ``"True"``."""
    for condition in (body.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Available":
            if condition.get("status") == "True":
                return None
            why = condition.get("message") or condition.get("reason") or condition.get("status")
            return f'api service "{name}" is not ready: {why}'
    return f'api service "{name}" is not ready: no Available condition'


def backoff(first_s: float, cap_s: float) -> Iterator[float]:
    """Pauses between failed readiness checks: ``first_s`` doubling up to ``cap_s``, forever."""
    pause = first_s
    while True:
        yield pause
        pause = min(pause * 2, cap_s)
