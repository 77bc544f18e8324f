"""Who may publish and read what on the bus: the permission templates, pure and synchronous.

The bus's NodeRestriction. Every connection has one :class:`Identity`, proven when it connects
(:mod:`bus.callout`), and :func:`permissions_for` alone decides what the server lets it do:

``device-manager`` / ``model-manager`` of node N
    publish only N's subjects of its own kinds (``gpustack.v1.node.<N>.devices`` …); read only
    replies on its own inbox prefix (:func:`inbox_prefix`) and what it needs from the retained
    state: the device agent N's allocation history and N's ``pending.<N>`` key, the model agent
    N's ``nms.<N>`` key and the ``artifacts.*`` keys of ``GPUSTACK_V1_AGENTS``. No stream, consumer or bucket administration,
    no ``$KV`` writes, no ``$SYS``.
``dashboard``
    subscribe to every node's events and read the retained state; publish nothing but the
    read-only JetStream requests that reading needs.
``worker``
    the control plane: reads every node, creates and updates the streams and buckets, writes the
    buckets, answers the server's authorization requests.

The worker-gateway has no identity here: it never connects to the bus (it reaches clusters
through a GPUStack server's API, docs/gateway.md).

Allow lists deny everything they do not name; the explicit deny lists repeat the administrative
subjects so that a broader allow added later cannot reopen them. The same templates are rendered
into a user JWT (:func:`jwt_permissions`) and into server configuration
(:func:`config_permissions`), so the callout, ``standalone`` and ``deploy/`` cannot drift.
"""

from __future__ import annotations

from typing import Any, Final, Literal, get_args

import msgspec

from bus import kv, peers, subjects
from bus.state import HISTORY_STREAM, SAMPLES_STREAM, STATE_STREAM
from bus.subjects import Kind

__all__ = [
    "CALLOUT_SUBJECT",
    "ROLES",
    "Identity",
    "Permissions",
    "Role",
    "config_permissions",
    "inbox_prefix",
    "jwt_permissions",
    "permissions_for",
]

Role = Literal["worker", "device-manager", "model-manager", "dashboard"]
ROLES: Final[tuple[Role, ...]] = get_args(Role)
NODE_ROLES: Final[frozenset[Role]] = frozenset({"device-manager", "model-manager"})
KINDS_BY_ROLE: Final[dict[Role, tuple[Kind, ...]]] = {
    "device-manager": ("devices", "samples", "health", "allocations", "agent"),
    "model-manager": ("models",),
}
CALLOUT_SUBJECT: Final = "$SYS.REQ.USER.AUTH"
"""Where the server asks the callout service to authorize a connection."""
STATE_STREAMS: Final = (STATE_STREAM, SAMPLES_STREAM, HISTORY_STREAM)
BUCKETS: Final = (kv.AGENTS_BUCKET, kv.LEDGER_BUCKET)
_API: Final = "$JS.API"
_ADMIN: Final = tuple(
    f"{_API}.{verb}.>"
    for verb in (
        "STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE", "STREAM.MSG.DELETE",
        "STREAM.SNAPSHOT", "STREAM.RESTORE", "STREAM.PEER", "STREAM.LEADER", "CONSUMER.DELETE",
        "CONSUMER.DURABLE", "CONSUMER.PAUSE", "CONSUMER.RESET", "ACCOUNT", "META", "SERVER",
    )
)  # fmt: skip
_PUB_DENY: Final = (*_ADMIN, "$KV.>", "$OBJ.>", "$SYS.>")
_SUB_DENY: Final = ("$SYS.>",)


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """A proven identity: a role, and the node for the agents' roles."""

    role: Role
    node: str | None = None
    name: str = ""
    """How it was proven, for logs (e.g. the ServiceAccount's user name)."""

    def __post_init__(self) -> None:
        if (self.role in NODE_ROLES) != (self.node is not None):
            raise ValueError(f"role {self.role} {'needs' if self.node is None else 'has no'} node")
        if self.node is not None:
            subjects.encode_node(self.node)  # raises InvalidNodeName for a name with no subject

    @property
    def label(self) -> str:
        """``device-manager/gpu-1`` or ``worker``: the connection name the server shows."""
        return f"{self.role}/{self.node}" if self.node is not None else self.role


class Permissions(msgspec.Struct, frozen=True, kw_only=True):
    """What the server lets one connection publish and subscribe to."""

    pub_allow: tuple[str, ...]
    pub_deny: tuple[str, ...] = ()
    sub_allow: tuple[str, ...]
    sub_deny: tuple[str, ...] = ()
    allow_responses: bool = False
    """Reply to requests received (the callout's answers), whatever their reply subject."""
    websocket: bool = False
    """Also over WebSocket (browser dashboards); everyone else connects over TCP only."""


def inbox_prefix(identity: Identity) -> str:
    """The reply-subject prefix this identity's client must use (nats-py ``inbox_prefix``).

    Per identity, so one node cannot read the JetStream acknowledgements or key-value answers
    meant for another node or for the worker.
    """
    if identity.node is None:
        return f"_INBOX.{identity.role}"
    return f"_INBOX.{identity.role}.{subjects.encode_node(identity.node)}"


def permissions_for(identity: Identity) -> Permissions:
    """The permission template of ``identity`` (see the module docstring for the rules)."""
    inbox = f"{inbox_prefix(identity)}.>"
    if identity.role == "worker":
        return Permissions(
            pub_allow=(
                *_stream_admin(STATE_STREAMS),
                *_bucket_admin(BUCKETS),
            ),
            sub_allow=(
                subjects.ALL,
                inbox,
                CALLOUT_SUBJECT,
                subjects.REVIEW,
            ),
            allow_responses=True,
        )
    if identity.role == "dashboard":
        return Permissions(
            pub_allow=_stream_reads(STATE_STREAMS),
            pub_deny=_PUB_DENY,
            sub_allow=(subjects.ALL, inbox),
            sub_deny=_SUB_DENY,
            websocket=True,
        )
    assert identity.node is not None  # the node roles, checked by Identity
    own = tuple(subjects.subject(identity.node, k) for k in KINDS_BY_ROLE[identity.role])
    listens: tuple[str, ...] = ()
    if identity.role == "device-manager":
        reads = (*_history_reads(identity.node), *_pending_reads(identity.node))
    else:
        # Its own peer offers, and every model agent's (bus.peers: the server's check of who
        # publishes on peers.<N> is what binds a peer key to node N).
        reads = (*_agents_bucket_reads(identity.node), peers.subject(identity.node))
        listens = (peers.ALL,)
    # Every node agent may ask the worker to review a scraper's token (kit.access, H9).
    return Permissions(
        pub_allow=(*own, *reads, subjects.REVIEW),
        pub_deny=_PUB_DENY,
        sub_allow=(inbox, *listens),
        sub_deny=_SUB_DENY,
    )


def _consumer_reads(stream: str, filters: tuple[str, ...]) -> tuple[str, ...]:
    """Ephemeral pull consumers on ``stream``, created only with one of ``filters`` (nats-py
    names the filter in the request subject, and the server checks it against the body)."""
    return (
        *(f"{_API}.CONSUMER.CREATE.{stream}.*.{f}" for f in filters),
        f"{_API}.CONSUMER.INFO.{stream}.*",
        f"{_API}.CONSUMER.MSG.NEXT.{stream}.*",
    )


def _history_reads(node: str) -> tuple[str, ...]:
    """The device agent rebuilds its allocation ledger from its own retained history."""
    return _consumer_reads(HISTORY_STREAM, (subjects.subject(node, "allocations"),))


def _pending_reads(node: str) -> tuple[str, ...]:
    """The device agent reads the containers pending on its node (``pending.<node>``), by a
    direct get naming the key, so no other node's requests are readable."""
    stream = kv.stream_of(kv.AGENTS_BUCKET)
    key = kv.subject_of(kv.AGENTS_BUCKET, kv.pending_key(node))
    return (f"{_API}.STREAM.INFO.{stream}", f"{_API}.DIRECT.GET.{stream}.{key}")


def _agents_bucket_reads(node: str) -> tuple[str, ...]:
    """The model agent reads its store spec (``nms.<node>``) and every resolved artifact."""
    bucket = kv.AGENTS_BUCKET
    stream = kv.stream_of(bucket)
    return (
        f"{_API}.STREAM.INFO.{stream}",
        f"{_API}.DIRECT.GET.{stream}.{kv.subject_of(bucket, kv.nms_key(node))}",
        *_consumer_reads(stream, (kv.subject_of(bucket, "artifacts.>"),)),
    )


def _stream_reads(streams: tuple[str, ...]) -> tuple[str, ...]:
    """Read-only JetStream requests on ``streams``: info, ephemeral consumers, direct gets."""
    out: list[str] = []
    for s in streams:
        out += [
            f"{_API}.STREAM.INFO.{s}",
            f"{_API}.CONSUMER.CREATE.{s}",
            f"{_API}.CONSUMER.CREATE.{s}.>",
            f"{_API}.CONSUMER.INFO.{s}.>",
            f"{_API}.CONSUMER.MSG.NEXT.{s}.>",
            f"{_API}.DIRECT.GET.{s}",
            f"{_API}.DIRECT.GET.{s}.>",
            f"$JS.FC.{s}.>",
        ]
    return tuple(out)


def _stream_admin(streams: tuple[str, ...]) -> tuple[str, ...]:
    """Create and update ``streams``, read them, and delete the worker's own consumers."""
    out: list[str] = []
    for s in streams:
        out += [f"{_API}.STREAM.CREATE.{s}", f"{_API}.STREAM.UPDATE.{s}"]
        out += [f"{_API}.CONSUMER.DELETE.{s}.>", f"{_API}.STREAM.MSG.GET.{s}"]
    return (*out, *_stream_reads(streams))


def _bucket_admin(buckets: tuple[str, ...]) -> tuple[str, ...]:
    """Create, read and write the key-value ``buckets`` (their streams are ``KV_<bucket>``)."""
    return (
        *_stream_admin(tuple(kv.stream_of(b) for b in buckets)),
        *(kv.subject_of(b, ">") for b in buckets),
    )


def _lists(allow: tuple[str, ...], deny: tuple[str, ...]) -> dict[str, list[str]]:
    out = {"allow": list(allow)}
    if deny:
        out["deny"] = list(deny)
    return out


def jwt_permissions(p: Permissions) -> dict[str, Any]:
    """The ``nats`` claims of a user JWT carrying ``p`` (no limits beyond the server's own)."""
    claims: dict[str, Any] = {
        "pub": _lists(p.pub_allow, p.pub_deny),
        "sub": _lists(p.sub_allow, p.sub_deny),
        "subs": -1,
        "data": -1,
        "payload": -1,
        "allowed_connection_types": ["STANDARD", "WEBSOCKET"] if p.websocket else ["STANDARD"],
    }
    if p.allow_responses:
        claims["resp"] = {"max": 1, "ttl": 0}
    return claims


def config_permissions(p: Permissions) -> dict[str, Any]:
    """``p`` as a user's ``permissions`` block in the server configuration (JSON is valid
    NATS configuration syntax)."""
    block: dict[str, Any] = {
        "publish": _lists(p.pub_allow, p.pub_deny),
        "subscribe": _lists(p.sub_allow, p.sub_deny),
    }
    if p.allow_responses:
        block["allow_responses"] = True
    return block
