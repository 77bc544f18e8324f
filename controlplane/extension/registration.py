"""Registering the extension API with the aggregation layer, and what its views read.

:func:`apiservice` is the ``APIService`` ``v1.gpustack.ai`` (shipped as
``deploy/base/apiservice.yaml`` without a CA; applied by the worker at start with the CA that
verifies its serving certificate, as the webhook configurations are). :class:`LatestSamples`
keeps each node's latest utilization sample from the bus for ``nodeutilizations``.
"""

from __future__ import annotations

import base64
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from bus import events
from controlplane.admission.webhooks import WebhookSettings
from controlplane.extension import objects
from controlplane.k8s.client import KubeClient
from controlplane.resources import APISERVICES, Ref

__all__ = ["APISERVICE_NAME", "LatestSamples", "apiservice", "ensure"]

log = logging.getLogger(__name__)

APISERVICE_NAME: Final = f"{objects.VERSION}.{objects.GROUP}"


def apiservice(
    service: WebhookSettings,
    ca: bytes | None,
    *,
    group: str = objects.GROUP,
    version: str = objects.VERSION,
) -> dict[str, Any]:
    """The APIService routing ``group/version`` (``gpustack.ai/v1`` unless told) to the worker's
    Service; every group the worker serves is registered through this one shape."""
    spec: dict[str, Any] = {
        "group": group,
        "version": version,
        "service": {"namespace": service.namespace, "name": service.service, "port": service.port},
        "groupPriorityMinimum": 1000,
        "versionPriority": 15,
    }
    if ca:
        spec["caBundle"] = base64.b64encode(ca).decode()
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {
            "name": f"{version}.{group}",
            "labels": {
                "app.kubernetes.io/component": "worker",
                "app.kubernetes.io/part-of": "gpustack-operator",
            },
        },
        "spec": spec,
    }


async def ensure(
    api: KubeClient,
    service: WebhookSettings,
    ca: bytes,
    *,
    group: str = objects.GROUP,
    version: str = objects.VERSION,
) -> None:
    """Apply the APIService (server-side apply; idempotent, the CA replaces any other)."""
    body = apiservice(service, ca, group=group, version=version)
    name = body["metadata"]["name"]
    await api.apply(Ref(resource=APISERVICES, name=name), body)
    log.info("APIService %s applied", name)


class LatestSamples:
    """Each node's latest ``samples`` event, at most ``max_nodes`` (oldest dropped first)."""

    def __init__(self, max_nodes: int = 20_000) -> None:
        self._max = max_nodes
        self._by_node: OrderedDict[str, events.SamplesEvent] = OrderedDict()

    def record(self, event: events.Event) -> None:
        if not isinstance(event, events.SamplesEvent):
            return
        known = self._by_node.get(event.node)
        if known is not None and known.ts > event.ts:
            return  # an older sample replayed from the retained state
        self._by_node[event.node] = event
        self._by_node.move_to_end(event.node)
        while len(self._by_node) > self._max:
            self._by_node.popitem(last=False)

    def __call__(self) -> Mapping[str, events.SamplesEvent]:
        return dict(self._by_node)
