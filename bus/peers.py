"""Peer delivery between model agents: who serves which digest, and how a request proves its node.

Two things travel, both pure here (the agent does the I/O, :mod:`agent.models.peering`):

**Offers** (:class:`PeerOffer`) on ``gpustack.v1.peers.<node token>``: a model agent that serves
its published trees to its peers says, every ``announce_s`` and whenever its set of published
digests changes, at which URL it serves, which digests, and the *public* half of an Ed25519 NKey
it generated at start (the seed never leaves the process). Core NATS, no stream: an offer is
only as good as its sender is alive, so readers forget one after :data:`OFFER_TTL_S`.

Why a subject of its own rather than the ``models`` events: those name the Pods waiting for a
download (tenant names, not for other nodes) and carry neither an address nor a key, and a node
agent may not read other nodes' events. An offer carries digests, a URL and a key: nothing
about tenants.

**The binding of a key to a node** is the bus's trust model (docs/bus.md *Trust model*): the
server lets only node N's model-manager publish on ``gpustack.v1.peers.<N>`` (the callout
proved that identity from the Pod's bound ServiceAccount token), and a decoder drops an offer
whose ``node`` differs from its subject's. So "this key is node N's" is as strong as "this
event is node N's"; no secret is shared between nodes.

**Requests** are signed: :func:`request_text` is what a peer signs for one GET (the serving
node, the asking node, a time, the path), sent as ``Authorization: GPUStack-Peer
<node token>:<unix time>:<base64url signature>``. The server checks the signature with the key
the asking node offered, the time within :data:`SKEW_S`, and that it names the server itself (a
signature for another server is refused). A replay within the skew only fetches again bytes
its captor already saw; content is verified by digest on the reader's side in any case.

A server that holds no live offer of the asking node answers 401 with the challenge
``GPUStack-Peer error="unknown-node"`` (:func:`challenge`): offers are at-most-once, so a peer
may not have the asker's yet (it is on its way) or may have missed it; the asker answers by
announcing again and asking once more. Every other 401 is a plain ``GPUStack-Peer``.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Final

import msgspec
from msgspec import Meta

from bus import jwt, subjects
from bus.errors import InvalidNodeName, InvalidToken

__all__ = [
    "ALL",
    "MAX_DIGESTS",
    "OFFER_TTL_S",
    "PREFIX",
    "SCHEME",
    "SKEW_S",
    "UNKNOWN_NODE",
    "PeerOffer",
    "authorization",
    "challenge",
    "decode_offer",
    "encode_offer",
    "is_unknown_node",
    "parse_authorization",
    "request_text",
    "subject",
    "verify_request",
]

PREFIX: Final = "gpustack.v1.peers"
ALL: Final = f"{PREFIX}.*"
VERSION: Final = 1
OFFER_TTL_S: Final = 90.0
"""A reader forgets an offer not renewed for this long (three announcements at the default)."""
SKEW_S: Final = 60.0
"""A signed request's time may differ from the server's by at most this much."""
SCHEME: Final = "GPUStack-Peer"
MAX_DIGESTS: Final = 4096
"""Digests one offer names at most (about 270 KiB of JSON, under NATS's 1 MiB payload)."""
MAX_OFFER_BYTES: Final = 512 * 1024
UNKNOWN_NODE: Final = "unknown-node"
"""The reason a 401 gives when the asking node has no live offer at the server (its offer is
still on its way, or the server missed it): the one refusal the asker can cure, by
announcing again (:func:`challenge`)."""
_HEX: Final = re.compile(r"[0-9a-f]{64}")

Hex = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]


class PeerOffer(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What one model agent serves to its peers, and the key its requests are signed with."""

    v: int = VERSION
    node: Annotated[str, Meta(min_length=1, max_length=subjects.MAX_NODE_CHARS)]
    url: Annotated[str, Meta(max_length=512, pattern=r"^http://")]
    """``http://<address>:<port>``: where ``/peer/v1/trees/...`` is served."""
    key: Annotated[str, Meta(min_length=56, max_length=56)]
    """A public user NKey (``U…``): the requests of this node are signed with its seed."""
    digests: Annotated[tuple[Hex, ...], Meta(max_length=MAX_DIGESTS)] = ()
    """The 64-hex manifest digests of the published trees it serves."""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(PeerOffer).decode


def subject(node: str) -> str:
    """``gpustack.v1.peers.<node token>``. :raises InvalidNodeName: no subject for ``node``."""
    return f"{PREFIX}.{subjects.encode_node(node)}"


def encode_offer(offer: PeerOffer) -> bytes:
    return _encode(offer)


def decode_offer(subj: str, payload: bytes) -> PeerOffer | None:
    """The offer in ``payload``, or None when it is not one a reader may trust: too large,
    malformed, another version, a key that is not a user NKey, or a ``node`` that differs from
    the subject's (the subject is what the server checked)."""
    if len(payload) > MAX_OFFER_BYTES or not subj.startswith(PREFIX + "."):
        return None
    try:
        offer = _decode(payload)
        node = subjects.decode_node(subj[len(PREFIX) + 1 :])
        if jwt.public_key_type(offer.key) != "user":
            return None
    except (msgspec.DecodeError, msgspec.ValidationError, InvalidNodeName, InvalidToken):
        return None
    if offer.v != VERSION or offer.node != node:
        return None
    return offer


def request_text(server: str, client: str, at: int, path: str) -> bytes:
    """What the asking node signs for ``GET path`` on ``server``'s peer endpoint at unix ``at``."""
    return f"gpustack-peer v1\n{server}\n{client}\n{at}\nGET {path}\n".encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def authorization(key: jwt.NKey, server: str, client: str, at: int, path: str) -> str:
    """The ``Authorization`` header value of ``client``'s ``GET path`` on ``server``."""
    signature = key.sign(request_text(server, client, at, path))
    return f"{SCHEME} {subjects.encode_node(client)}:{at}:{_b64(signature)}"


def parse_authorization(value: str) -> tuple[str, int, bytes]:
    """``(client node, unix time, signature)`` of a header :func:`authorization` wrote.

    :raises InvalidToken: another scheme, or malformed.
    """
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME:
        raise InvalidToken(f"not a {SCHEME} authorization")
    token, at, sig = (rest.split(":") + ["", ""])[:3]
    try:
        node = subjects.decode_node(token)
        signature = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    except (InvalidNodeName, binascii.Error, ValueError) as e:
        raise InvalidToken(f"malformed {SCHEME} authorization") from e
    if not at.isascii() or not at.isdigit() or len(signature) != 64:
        raise InvalidToken(f"malformed {SCHEME} authorization")
    return node, int(at), signature


def verify_request(
    value: str, *, server: str, path: str, now: float, key_of: dict[str, str]
) -> str:
    """The asking node, once its signed ``Authorization`` for ``GET path`` checks out (pure).

    ``key_of``: node -> the public key its live offer carries.

    :raises InvalidToken: malformed, an unknown node, a time outside :data:`SKEW_S`, or a
        signature that is not that node's for this server and path.
    """
    client, at, signature = parse_authorization(value)
    key = key_of.get(client)
    if key is None:
        raise InvalidToken(f"node {client} offers no peer key")
    if abs(now - at) > SKEW_S:
        raise InvalidToken(f"request time {at} is more than {SKEW_S:.0f}s from {now:.0f}")
    jwt.verify(key, request_text(server, client, at, path), signature)
    return client


def challenge(*, unknown_node: bool) -> str:
    """The ``WWW-Authenticate`` value of a 401: with ``error="unknown-node"`` when the server
    holds no offer of the node the request names (the one refusal a re-announcement cures)."""
    return f'{SCHEME} error="{UNKNOWN_NODE}"' if unknown_node else SCHEME


def is_unknown_node(value: str | None) -> bool:
    """Whether a 401's ``WWW-Authenticate`` says :data:`UNKNOWN_NODE` (pure)."""
    return value is not None and value.strip() == challenge(unknown_node=True)


def is_hex(value: str) -> bool:
    return _HEX.fullmatch(value) is not None
