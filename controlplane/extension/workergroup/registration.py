"""The APIService ``v1.worker.gpustack.ai``: routing the group to the worker's Service.

Shipped as ``deploy/base/worker-apiservice.yaml`` without a CA (a test keeps it equal to
:func:`apiservice`), applied again by the worker at start with the CA that verifies its serving
certificate, as ``v1.gpustack.ai`` is. Its ``Available`` condition is kube-apiserver's: the
aggregator GETs ``/apis/worker.gpustack.ai/v1``, which the worker answers 200 only once every
served collection has listed (:meth:`WorkerGroupApi.served`).

Priorities: ``groupPriorityMinimum`` 1000 as the CRDs' own ``v1alpha1.worker.gpustack.ai``,
``versionPriority`` 15, below theirs (100), so ``v1alpha1`` stays the group's preferred
version. The reference makes ``v1`` preferred, but the garbage collector and the namespace
controller read every preferred resource through metadata-only lists and watches
(``as=PartialObjectMetadataList``), which the serving core does not answer yet, and the
namespace controller deletes through the preferred version's ``delete``, which ``v1``'s
ModelArtifacts have not: made preferred, ``v1`` would stall both. Clients that want ``v1``
(GPUStack's server and gateway, ``kubectl get devices.v1.worker.gpustack.ai``) name it.
"""

from __future__ import annotations

from typing import Any, Final

from controlplane.admission.webhooks import WebhookSettings
from controlplane.extension import registration
from controlplane.extension.workergroup import catalog
from controlplane.k8s.client import KubeClient

__all__ = ["APISERVICE_NAME", "apiservice", "ensure"]

APISERVICE_NAME: Final = f"{catalog.VERSION}.{catalog.GROUP}"


def apiservice(service: WebhookSettings, ca: bytes | None) -> dict[str, Any]:
    """The APIService routing ``worker.gpustack.ai/v1`` to the worker's Service."""
    return registration.apiservice(service, ca, group=catalog.GROUP, version=catalog.VERSION)


async def ensure(api: KubeClient, service: WebhookSettings, ca: bytes) -> None:
    """Apply the APIService (server-side apply; idempotent, the CA replaces any other)."""
    await registration.ensure(api, service, ca, group=catalog.GROUP, version=catalog.VERSION)
