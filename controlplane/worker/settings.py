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
from kit.options import Options, SettingsError
from kit.serving import HttpsSettings, https_from

__all__ = ["WorkerSettings", "reconcile_concurrency", "settings_from"]

log = logging.getLogger(__name__)

_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the worker needs, built once at the edge."""

    bus: BusSettings
    kube: client.KubeSettings | None
    """None: no cluster, keep the ledger in the bus (KV sink)."""
    https: HttpsSettings
    leader_election: bool = True
    leader: leading.LeaderSettings = leading.LeaderSettings()
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


def settings_from(options: Options) -> WorkerSettings:
    """Build the settings from parsed flags (``--kubeconfig=none``: no cluster, bus KV ledger)."""
    env = options.env
    kubeconfig = client.kubeconfig_from(options)
    kube = None
    relist_s = options.seconds("informer-cache-resync-period")
    if kubeconfig != "none":
        kube = client.KubeSettings(
            kubeconfig=kubeconfig,
            qps=options.number("kube-conn-qps"),
            burst=options.integer("kube-conn-burst"),
            timeout_s=options.seconds("kube-conn-timeout"),
            relist_s=relist_s,
        )
    try:
        hub_endpoint = endpoints.endpoint_from(options.optional_text("hf-endpoint"), env)
    except endpoints.InvalidName as e:
        raise SettingsError(f"--hf-endpoint: {e}") from e
    namespace = env.get("KUBERNETES_POD_NAMESPACE", "gpustack-system")
    bus = bus_settings.from_options(options)
    https = _https(options, kube)
    https = msgspec.structs.replace(https, cors_allowed_origins=_cors(options))
    service = options.optional_text("webhook-service")
    if service is not None and not _DNS_LABEL.fullmatch(service):
        raise SettingsError(f"--webhook-service {service!r} is not a Service name (DNS-1035 label)")
    webhooks = WebhookSettings(service=service, namespace=namespace, port=https.port)
    try:
        seed = settingscatalog.seed(env)
    except settingscatalog.InvalidSetting as e:
        raise SettingsError(f"GPUSTACK_* setting seed: {e}") from e
    return WorkerSettings(
        disable_auths=_disable_auths(options, https),
        audit=_audit(options),
        manufacturers=_manufacturers(options),
        applications=_applications(options),
        applications_mirror=options.optional_text("applications-mirror") or None,
        nats_auth_secret=options.optional_text("nats-auth-secret") or None,
        concurrency=reconcile_concurrency(options),
        model_manager_service_account=_service_account(options),
        namespace=namespace,
        settings_seed=seed,
        bus=msgspec.structs.replace(
            bus, inbox_prefix=identity.inbox_prefix(identity.Identity(role="worker"))
        ),
        bus_auth=_bus_auth(options, kube, namespace),
        kube=kube,
        https=https,
        leader_election=options.switch("kube-leader-election"),
        leader=leading.LeaderSettings(
            name=options.text("kube-leader-election-id"),
            namespace=namespace,
            lease_s=options.seconds("kube-leader-lease"),
            renew_timeout_s=options.seconds("kube-leader-renew-timeout"),
        ),
        identity=env.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}",
        hub_endpoint=hub_endpoint,
        webhooks=webhooks,
        gateway_unix_path=_socket_path(options, "worker-gateway-unix-path"),
    )


def _https(options: Options, kube: client.KubeSettings | None) -> HttpsSettings:
    """The endpoint's settings; reviewing tokens needs an API to review them with."""
    https = https_from(options)
    if kube is None and https.auth == "review":
        raise SettingsError(
            "--metrics-auth=review needs the Kubernetes API (TokenReview, SubjectAccessReview); "
            "with --kubeconfig=none pass --metrics-auth=none (the endpoint is then open)"
        )
    return https


def _cors(options: Options) -> tuple[str, ...]:
    """Anchored origin patterns; none given: every origin (``.*``)."""
    patterns = options.items("cors-allowed-origins") or (".*",)
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as e:
            raise SettingsError(f"--cors-allowed-origins: {pattern!r}: {e}") from e
    return patterns


def _audit(options: Options) -> audit.AuditSettings:
    policy, hook = options.optional_text("audit-policy-file"), None
    try:
        rules = audit.policy_from(policy) if policy else None
    except ValueError as e:
        raise SettingsError(f"--audit-policy-file: {e}") from e
    webhook = options.optional_text("audit-webhook-config-file")
    try:
        hook = audit.webhook_from(webhook) if webhook else None
    except ValueError as e:
        raise SettingsError(f"--audit-webhook-config-file: {e}") from e
    log_path = options.optional_text("audit-log-path")
    if log_path is not None and log_path != "-":
        try:
            files.writable_file(log_path)  # refused now, not at the first audited request
        except files.InputRefused as e:
            raise SettingsError(f"--audit-log-path: {e}") from e
    return audit.AuditSettings(log_path=log_path, rules=rules, webhook=hook)


def _manufacturers(options: Options) -> tuple[str, ...]:
    names = [n.strip().lower() for n in options.text("manufacturer").split(",") if n.strip()]
    if any(n in ("all", "*") for n in names):
        return ()
    unknown = sorted(set(names) - set(BASES))
    if unknown:
        raise SettingsError(
            f"--manufacturer: unknown {', '.join(unknown)} (known: {', '.join(sorted(BASES))})"
        )
    return tuple(sorted(set(names)))


def _applications(options: Options) -> frozenset[str]:
    try:
        return applications.enabled(options.items("disable-applications"))
    except ValueError as e:
        raise SettingsError(f"--disable-applications: {e}") from e


MAX_CONCURRENCY = 1024


def reconcile_concurrency(options: Options) -> int:
    """``--gopool-worker-factor`` reconciles per CPU core this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_CONCURRENCY, options.integer("gopool-worker-factor") * (cores or 1)))


def _service_account(options: Options) -> str:
    name = options.text("model-manager-service-account")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
        raise SettingsError(
            f"--model-manager-service-account {name!r} is not a ServiceAccount name"
        )
    return name


def _disable_auths(options: Options, https: HttpsSettings) -> bool:
    """``--disable-auths``, refused unless the endpoint listens on a loopback address."""
    if not options.switch("disable-auths"):
        return False
    if not ipaddress.ip_address(https.bind_address).is_loopback:
        raise SettingsError(
            f"--disable-auths: refused on --bind-address={https.bind_address}; it would let "
            "anyone who reaches it read and change the settings (use 127.0.0.1)"
        )
    log.warning("--disable-auths: the extension API checks nobody; serving on loopback only")
    return True


def _bus_auth(
    options: Options, kube: client.KubeSettings | None, namespace: str
) -> busauth.BusAuthSettings | None:
    """The callout settings, when ``--nats-callout-issuer-seed`` names the issuer's seed file or
    ``--nats-auth-secret`` the Secret holding it (the seed is then read at start)."""
    audience = options.text("nats-callout-audience")
    seed = options.optional_text("nats-callout-issuer-seed")
    secret = options.optional_text("nats-auth-secret")
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


def _socket_path(options: Options, flag: str) -> str | None:
    """``--flag``'s unix socket path, whose directory must exist (exit 2 otherwise)."""
    path = options.optional_text(flag)
    if path is not None:
        try:
            files.socket_directory(path)
        except files.InputRefused as e:
            raise SettingsError(f"--{flag}: {e}") from e
    return path
