"""The worker's settings: one frozen object, built from its flags and the environment.

:func:`settings_from` is the only place the worker reads either; everything below receives its
part (``bus``, ``kube``, ``https``, ``leader``) explicitly.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
from collections.abc import Mapping

import msgspec

from bus import identity
from bus import settings as bus_settings
from bus.errors import InvalidToken
from bus.settings import BusSettings
from controlplane import applications
from controlplane.access import busauth
from controlplane.admission.webhooks import WebhookSettings
from controlplane.chain.settings import ChainSettings
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.extension import audit
from controlplane.families import BASES
from controlplane.k8s import client
from controlplane.worker import leading
from hub import endpoints
from kit import files
from kit.httpsettings import HttpsSettings, ServingFlags, https_from
from kit.options import Flags, Options, SettingsError

__all__ = ["WorkerSettings", "reconcile_concurrency", "settings_from"]

log = logging.getLogger(__name__)

_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the worker needs, built once at the edge."""

    bus: BusSettings
    kube: client.KubeSettings | None
    """None: no cluster, keep the ledger in the bus (KV sink)."""
    https: HttpsSettings
    leader: leading.LeaderSettings | None = None
    """The election among the replicas (``--kube-leader-election``); None: this replica leads
    without one (``standalone``, a single worker), as it does without a Kubernetes API."""
    identity: str = ""
    concurrency: int
    """Reconciles at once: ``--gopool-worker-factor`` per core (:func:`reconcile_concurrency`)."""
    resync_s: float = 60.0
    crd_check_s: float = 60.0
    max_nodes: int = 20_000
    hub_endpoint: str = endpoints.DEFAULT_ENDPOINT
    """Where ModelArtifacts are resolved (``--hf-endpoint``, else ``$HF_ENDPOINT``)."""
    artifact_retry_base_s: float = 1.0
    artifact_retry_cap_s: float = 300.0
    bus_auth: busauth.BusAuthSettings | None = None
    """None: the worker serves no auth callout (the servers authenticate by themselves)."""
    webhooks: WebhookSettings = WebhookSettings()
    """Where the API server reaches the Pod webhooks (with a cluster only)."""
    gateway_unix_path: str | None = None
    """``--worker-gateway-unix-path``: mirror that gateway's aggregate; None: none."""
    chain: ChainSettings = ChainSettings()
    """The scheduling chain (with a cluster only): whether Kueue objects are managed, the fit
    pin, InstanceTypes derived from nodes, manual node management."""
    namespace: str = "gpustack-system"
    """The system namespace: the settings Secret, Leases, the webhook CA."""
    pod_name: str | None = None
    """``KUBERNETES_POD_NAME``: this worker's Pod, whose image the agent applications run."""
    settings_seed: dict[str, str] = msgspec.field(default_factory=lambda: settingscatalog.seed({}))
    """Every Setting's first text (``GPUSTACK_<NAME>`` or its default), validated at the edge."""
    settings_period_s: float = 10.0
    model_manager_service_account: str = "gpustack-operator-model-manager"
    """The only ServiceAccount (in ``namespace``) besides the worker that may write a
    NodeModelStore's status (the status guard)."""
    audit: audit.AuditSettings = audit.AuditSettings()
    """``--audit-*``: where request audit events go and at which level."""
    manufacturers: tuple[str, ...] = ()
    """``--manufacturer``: the device groups the worker manages objects for; empty: all."""
    applications: frozenset[str] = frozenset(applications.NAMES)
    """The bundled applications whose objects the worker ensures (``--disable-applications``)."""
    nats_auth_secret: str | None = None
    """``--nats-auth-secret``: the Secret of the bus's keys, generated at first start
    (:mod:`controlplane.access.bootstrap`); None: ``--nats-password`` and the seed file instead."""
    applications_mirror: str | None = None
    """``--applications-mirror``: a directory or http(s) base URL holding the pinned release
    manifests (``<name>/<version>/<file>``); None: their upstream URLs."""
    disable_auths: bool = False
    """``--disable-auths``: the extension API authenticates and authorizes nobody (loopback only)."""
    """How often the stored settings are re-read (a change reaches everyone within 30 s)."""


class WorkerFlags(Flags, frozen=True, kw_only=True):
    """The flags of ``worker`` (its HTTPS endpoint's are :class:`ServingFlags`, its bus's
    :class:`~bus.settings.NatsFlags`)."""

    manufacturer: str
    kubeconfig: str
    disable_applications: tuple[str, ...]
    applications_mirror: str
    worker_gateway_unix_path: str
    webhook_service: str
    disable_auths: bool
    kube_leader_election: bool
    kube_leader_election_id: str
    kube_leader_lease: float
    kube_leader_renew_timeout: float
    audit_log_path: str
    audit_policy_file: str
    audit_webhook_config_file: str
    cors_allowed_origins: tuple[str, ...]
    model_manager_service_account: str
    hf_endpoint: str
    nats_callout_issuer_seed: str
    nats_auth_secret: str
    nats_callout_audience: str
    kube_conn_qps: float
    kube_conn_burst: int
    kube_conn_timeout: float
    informer_cache_resync_period: float
    gopool_worker_factor: int


def settings_from(options: Options) -> WorkerSettings:
    """Build the settings from parsed flags (``--kubeconfig=none``: no cluster, bus KV ledger)."""
    env = options.env
    flags = options.read_flags(WorkerFlags)
    kube = _kube(flags, env)
    hub_endpoint = _hub_endpoint(flags, env)
    namespace = env.get("KUBERNETES_POD_NAMESPACE", "gpustack-system")
    bus = bus_settings.from_options(options)
    https = _https(options.read_flags(ServingFlags), kube)
    https = msgspec.structs.replace(https, cors_allowed_origins=_cors(flags))
    webhooks = _webhooks(flags, namespace, https)
    seed = _seed(env)
    return WorkerSettings(
        disable_auths=_disable_auths(flags, https),
        audit=_audit(flags),
        manufacturers=_manufacturers(flags),
        applications=_applications(flags),
        applications_mirror=flags.applications_mirror or None,
        nats_auth_secret=flags.nats_auth_secret or None,
        concurrency=reconcile_concurrency(flags.gopool_worker_factor),
        model_manager_service_account=_service_account(flags),
        namespace=namespace,
        pod_name=env.get("KUBERNETES_POD_NAME") or None,
        settings_seed=seed,
        bus=msgspec.structs.replace(
            bus, inbox_prefix=identity.inbox_prefix(identity.Identity(role="worker"))
        ),
        bus_auth=_bus_auth(flags, kube, namespace),
        kube=kube,
        https=https,
        leader=_leader(flags, namespace),
        identity=env.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}",
        hub_endpoint=hub_endpoint,
        webhooks=webhooks,
        gateway_unix_path=_socket_path("worker-gateway-unix-path", flags.worker_gateway_unix_path),
    )


def _kube(flags: WorkerFlags, env: Mapping[str, str]) -> client.KubeSettings | None:
    """A step of its own: the cluster connection comes first, since the endpoint's and the bus
    auth's checks depend on whether there is one (``--kubeconfig=none``: None)."""
    kubeconfig = client.kubeconfig_from(flags.kubeconfig, env)
    if kubeconfig == "none":
        return None
    return client.KubeSettings(
        kubeconfig=kubeconfig,
        qps=flags.kube_conn_qps,
        burst=flags.kube_conn_burst,
        timeout_s=flags.kube_conn_timeout,
        relist_s=flags.informer_cache_resync_period,
    )


def _hub_endpoint(flags: WorkerFlags, env: Mapping[str, str]) -> str:
    """A step of its own: ``--hf-endpoint`` (else ``$HF_ENDPOINT``), refused as a flag error."""
    try:
        return endpoints.endpoint_from(flags.hf_endpoint or None, env)
    except endpoints.InvalidName as e:
        raise SettingsError(f"--hf-endpoint: {e}") from e


def _webhooks(flags: WorkerFlags, namespace: str, https: HttpsSettings) -> WebhookSettings:
    """A step of its own: where the API server reaches the webhooks; ``--webhook-service``
    must be a Service name."""
    service = flags.webhook_service or None
    if service is not None and not _DNS_LABEL.fullmatch(service):
        raise SettingsError(f"--webhook-service {service!r} is not a Service name (DNS-1035 label)")
    return WebhookSettings(service=service, namespace=namespace, port=https.port)


def _seed(env: Mapping[str, str]) -> dict[str, str]:
    """A step of its own: the ``GPUSTACK_*`` settings' first texts, refused at the edge."""
    try:
        return settingscatalog.seed(env)
    except settingscatalog.InvalidSetting as e:
        raise SettingsError(f"GPUSTACK_* setting seed: {e}") from e


def _leader(flags: WorkerFlags, namespace: str) -> leading.LeaderSettings | None:
    """A step of its own: the election among replicas, only with ``--kube-leader-election``."""
    if not flags.kube_leader_election:
        return None
    return leading.LeaderSettings(
        name=flags.kube_leader_election_id,
        namespace=namespace,
        lease_s=flags.kube_leader_lease,
        renew_timeout_s=flags.kube_leader_renew_timeout,
    )


def _https(serving: ServingFlags, kube: client.KubeSettings | None) -> HttpsSettings:
    """The endpoint's settings; reviewing tokens needs an API to review them with."""
    https = https_from(serving)
    if kube is None and https.auth == "review":
        raise SettingsError(
            "--metrics-auth=review needs the Kubernetes API (TokenReview, SubjectAccessReview); "
            "with --kubeconfig=none pass --metrics-auth=none (the endpoint is then open)"
        )
    return https


def _cors(flags: WorkerFlags) -> tuple[str, ...]:
    """Anchored origin patterns; none given: every origin (``.*``)."""
    patterns = flags.cors_allowed_origins or (".*",)
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as e:
            raise SettingsError(f"--cors-allowed-origins: {pattern!r}: {e}") from e
    return patterns


def _audit(flags: WorkerFlags) -> audit.AuditSettings:
    policy, hook = flags.audit_policy_file, None
    try:
        rules = audit.policy_from(policy) if policy else None
    except ValueError as e:
        raise SettingsError(f"--audit-policy-file: {e}") from e
    webhook = flags.audit_webhook_config_file
    try:
        hook = audit.webhook_from(webhook) if webhook else None
    except ValueError as e:
        raise SettingsError(f"--audit-webhook-config-file: {e}") from e
    log_path = flags.audit_log_path or None
    if log_path is not None and log_path != "-":
        try:
            files.writable_file(log_path)  # refused now, not at the first audited request
        except files.InputRefused as e:
            raise SettingsError(f"--audit-log-path: {e}") from e
    return audit.AuditSettings(log_path=log_path, rules=rules, webhook=hook)


def _manufacturers(flags: WorkerFlags) -> tuple[str, ...]:
    names = [n.strip().lower() for n in flags.manufacturer.split(",") if n.strip()]
    if any(n in ("all", "*") for n in names):
        return ()
    unknown = sorted(set(names) - set(BASES))
    if unknown:
        raise SettingsError(
            f"--manufacturer: unknown {', '.join(unknown)} (known: {', '.join(sorted(BASES))})"
        )
    return tuple(sorted(set(names)))


def _applications(flags: WorkerFlags) -> frozenset[str]:
    try:
        return applications.enabled(flags.disable_applications)
    except ValueError as e:
        raise SettingsError(f"--disable-applications: {e}") from e


MAX_CONCURRENCY = 1024


def reconcile_concurrency(factor: int) -> int:
    """``--gopool-worker-factor`` reconciles per CPU core this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_CONCURRENCY, factor * (cores or 1)))


def _service_account(flags: WorkerFlags) -> str:
    name = flags.model_manager_service_account
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
        raise SettingsError(
            f"--model-manager-service-account {name!r} is not a ServiceAccount name"
        )
    return name


def _disable_auths(flags: WorkerFlags, https: HttpsSettings) -> bool:
    """``--disable-auths``, refused unless the endpoint listens on a loopback address."""
    if not flags.disable_auths:
        return False
    if not ipaddress.ip_address(https.bind_address).is_loopback:
        raise SettingsError(
            f"--disable-auths: refused on --bind-address={https.bind_address}; it would let "
            "anyone who reaches it read and change the settings (use 127.0.0.1)"
        )
    log.warning("--disable-auths: the extension API checks nobody; serving on loopback only")
    return True


def _bus_auth(
    flags: WorkerFlags, kube: client.KubeSettings | None, namespace: str
) -> busauth.BusAuthSettings | None:
    """The callout settings, when ``--nats-callout-issuer-seed`` names the issuer's seed file or
    ``--nats-auth-secret`` the Secret holding it (the seed is then read at start)."""
    audience = flags.nats_callout_audience
    seed = flags.nats_callout_issuer_seed or None
    secret = flags.nats_auth_secret or None
    if seed is None and secret is None:
        return None
    if kube is None:
        flag = "--nats-callout-issuer-seed" if seed is not None else "--nats-auth-secret"
        raise SettingsError(
            f"{flag}: agents are verified through the Kubernetes API "
            "(TokenReview), which --kubeconfig=none turns off"
        )
    if not audience:
        raise SettingsError("--nats-callout-audience: empty")
    if seed:
        try:
            busauth.load_issuer(seed)  # loaded again at start; a bad file is exit 2 here
        except InvalidToken as e:
            raise SettingsError(f"--nats-callout-issuer-seed: {e}") from e
    return busauth.BusAuthSettings(
        issuer_seed_file=seed or "", audience=audience, namespace=namespace
    )


def _socket_path(flag: str, text: str) -> str | None:
    """``--flag``'s unix socket path, whose directory must exist (exit 2 otherwise)."""
    path = text or None
    if path is not None:
        try:
            files.socket_directory(path)
        except files.InputRefused as e:
            raise SettingsError(f"--{flag}: {e}") from e
    return path
