"""Shared by the admission tests: Pods, AdmissionReview documents, a JSON Patch applier, a catalog.

The applier is written here (RFC 6902 ``add``/``replace`` with RFC 6901 pointers) rather than
taken from the code under test, so a wrong path or a missing ``~1`` escape fails the tests.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from bus.devices import DeviceGroup
from controlplane.admission.cards import cards_of
from controlplane.admission.requests import Card

HERE = Path(__file__).parent
H200 = msgspec.json.decode(
    (HERE / "controlplane_detect_h200x8.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
H100_MIG = msgspec.json.decode(
    (HERE / "controlplane_detect_h100x8_mig.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
GROUP = "acceleratable.feature.gpustack.ai/"
H200_MIB = 143771
H100_MIB = 81559


class Catalog:
    """A fixed catalog (the pure tests' stand-in for the ledger)."""

    def __init__(self, groups: Sequence[DeviceGroup] = (*H200, *H100_MIG)) -> None:
        self._cards = cards_of({f"node-{i}": (g,) for i, g in enumerate(groups)})

    def card(self, group: str) -> Card | None:
        return self._cards.get(group)

    def cards(self, manufacturer: str) -> Sequence[Card]:
        return [c for c in self._cards.values() if c.manufacturer == manufacturer]


def container(name: str = "main", limits: dict[str, str] | None = None, **extra: Any) -> Any:
    """A container; requests are defaulted from limits as the API server does before admission."""
    out: dict[str, Any] = {"name": name, "image": "busybox", **extra}
    if limits is not None:
        out["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    return out


def pod(*containers: Any, init: Sequence[Any] = (), **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": body}  # fmt: skip


def review(obj: Any, *, kind: str = "Pod", operation: str = "CREATE") -> dict[str, Any]:
    """An AdmissionReview as kube-apiserver sends it for a Pod CREATE."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": f"{kind.lower()}s"},
            "requestKind": {"group": "", "version": "v1", "kind": kind},
            "requestResource": {"group": "", "version": "v1", "resource": f"{kind.lower()}s"},
            "namespace": "team-a",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def _tokens(path: str) -> list[str]:
    assert path.startswith("/"), path
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 ``add``/``replace``: a missing parent is an error, as in the API server."""
    doc = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        *parents, last = _tokens(op["path"])
        target = doc
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), op["value"])
        else:
            assert op["op"] == "add" or last in target, op
            target[last] = op["value"]
    return doc


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The decoded JSON Patch of an answer (empty when it carries none)."""
    if "patch" not in response:
        assert "patchType" not in response
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops
