"""The worker's HTTPS endpoint: ``/metrics``, ``/readyz`` (connected to the bus) and ``/livez``
(not off the bus for longer than ``max_offline_s``: its connection is replaced for ever, so a
worker still off by then is stuck and kubelet restarts it), the Pod admission
webhooks and the Workload fit pin, the status guards, the extension API, and (with an API) the
access reviews it and, on the bus, the agents use.

With a cluster it serves a certificate the API server can verify, and applies the configurations
naming its CA (webhooks, APIService, guards) only once it listens, so the API server is never
sent to an endpoint that is not up. Composed by :mod:`controlplane.worker.running`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
from prometheus_client import CollectorRegistry

from bus import connection, events
from bus.accessreviews import serve_reviews
from controlplane.access.reviewer import KubeReviewer
from controlplane.admission import certificates, modelrules, webhooks
from controlplane.admission.cards import LedgerCatalog
from controlplane.chain import workloads
from controlplane.chain.reconciler import ChainReconciler
from controlplane.clustersettings.source import SettingsSource
from controlplane.extension import audit, auth, guards, registration
from controlplane.extension.api import ExtensionApi
from controlplane.extension.fleetview import GatewayReader
from controlplane.extension.workergroup import catalog as worker_catalog
from controlplane.extension.workergroup import registration as worker_registration
from controlplane.extension.workergroup.group import WorkerGroup
from controlplane.k8s import client
from controlplane.reconciling.nodestates import Ledger
from controlplane.worker.settings import WorkerSettings
from kit import serving
from kit.access import CachedAuthorizer
from kit.httpsettings import HttpsSettings
from kit.listening import Handler, Middleware

__all__ = ["serve"]


@asynccontextmanager
async def serve(  # noqa: PLR0913 - the parts of one endpoint, each passed by the composer
    settings: WorkerSettings,
    conn: connection.Connection,
    api: client.KubeClient | None,
    registry: CollectorRegistry,
    ledger: Ledger,
    *,
    source: SettingsSource,
    chain: ChainReconciler | None,
    samples: registration.LatestSamples,
    group: WorkerGroup | None = None,
) -> AsyncIterator[serving.Server]:
    """HTTPS with the Pod webhooks and the extension API, and with an API the access reviews:
    for this endpoint and, on the bus, the agents' (answered whatever this endpoint's own
    ``--metrics-auth`` says).

    With a cluster it serves a certificate the API server can verify, and the configurations
    naming its CA (webhooks, APIService) are applied once it listens: the API server is never
    sent to an endpoint that is not up.
    """
    async with AsyncExitStack() as stack:
        reviewer = await _reviews(stack, conn, api)
        https, ca_bundle = await _identity(stack, settings, api)
        extension, proxy = await _extension(settings, api, ledger, source, samples, group)
        handlers = _handlers(extension, group)
        middlewares = await _middlewares(stack, settings)
        posts = await _posts(settings, api, ledger, chain)
        server = await stack.enter_async_context(
            serving.https_server(
                https, registry=registry, ready=lambda: conn.is_connected,
                live=lambda: conn.presence.alive(anyio.current_time(), settings.bus.max_offline_s),
                authorizer=reviewer, posts=posts,
                handlers=handlers, client_ca=proxy.client_ca if proxy else None,
                middlewares=middlewares,
            )
        )  # fmt: skip
        if api is not None and ca_bundle is not None:
            await _apply_configurations(api, settings, ca_bundle, chain, group)
        yield server


async def _reviews(
    stack: AsyncExitStack, conn: connection.Connection, api: client.KubeClient | None
) -> KubeReviewer | None:
    """A step of its own: with an API, the access reviews answered on the bus for the agents
    live as long as the endpoint, and its reviewer also checks the endpoint's own callers."""
    reviewer = None if api is None else KubeReviewer(api)
    if reviewer is not None:
        await stack.enter_async_context(serve_reviews(conn, CachedAuthorizer(reviewer)))
    return reviewer


async def _identity(
    stack: AsyncExitStack, settings: WorkerSettings, api: client.KubeClient | None
) -> tuple[HttpsSettings, bytes | None]:
    """A step of its own: with a cluster and a webhook Service, the endpoint serves a
    certificate the API server can verify, and its CA bundle is what the configurations name."""
    https, ca_bundle = settings.https, None
    if api is not None and settings.webhooks.service is not None:
        ident = await stack.enter_async_context(
            certificates.serving_identity(api, settings.https, settings.webhooks)
        )
        https, ca_bundle = ident.https, ident.ca_bundle
    return https, ca_bundle


def _handlers(extension: ExtensionApi, group: WorkerGroup | None) -> dict[str, Handler]:
    """A step of its own: the extension API's handlers, gated while a worker group's caches
    fill (worker.gpustack.ai/v1's discovery waits for them)."""
    handlers = extension.handlers()
    if group is not None:
        handlers = group.gate(handlers)
    return handlers


async def _middlewares(stack: AsyncExitStack, settings: WorkerSettings) -> list[Middleware]:
    """A step of its own: the request auditor, running as long as the endpoint, when
    ``--audit-*`` turns it on."""
    middlewares = []
    if settings.audit.enabled:
        auditor = await stack.enter_async_context(audit.Auditor(settings.audit).running())
        middlewares.append(auditor.middleware())
    return middlewares


async def _posts(
    settings: WorkerSettings,
    api: client.KubeClient | None,
    ledger: Ledger,
    chain: ChainReconciler | None,
) -> dict[str, serving.PostRoute]:
    """A step of its own: the admission routes; with an API also the status guards, which
    must first ask the API server who we are."""
    posts = {**webhooks.posts(LedgerCatalog(ledger)), **_workload_posts(chain)}
    if api is not None:  # the API server calls the status guards; they need who we are
        writers = guards.allowed_writers(
            await guards.whoami(api), settings.namespace,
            settings.model_manager_service_account,
        )  # fmt: skip
        posts.update(guards.posts(writers))
        posts.update(modelrules.posts())
    return posts


async def _apply_configurations(
    api: client.KubeClient,
    settings: WorkerSettings,
    ca_bundle: bytes,
    chain: ChainReconciler | None,
    group: WorkerGroup | None,
) -> None:
    """A step of its own: the configurations naming our CA, applied only once the endpoint
    listens (the API server is never sent to an endpoint that is not up), in this order."""
    await webhooks.ensure(api, settings.webhooks, ca_bundle)
    if chain is not None and chain.settings.manage_kueue:
        await workloads.ensure(api, settings.webhooks, ca_bundle)
    await registration.ensure(api, settings.webhooks, ca_bundle)
    if group is not None:
        await worker_registration.ensure(api, settings.webhooks, ca_bundle)
    await guards.ensure(api, settings.webhooks, ca_bundle)
    await modelrules.ensure(api, settings.webhooks, ca_bundle)


def _workload_posts(chain: ChainReconciler | None) -> dict[str, serving.PostRoute]:
    """The Workload fit-pin route, served wherever the Pod webhooks are.

    With a cluster it answers from the chain's entrances; without one (``standalone``) there is no
    LocalQueue of ours, so it checks the review and allows every Workload untouched.
    """
    if chain is None:
        return workloads.posts(lambda _queue: None)
    return workloads.posts(chain.entrance, lambda: chain.settings.workload_fit_affinity)


async def _extension(
    settings: WorkerSettings,
    api: client.KubeClient | None,
    ledger: Ledger,
    source: SettingsSource,
    samples: registration.LatestSamples,
    group: WorkerGroup | None,
) -> tuple[ExtensionApi, auth.FrontProxy | None]:
    """The extension API (``gpustack.ai/v1`` and, given ``group``, ``worker.gpustack.ai/v1``);
    its front proxy read from the cluster unless ``--disable-auths``."""
    proxy = None
    if api is not None and not settings.disable_auths:
        proxy = await auth.load_front_proxy(api)

    def models() -> list[tuple[str, tuple[events.ModelState, ...]]]:
        states = ((n, ledger.get(n)) for n in ledger.nodes())
        return [(n, s.models) for n, s in states if s is not None and s.models]

    authenticator = None if settings.disable_auths else auth.Authenticator(proxy, api)
    authorizer = None if settings.disable_auths or api is None else auth.Authorizer(api)
    extension = ExtensionApi(
        source=source, namespace=settings.namespace, samples=samples,
        models=models, authenticator=authenticator, authorizer=authorizer,
        fleet=None if settings.gateway_unix_path is None else GatewayReader(settings.gateway_unix_path),
        groups=() if group is None else [(worker_catalog.SPEC, group.providers)],
    )  # fmt: skip
    return extension, proxy
