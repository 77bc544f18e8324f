"""The command table of ``../shared/seed/commands.md``: names, aliases, flags, defaults, targets.

This module is data only, and the one place a flag's default is written. Targets are
``"module:function"`` strings the launcher imports after parsing, so choosing ``dm detect`` never
imports the service stacks of ``worker`` or ``dm serve``. Every command names how its settings
are built from its flags (``settings``) and either the service the process runner runs
(``service``) or the one-shot that returns an exit code (``oneshot``). A command not built yet
has neither and says so instead of pretending.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpustack_operator.flags import Flag

PORT = (0.0, 65535.0)
WORKER_PORT = "31443"
DEVICE_MANAGER_PORT = "32443"
MODEL_MANAGER_PORT = "32444"
"""Each agent's and the worker's HTTPS port: its command's ``--secure-port`` and the matching
``standalone`` port flag (one default, written once)."""


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    summary: str
    flags: tuple[Flag, ...]
    settings: str
    """``module:function`` building the command's settings from :class:`kit.options.Options`;
    raises :class:`kit.options.SettingsError` (exit 2) for a configuration that cannot work."""
    service: str | None = None
    """``module:function``: an async function of the settings, run until stopped by
    :mod:`gpustack_operator.process`."""
    oneshot: str | None = None
    """``module:function``: a function of the settings returning the exit code."""
    usage: str = ""
    """Positional arguments, for the usage line; empty: the command takes none."""
    examples: str = ""
    """``--help``'s Examples: ``#`` comment lines and command lines, as cobra commands show."""


def inert(*flags: Flag) -> tuple[Flag, ...]:
    """The same flags, accepted for compatibility and marked in ``--help`` as having no effect."""
    return tuple(dataclasses.replace(f, inert=True) for f in flags)


GLOBAL_FLAGS = (
    Flag(
        "v",
        "0",
        "log verbosity; -v=2 is the DaemonSet's level, -v=3 adds per-decision lines",
        kind="int",
    ),
    Flag(
        "vmodule",
        "",
        "per-file or per-logger verbosity, pattern=N comma separated (e.g. nvidia*=3); other "
        "libraries' loggers stay at WARNING unless a pattern names them (e.g. hpack*=2)",
    ),
    Flag("logtostderr", "true", "log to standard error rather than files", kind="bool"),
    Flag(
        "add_dir_header",
        "false",
        "prefix the log header's file name with its directory",
        kind="bool",
    ),
    Flag("skip_headers", "false", "omit the header prefix of log lines", kind="bool"),
    Flag("log_backtrace_at", "", "when logging hits file:N, also print a stack trace"),
    Flag(
        "logging-format",
        "text",
        "log line format: klog's text, or one JSON object per line as Kubernetes components write",
        choices=("text", "json"),
    ),
    Flag(
        "print-cmdline",
        "false",
        "print the effective command line, including what was read from the environment",
        kind="bool",
    ),
    Flag("version", "false", "print the binary's version and exit", kind="bool"),
)

_HTTPS = (
    Flag("bind-address", "0.0.0.0", "the address to serve on"),
    Flag("cert-dir", "", "where tls.crt and tls.key are; self-signed when empty"),
    Flag(
        "metrics-auth",
        "review",
        "who may read /metrics and the other HTTPS routes (never /livez, /readyz): 'review' "
        "needs a bearer token that TokenReview accepts and whose user a SubjectAccessReview "
        "allows to get the path (the agents ask the worker over the bus); 'none' exposes them "
        "to anyone who can reach --bind-address",
        choices=("review", "none"),
    ),
)
_KUBE_CLIENT = (
    Flag(
        "kube-conn-qps",
        "200",
        "Kubernetes API client queries per second",
        kind="float",
        bounds=(0.001, 1e6),
    ),
    Flag("kube-conn-burst", "400", "Kubernetes API client burst", kind="int", bounds=(1, 1e6)),
    Flag("kube-conn-timeout", "5m", "Kubernetes API client timeout", kind="duration"),
)
_RESYNC = Flag("informer-cache-resync-period", "1h", "informer resync period", kind="duration")
_POOL_FACTOR = Flag("gopool-worker-factor", "100", "worker pool size per CPU core", kind="int")
_POOLS = (_RESYNC, _POOL_FACTOR)
_SERVING = (*_HTTPS, *_KUBE_CLIENT, *_POOLS)
_AGENT_SERVING = (*_HTTPS, *inert(*_KUBE_CLIENT, *_POOLS))
"""The agents hold no Kubernetes client: the client flags are accepted and have no effect."""

_MANUFACTURER = Flag(
    "manufacturer", "", "which manufacturers to detect, comma separated; all if empty"
)
_NO_PCI_CHECK = Flag("no-pci-check", "false", "skip the PCI check", kind="bool")
_NO_FAST_FAILED = Flag(
    "no-fast-failed",
    "false",
    "publish a first pass that found nothing rather than detecting again "
    "(only when --manufacturer names exactly one)",
    kind="bool",
)
_SIMULATE = Flag(
    "simulate",
    "",
    "simulate accelerators from a profile (a packaged name such as nvidia-h200x8, or a YAML file)",
)
_SIMULATE_OR_LIST = Flag(
    "simulate",
    "",
    "simulate accelerators from a profile (a packaged name such as nvidia-h200x8, or a YAML "
    "file); 'list' prints the packaged profile names",
)
_OUTPUT = Flag("output", "yaml", "output format", short="o", choices=("yaml", "json"))

NATS_FLAGS = (
    Flag(
        "nats-url",
        "",
        "NATS server URL(s), comma separated (default $NATS_URL, else nats://127.0.0.1:4222)",
    ),
    Flag("nats-user", "", "NATS user name"),
    Flag("nats-password", "", "NATS password", secret=True),
    Flag("nats-token", "", "NATS authentication token", secret=True),
    Flag(
        "nats-token-file",
        "",
        "file holding the NATS token, re-read at every connection (a projected "
        "ServiceAccount token); wins over --nats-token",
    ),
    Flag("nats-nkey-seed", "", "file holding an NKey seed"),
    Flag("nats-creds", "", "NATS credentials file (JWT and NKey seed)"),
    Flag("nats-tls-ca", "", "CA bundle that verifies the NATS servers"),
    Flag("nats-tls-cert", "", "client certificate for NATS TLS"),
    Flag("nats-tls-key", "", "client key for NATS TLS (with --nats-tls-cert)"),
    Flag(
        "nats-state-replicas",
        "1",
        "copies of the retained bus state (streams, key-value buckets); 3 on a 3-server cluster",
        kind="int",
        bounds=(1, 5),
    ),
    Flag(
        "nats-state-max-age",
        "1h",
        "node expiry: retained node state not republished for this long is dropped "
        "(at least 3 resync periods)",
        kind="duration",
        bounds=(60.0, 30 * 24 * 3600.0),
    ),
)

_WORKER = (
    Flag(
        "manufacturer",
        "",
        "which manufacturers' devices the worker manages objects for (Devices groups, node "
        "labels and capacity), comma separated; all if empty",
    ),
    Flag(
        "kubeconfig",
        "",
        "kubeconfig path (default: in-cluster, else $KUBECONFIG); 'none' keeps the ledger "
        "in the bus instead of a cluster",
    ),
    Flag(
        "disable-applications",
        "",
        "bundled applications whose objects the worker does not ensure (kueue, "
        "node-feature-discovery, device-manager, model-manager, csi-driver-nfs, csi-driver-s3), "
        "or * for all; the agents run the image of the worker's own Pod ($KUBERNETES_POD_NAME); "
        "see docs/settings.md",
        kind="list",
    ),
    Flag(
        "applications-mirror",
        "",
        "where the pinned application manifests are read from instead of upstream: a directory "
        "or an http(s) base URL holding <name>/<version>/<file>, or configmap:NAME (a ConfigMap "
        "of the system namespace, keys <name>_<version>_<file>); docs/deploy.md",
    ),
    Flag("secure-port", WORKER_PORT, "the HTTPS port", kind="int", bounds=PORT),
    Flag(
        "worker-gateway-unix-path",
        "",
        "the socket of a worker-gateway beside this worker: its aggregated InstanceTypes are "
        "served as aggregatedinstancetypes.gpustack.ai (docs/gateway.md); empty: none",
    ),
    Flag(
        "webhook-service",
        "gpustack-operator-worker",
        "the Service (in the worker's namespace, on --secure-port) the API server calls the Pod "
        "webhooks through; empty: register no webhook configuration",
    ),
    Flag(
        "disable-auths",
        "false",
        "skip authentication and authorization of the extension API (refused unless "
        "--bind-address is a loopback address)",
        kind="bool",
    ),
    Flag(
        "kube-leader-election",
        "true",
        "leader election, for multi-instance deployments",
        kind="bool",
    ),
    Flag("kube-leader-election-id", "worker.gpustack.ai", "the election's unique ID"),
    Flag("kube-leader-lease", "15s", "how long leadership is held", kind="duration"),
    Flag("kube-leader-renew-timeout", "10s", "how long renewing may take", kind="duration"),
    Flag(
        "audit-log-path",
        "",
        "append an audit event (JSON line) per request to the extension API and webhooks to "
        "this file ('-': standard output)",
    ),
    Flag(
        "audit-policy-file",
        "",
        "audit policy (audit.k8s.io/v1 Policy; levels None, Metadata, Request); without one "
        "every request is audited at Metadata",
    ),
    Flag(
        "audit-webhook-config-file",
        "",
        "kubeconfig naming the server audit events are POSTed to (EventList batches)",
    ),
    Flag(
        "cors-allowed-origins",
        "",
        "allowed cross-domain origins, anchored regular expressions; all if empty",
        kind="list",
    ),
    Flag(
        "model-manager-service-account",
        "gpustack-operator-model-manager",
        "the ServiceAccount, in the worker's namespace, the model-manager plugin runs as; only "
        "it (and the worker, writing on the agents' behalf) may write a NodeModelStore's status",
    ),
    Flag(
        "hf-endpoint",
        "",
        "the Hub ModelArtifacts are resolved against (default $HF_ENDPOINT, else "
        "https://huggingface.co)",
    ),
    Flag(
        "nats-callout-issuer-seed",
        "",
        "file holding the account NKey seed the NATS servers' auth_callout names as issuer: "
        "the worker then authorizes every bus connection (agents by ServiceAccount token)",
    ),
    Flag(
        "nats-auth-secret",
        "",
        "the Secret (in the system namespace) holding the worker's NATS password and the callout "
        "issuer's NKey: created with fresh keys at first start when absent, then read at every "
        "start; it replaces --nats-password and --nats-callout-issuer-seed (docs/deploy.md)",
    ),
    Flag(
        "nats-callout-audience",
        "gpustack-nats",
        "the audience of the ServiceAccount tokens agents connect to NATS with",
    ),
    *_HTTPS,
    *_KUBE_CLIENT,
    dataclasses.replace(
        _RESYNC, help="how often every watch starts over with a full list (0: never)"
    ),
    dataclasses.replace(
        _POOL_FACTOR,
        help="reconcile concurrency per CPU core (at most 1024 in all)",
        bounds=(1, 10_000),
    ),
    *NATS_FLAGS,
)

_WORKER_GATEWAY = (
    Flag(
        "bind-unix-path",
        "/var/lib/gpustack/gpustack-operator-worker-gateway.sock",
        "the socket to serve on (HTTPS with a self-signed certificate, mode 0600); when set, "
        "--bind-address and --secure-port are ignored; empty: serve on --bind-address:--secure-port",
    ),
    Flag(
        "worker-conn-mode",
        "gpustack-api",
        "how a subscribed cluster is reached: 'gpustack-api' through the GPUStack server on this "
        "host (/v2/clusters/<id>/proxy, the subscription's token); 'loopback' the cluster of "
        "--kubeconfig for every subscription",
        choices=("gpustack-api", "loopback"),
    ),
    Flag(
        "worker-conn-gpustack-api-port",
        "30080",
        "the GPUStack server's port on localhost (gpustack-api mode)",
        kind="int",
        bounds=PORT,
    ),
    Flag(
        "worker-conn-gpustack-api-scheme",
        "",
        "http or https; empty: https when the port is 443, else http",
    ),
    Flag(
        "worker-readiness-check-timeout",
        "30s",
        "how long one readiness check of a cluster's API services polls (every 2s) before it "
        "backs off (5s doubling to 60s) and checks again. At most --kube-conn-timeout",
        kind="duration",
        bounds=(1.0, 24 * 3600.0),
    ),
    Flag("secure-port", "31444", "the HTTPS port, when not on a socket", kind="int", bounds=PORT),
    Flag(
        "kubeconfig",
        "",
        "kubeconfig path (default: in-cluster, else $KUBECONFIG): the cluster loopback mode "
        "reads, and the API that reviews tokens on the HTTPS port; 'none': no cluster",
    ),
    *_HTTPS,
    *_KUBE_CLIENT,
    dataclasses.replace(
        _RESYNC,
        help="how often a kept kind of a subscribed cluster is listed again in full",
        bounds=(300.0, 7 * 24 * 3600.0),
    ),
    *inert(_POOL_FACTOR),
)

_DM_SERVE = (
    _MANUFACTURER,
    Flag("no-sliced", "false", "do not create logically sliced devices", kind="bool"),
    Flag("no-partitioned", "false", "do not create hardware-partitioned devices", kind="bool"),
    Flag("no-shared", "false", "do not create shared devices", kind="bool"),
    _NO_PCI_CHECK,
    _NO_FAST_FAILED,
    Flag("monitor-period", "15s", "how often utilization is sampled", kind="duration"),
    Flag(
        "kube-socket",
        "/var/lib/kubelet/device-plugins/kubelet.sock",
        "the kubelet socket to register on",
    ),
    Flag(
        "state-dir",
        "/var/lib/gpustack/device-manager",
        "the node's own state: the allocation ledger kept for a start without the bus",
    ),
    Flag("secure-port", DEVICE_MANAGER_PORT, "the HTTPS port", kind="int", bounds=PORT),
    Flag(
        "metrics-port",
        "0",
        "also serve /metrics over plain HTTP on this port of --bind-address, with no token "
        "(scrapers that expect DCGM exporter's :9400); 0 turns it off",
        kind="int",
        bounds=PORT,
    ),
    Flag(
        "metrics-names",
        "gpustack",
        "whose names the per-accelerator series carry: 'gpustack' (gpustack_accelerator_*), "
        "'dcgm' (DCGM exporter's field names and units, e.g. DCGM_FI_DEV_GPU_UTIL, "
        "DCGM_FI_DEV_FB_USED in MiB, so its stock Grafana dashboards work unchanged; series "
        "with no DCGM field keep ours) or 'both' (every DCGM-named series under both names)",
        choices=("gpustack", "dcgm", "both"),
    ),
    Flag(
        "node-name", "", "the node it runs on (default $KUBERNETES_NODE_NAME, else the host name)"
    ),
    Flag(
        "health-quarantine",
        "5m",
        "how long a card unhealthy for a transient reason stays down before it is re-checked",
        kind="duration",
    ),
    Flag(
        "resync-period",
        "5m",
        "how often an unchanged Devices spec is published again",
        kind="duration",
    ),
    Flag(
        "heartbeat-period",
        "30s",
        "how often the agent announces itself on the bus",
        kind="duration",
    ),
    _SIMULATE,
    *_AGENT_SERVING,
    *NATS_FLAGS,
    Flag(
        "nvidia-device-injection-strategy",
        "envvar",
        "how NVIDIA cards reach a container: the NVIDIA_VISIBLE_DEVICES env var, CDI "
        "annotations (names checked against the specs in /etc/cdi and /var/run/cdi), or auto: "
        "CDI where the specs name every granted card, else the env var",
        choices=("envvar", "cdi-annotations", "auto"),
    ),
)

_CACHE_ROOT = Flag("cache-root", "/var/lib/gpustack/models", "the node's cache directory")
_REVISION = Flag(
    "revision", "", "branch, tag or commit to resolve (default main; master on ModelScope)"
)

_MODEL_MANAGER = (
    Flag(
        "node-name",
        "",
        "the node it runs on, also its NodeModelStore's name "
        "(default $KUBERNETES_NODE_NAME, else the host name)",
    ),
    Flag("kubelet-dir", "/var/lib/kubelet", "kubelet's root directory"),
    _CACHE_ROOT,
    Flag(
        "csi-socket",
        "",
        "the CSI socket (default <kubelet-dir>/plugins/model.csi.gpustack.ai/csi.sock)",
    ),
    Flag(
        "secure-port",
        MODEL_MANAGER_PORT,
        "the HTTPS port: metrics, readiness and liveness",
        kind="int",
        bounds=PORT,
    ),
    Flag(
        "peer-port",
        "0",
        "serve published models to this cluster's other model agents on this port, and pull "
        "from them before the Hub (0: off; needs the bus)",
        kind="int",
        bounds=PORT,
    ),
    Flag(
        "peer-address",
        "",
        "the address other nodes reach --peer-port at (default $POD_IP)",
    ),
    *_AGENT_SERVING,
    *NATS_FLAGS,
)

_OUTPUT_WIDE = Flag(
    "output",
    "yaml",
    "output format: YAML, JSON, wide (a table, one accelerator per row) or name "
    "(accelerator/<id>, one per line, as kubectl's -o name)",
    short="o",
    choices=("yaml", "json", "wide", "name"),
)
_SNAPSHOT = (
    Flag("allow-pattern", "", "only files matching these globs (repeatable, or a,b)", kind="list"),
    Flag(
        "ignore-pattern",
        "",
        "leave out files matching these globs (repeatable, or a,b)",
        kind="list",
    ),
    Flag(
        "hub",
        "huggingface",
        "which hub the repository is on: huggingface, or modelscope (the token from "
        "MODELSCOPE_API_TOKEN, the endpoint from MODELSCOPE_ENDPOINT or MODELSCOPE_DOMAIN)",
        choices=("huggingface", "modelscope"),
    ),
    Flag("hf-endpoint", "", "the Hub (default $HF_ENDPOINT, else https://huggingface.co)"),
    Flag(
        "modelscope-endpoint",
        "",
        "ModelScope, with --hub modelscope (default $MODELSCOPE_ENDPOINT, else "
        "$MODELSCOPE_DOMAIN, else https://www.modelscope.cn)",
    ),
)
"""Which snapshot of a repository, from which Hub (``mm manifest`` and ``mm pull``)."""
_OUTPUT_TEXT = Flag(
    "output",
    "text",
    "output format: text (the lines shown by default), or a JSON or YAML document for scripts",
    short="o",
    choices=("text", "json", "yaml"),
)

_ONE_SHOT = (_MANUFACTURER, _NO_PCI_CHECK, _NO_FAST_FAILED, _OUTPUT_WIDE, _SIMULATE_OR_LIST)

_PREFLIGHT = (
    _MANUFACTURER,
    Flag("dry-run", "false", "print the container steps instead of taking them", kind="bool"),
    Flag("probe-image", "", "the image the probe containers run (derived per family)"),
    Flag("host-root", "/host", "where the host's root filesystem is mounted"),
    Flag(
        "runtime",
        "",
        "the host runtime to drive, overriding what was resolved",
        choices=("", "docker", "nerdctl", "ctr"),
    ),
    _NO_PCI_CHECK,
    _OUTPUT,
    Flag(
        "simulate",
        "",
        "run the real checks against a simulated accelerator profile (name or YAML path)",
    ),
)

_BUS_WATCH = (
    Flag("node", "", "only this node"),
    Flag("subject", "", "only this subject filter, e.g. gpustack.v1.node.*.health"),
    Flag(
        "output",
        "json",
        "output format: one JSON document per line, YAML documents, or wide (a table, one "
        "event per row)",
        short="o",
        choices=("json", "yaml", "wide"),
    ),
    Flag(
        "kind",
        "",
        "only this kind of event",
        choices=("", "devices", "samples", "health", "allocations", "models", "agent"),
    ),
    Flag(
        "once",
        "false",
        "print the retained state and exit (the nats CLI's --terminate-at-end)",
        kind="bool",
    ),
    *NATS_FLAGS,
)

_STANDALONE = (
    Flag(
        "state-dir",
        "",
        "where the embedded NATS server keeps its state "
        "(default $XDG_STATE_HOME/gpustack-operator or ~/.local/state/gpustack-operator)",
    ),
    Flag(
        "nats-port",
        "4222",
        "the embedded NATS server's client port (0 picks a free one)",
        kind="int",
        bounds=PORT,
    ),
    Flag(
        "worker-port",
        WORKER_PORT,
        "the worker's HTTPS port (0 picks a free one)",
        kind="int",
        bounds=PORT,
    ),
    Flag(
        "device-manager-port",
        DEVICE_MANAGER_PORT,
        "the device agent's HTTPS port (0 picks a free one)",
        kind="int",
        bounds=PORT,
    ),
    Flag(
        "model-manager-port",
        MODEL_MANAGER_PORT,
        "the model agent's HTTPS port (0 picks a free one)",
        kind="int",
        bounds=PORT,
    ),
    Flag("run-for", "0s", "stop after this long (0 runs until interrupted)", kind="duration"),
    Flag(
        "dashboard-port",
        "31080",
        "the dashboard's HTTP port, on --bind-address (0 picks a free one)",
        kind="int",
        bounds=PORT,
    ),
    Flag(
        "bind-address",
        "127.0.0.1",
        "the address every HTTPS endpoint serves on; /metrics and the snapshots need no token "
        "here (the extension API still does), so any other address exposes them to whoever "
        "reaches it",
    ),
    *(
        flag
        for flag in _DM_SERVE
        if flag.name
        not in ("kube-socket", "state-dir", "secure-port", "bind-address", "metrics-auth")
        and flag not in NATS_FLAGS
    ),
)

_DASHBOARD = (
    Flag("port", "8080", "the HTTP port of the page and its event feed", kind="int", bounds=PORT),
    Flag(
        "bind-address",
        "127.0.0.1",
        "the address to serve on; the page needs no token, so any other address shows the "
        "bus's contents to whoever reaches it",
    ),
    *NATS_FLAGS,
)

COMMANDS = (
    Command(
        ("worker",),
        "The control plane: reconciles node events into CRDs.",
        _WORKER,
        settings="controlplane.worker.settings:settings_from",
        service="controlplane.worker.running:run",
        examples=(
            "# Run the control plane against the current kubeconfig's cluster\n"
            "gpustack-operator worker --kubeconfig ~/.kube/config --secure-port 31443\n"
        ),
    ),
    Command(
        ("worker-gateway",),
        "Aggregates resources from upstream clusters for worker.",
        _WORKER_GATEWAY,
        settings="controlplane.gateway.settings:settings_from",
        service="controlplane.gateway.running:run",
        examples=(
            "# What a GPUStack server runs (it spawns the gateway itself; the default mode)\n"
            "gpustack-operator wg --worker-conn-gpustack-api-port 30080 --bind-unix-path /tmp/g.sock\n"
            "# Serve this cluster's resources from the kubeconfig, as the worker's sidecar\n"
            "gpustack-operator wg --worker-conn-mode loopback --kubeconfig ~/.kube/config\n"
        ),
    ),
    Command(
        ("device-manager", "serve"),
        "The per-node device agent (kubelet device plugin).",
        _DM_SERVE,
        settings="agent.serve.settings:settings_from",
        service="agent.serve.running:run",
        examples=(
            "# The device agent of a simulated 8 x H200 node, sampling every 5 s\n"
            "gpustack-operator dm serve --simulate nvidia-h200x8 --monitor-period 5s\n"
        ),
    ),
    Command(
        ("model-manager",),
        "The per-node model cache (CSI node plugin).",
        _MODEL_MANAGER,
        settings="agent.models.settings:settings_from",
        service="agent.models.running:run",
        examples=(
            "# The node's model cache, as the DaemonSet runs it\n"
            "gpustack-operator mm --node-name node-1 --cache-root /var/lib/gpustack/models\n"
        ),
    ),
    Command(
        ("model-manager", "manifest"),
        "Resolve a Hugging Face or ModelScope repository at a revision and print its manifest "
        "and digest.",
        (
            _REVISION,
            *_SNAPSHOT,
            _OUTPUT_TEXT,
        ),
        settings="agent.models.manifest_cli:settings_from",
        oneshot="agent.models.manifest_cli:manifest_command",
        usage=" REPOSITORY",
        examples=(
            "# The manifest and digest a ModelArtifact would pin\n"
            "gpustack-operator mm manifest Qwen/Qwen3-0.6B --revision main\n"
            "\n"
            "# Only the weights and the config, as JSON\n"
            "gpustack-operator mm manifest Qwen/Qwen3-0.6B --allow-pattern '*.safetensors,*.json' -o json\n"
            "\n"
            "# The same repository on ModelScope (branch master)\n"
            "gpustack-operator mm manifest Qwen/Qwen3-0.6B --hub modelscope\n"
        ),
    ),
    Command(
        ("model-manager", "pull"),
        "Download and verify a Hugging Face or ModelScope snapshot into the node's model cache, "
        "as a mount would.",
        (
            dataclasses.replace(
                _REVISION, help="branch, tag or commit to pull (default main; master on ModelScope)"
            ),
            _CACHE_ROOT,
            *_SNAPSHOT,
            _OUTPUT_TEXT,
        ),
        settings="agent.models.pull:settings_from",
        oneshot="agent.models.pull:pull_command",
        usage=" REPOSITORY",
        examples=(
            "# Pull a snapshot into a cache directory of your own\n"
            "gpustack-operator mm pull Qwen/Qwen3-0.6B --cache-root /tmp/models\n"
            "\n"
            "# The result as JSON, for a script\n"
            "gpustack-operator mm pull Qwen/Qwen3-0.6B --cache-root /tmp/models -o json\n"
            "\n"
            "# From ModelScope\n"
            "gpustack-operator mm pull Qwen/Qwen3-0.6B --hub modelscope --cache-root /tmp/models\n"
        ),
    ),
    Command(
        ("device-manager", "detect"),
        "Run one detect pass and print the Devices spec.groups (a pure read).",
        _ONE_SHOT,
        settings="agent.devices.settings:detect_settings_from",
        oneshot="agent.oneshots:detect_command",
        examples=(
            "# This node's accelerators, one per row\n"
            "gpustack-operator dm detect -o wide\n"
            "\n"
            "# A simulated node, as YAML\n"
            "gpustack-operator dm detect --simulate nvidia-h200x8\n"
            "\n"
            "# The packaged simulation profiles\n"
            "gpustack-operator dm detect --simulate list\n"
        ),
    ),
    Command(
        ("device-manager", "monitor"),
        "Take one utilization sample per manufacturer and print it (a pure read).",
        _ONE_SHOT,
        settings="agent.devices.settings:detect_settings_from",
        oneshot="agent.oneshots:monitor_command",
        examples=(
            "# One utilization sample of this node's accelerators, one per row\n"
            "gpustack-operator dm monitor -o wide\n"
            "\n"
            "# A simulated node's sample, as JSON\n"
            "gpustack-operator dm monitor --simulate nvidia-h200x8 -o json\n"
        ),
    ),
    Command(
        ("device-manager", "preflight"),
        "Prove that the allocation modes work on this node (acts on the node).",
        _PREFLIGHT,
        settings="agent.preflight.running:settings_from",
        oneshot="agent.preflight.running:preflight_command",
        examples=(
            "# Print the container steps the checks would take, taking none\n"
            "gpustack-operator dm preflight --dry-run\n"
            "\n"
            "# Run the real checks against a simulated profile\n"
            "gpustack-operator dm preflight --simulate nvidia-h200x8 -o json\n"
        ),
    ),
    Command(
        ("standalone",),
        "Everything on one machine without a cluster: embedded NATS, device and model agents, worker.",
        _STANDALONE,
        settings="gpustack_operator.standalone:settings_from",
        service="gpustack_operator.standalone:main",
        examples=(
            "# Everything on this machine, until Ctrl-C; the page is on http://127.0.0.1:31080\n"
            "gpustack-operator standalone --simulate nvidia-h200x8\n"
            "\n"
            "# On free ports, for ten minutes\n"
            "gpustack-operator standalone --nats-port 0 --worker-port 0 --dashboard-port 0 --run-for 10m\n"
        ),
    ),
    Command(
        ("bus", "watch"),
        "Print the retained state of every matching node, then live bus events. The nats "
        "CLI's NATS_* variables and contexts (NATS_CONTEXT) apply under the --nats-* flags.",
        _BUS_WATCH,
        settings="gpustack_operator.buscli:watch_settings",
        service="gpustack_operator.buswatching:main",
        examples=(
            "# Every node's retained state as a table, then exit\n"
            "gpustack-operator bus watch --once -o wide\n"
            "\n"
            "# One node's health events, live, as JSON lines\n"
            "gpustack-operator bus watch --node node-1 --kind health\n"
        ),
    ),
    Command(
        ("dashboard",),
        "Serve the read-only dashboard page: every node's accelerators and models, live.",
        _DASHBOARD,
        settings="gpustack_operator.dashboard.serving:settings_from",
        service="gpustack_operator.dashboard.serving:main",
        examples=(
            "# The page for a standalone run's bus, read with its dashboard token, on\n"
            "# http://127.0.0.1:8080\n"
            "gpustack-operator dashboard --nats-url nats://127.0.0.1:4222 --nats-token-file "
            "~/.local/state/gpustack-operator/nats/auth/dashboard.token\n"
        ),
    ),
    Command(
        ("bus", "schema"),
        "Print the JSON Schema of every bus event.",
        (),
        settings="gpustack_operator.buscli:schema_settings",
        oneshot="gpustack_operator.buscli:schema_command",
        examples=(
            "# The JSON Schema of every bus event, pretty-printed\n"
            "gpustack-operator bus schema | jq .\n"
        ),
    ),
)

ALIASES = {"w": "worker", "wg": "worker-gateway", "dm": "device-manager", "mm": "model-manager"}
