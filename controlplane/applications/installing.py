"""The thin I/O around :func:`.planning.plan`: read the inventory, get and verify every enabled
application's manifest, apply with server-side apply under the application's own field manager
(``gpustack-operator-<application>``), prune, record the inventory and each outcome.

The inventory and outcomes live in the ConfigMap ``gpustack-applications`` of the system
namespace (``inventory.json``, ``status.json``: ``kubectl get cm gpustack-applications -o yaml``
shows why an application is not installed). Only the leader runs this (``controlplane.worker.running``
starts it under the worker's Lease), once per leadership and again while something failed.

Objects are addressed without discovery: the resource's plural is derived from its kind (the
Kubernetes convention) and an object is namespaced exactly when its manifest names a namespace,
which holds for rendered release manifests (kustomize and Helm output set it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
import msgspec

from controlplane import errors
from controlplane.applications import configuring, manifests, planning
from controlplane.applications.pins import Pin
from controlplane.k8s.client import KubeClient
from controlplane.resources import CONFIGMAPS, Ref, Resource

__all__ = ["INVENTORY", "Catalog", "Outcome", "install", "keep_installed", "resource_of"]

log = logging.getLogger(__name__)

INVENTORY: Final = "gpustack-applications"
TRANSIENT: Final = frozenset({"fetch-failed", "apply-failed"})
"""Refusals worth another try; the others (a wrong checksum, no pin, no source, an invalid
manifest) need a new pin or mirror, which comes with a new worker."""
Own = Callable[[], list[dict[str, Any]]]
"""An application of this project: its objects, rendered by the worker (no pin, no fetch)."""


@dataclass(frozen=True, kw_only=True)
class Catalog:
    """Where every application's objects come from, and where the inventory is kept: one value
    for :func:`install` and :func:`keep_installed` alike."""

    namespace: str
    pins: Mapping[str, Pin]
    own: Mapping[str, Own]
    mirror: str | None = None
    """``--applications-mirror`` (:func:`.manifests.location`); None: the pins' URLs."""


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    state: str
    """``installed``, ``pruned``, or the refusal's
    reason (``checksum-mismatch``, ``unpinned``, ``no-source``, ``fetch-failed``, ``invalid``,
    ``apply-failed``)."""
    version: str = ""
    message: str = ""


def resource_of(api_version: str, kind: str, namespaced: bool) -> Resource:
    """The REST resource of a kind (plural by the Kubernetes naming convention)."""
    group, _, version = api_version.rpartition("/")
    lower = kind.lower()
    if lower.endswith(("s", "x", "ch", "sh")):
        plural = f"{lower}es"
    elif lower.endswith("y") and lower[-2:-1] not in "aeiou":
        plural = f"{lower[:-1]}ies"
    else:
        plural = f"{lower}s"
    if lower == "endpoints":
        plural = lower
    return Resource(group=group, version=version, plural=plural, kind=kind, namespaced=namespaced)


def _ref(ident: planning.Identity) -> Ref:
    api_version, kind, namespace, name = ident
    resource = resource_of(api_version, kind, bool(namespace))
    return Ref(resource=resource, name=name, namespace=namespace or None)


async def _inventory(api: KubeClient, namespace: str) -> dict[str, planning.Entry]:
    try:
        cm = await api.get(Ref(resource=CONFIGMAPS, name=INVENTORY, namespace=namespace))
    except errors.NotFound:
        return {}
    text = (cm.get("data") or {}).get("inventory.json") or "{}"
    try:
        return msgspec.json.decode(text, type=dict[str, planning.Entry])
    except msgspec.ValidationError as e:
        log.warning("the applications inventory is unreadable (%s); starting a new one", e)
        return {}


async def _desired(
    api: KubeClient, catalog: Catalog, enabled: frozenset[str]
) -> tuple[dict[str, tuple[str, list[dict[str, Any]]]], dict[str, Outcome]]:
    desired: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    failed: dict[str, Outcome] = {}
    for app in sorted(enabled):
        if app in catalog.own:
            desired[app] = ("own", configuring.configure(app, "own", catalog.own[app]()))
            continue
        pin = catalog.pins.get(app)
        if pin is None:
            failed[app] = Outcome(state="unpinned", message=f"{app}: this build has no pin for it")
            continue
        try:
            manifests.require_checksum(pin)
            data = await manifests.fetch(pin, catalog.mirror, api=api, namespace=catalog.namespace)
            manifests.verify(pin, data)
            objects = configuring.configure(app, pin.version, manifests.parse(pin, data))
        except manifests.ManifestError as e:
            log.warning("application %s not installed: %s", app, e)
            failed[app] = Outcome(state=e.reason, version=pin.version, message=str(e))
            continue
        desired[app] = (pin.version, objects)
    return desired, failed


async def _prune(api: KubeClient, app: str, ident: planning.Identity) -> None:
    ref = _ref(ident)
    try:
        live = await api.get(ref)
        if ((live.get("metadata") or {}).get("labels") or {}).get(configuring.LABEL) != app:
            log.warning("not pruning %s %s: it no longer carries %s's label", *ident[1:4:2], app)
            return
        await api.delete(ref)
    except errors.NotFound:
        return
    log.info("application %s: pruned %s %s", app, ident[1], ident[3])


async def _apply(
    api: KubeClient,
    planned: planning.Plan,
    desired: Mapping[str, tuple[str, list[dict[str, Any]]]],
    outcomes: dict[str, Outcome],
) -> set[str]:
    """Apply in plan order; an application stops at its first failure. The broken ones."""
    broken: set[str] = set()
    for app, obj in planned.apply:
        if app in broken:
            continue
        ref = _ref(planning.identity(obj))
        try:
            await api.apply(ref, obj, field_manager=f"gpustack-operator-{app}")
        except errors.ApiError as e:
            log.warning("application %s: applying %s %s failed: %s", app, obj["kind"],
                        ref.name, e)  # fmt: skip
            broken.add(app)
            outcomes[app] = Outcome(state="apply-failed", version=desired[app][0], message=str(e))
    return broken


async def install(api: KubeClient, enabled: frozenset[str], catalog: Catalog) -> dict[str, Outcome]:
    """One pass: every enabled application installed or refused, every disabled one pruned."""
    namespace = catalog.namespace
    inventory = await _inventory(api, namespace)
    desired, outcomes = await _desired(api, catalog, enabled)
    planned = planning.plan(desired, inventory, failed=outcomes)
    broken = await _apply(api, planned, desired, outcomes)
    for app, ident in planned.prune:
        if app not in broken:  # a half-applied upgrade keeps what it had
            await _prune(api, app, ident)
    for app, (version, objs) in desired.items():
        if app not in broken:
            outcomes.setdefault(app, Outcome(state="installed", version=version))
            log.info("application %s %s: %d objects applied", app, version, len(objs))
    for app in set(inventory) - set(planned.inventory):
        outcomes[app] = Outcome(state="pruned", version=inventory[app].version)
    inv = planning.settle(planned.inventory, inventory, broken)
    await _record(api, namespace, inv, outcomes)
    return outcomes


async def _record(
    api: KubeClient, namespace: str, inventory: dict[str, planning.Entry],
    outcomes: dict[str, Outcome],
) -> None:  # fmt: skip
    body = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": INVENTORY, "namespace": namespace,
                     "labels": configuring.MANAGED_BY},
        "data": {
            "inventory.json": msgspec.json.encode(inventory).decode(),
            "status.json": json.dumps(
                {a: msgspec.to_builtins(o) for a, o in sorted(outcomes.items())}, sort_keys=True
            ),
        },
    }  # fmt: skip
    await api.apply(Ref(resource=CONFIGMAPS, name=INVENTORY, namespace=namespace), body)


async def keep_installed(
    api: KubeClient, enabled: frozenset[str], catalog: Catalog, *, retry_s: float = 300.0
) -> None:
    """Install once; while an application failed for a transient reason, again every
    ``retry_s``."""
    while True:
        try:
            outcomes = await install(api, enabled, catalog)
        except errors.ApiError as e:
            log.warning("installing the applications failed: %s", e)
        else:
            if not any(o.state in TRANSIENT for o in outcomes.values()):
                return
        await anyio.sleep(retry_s)
