"""Who among this cluster's model agents holds which digest, and telling them what we hold.

:class:`Directory` keeps the live :class:`bus.peers.PeerOffer` of every other model agent (fed
from the ``gpustack.v1.peers.*`` subscription; an offer not renewed within
:data:`bus.peers.OFFER_TTL_S` is forgotten), answers :meth:`Directory.holders` for a
download and :meth:`Directory.keys` for the peer server's signature checks. Its decisions are
pure; :func:`follow` is the I/O: subscribe, then announce this node's own offer every
``announce_s`` and at once when the published set changes.

The peer key (:class:`PeerSettings` holds none: it is made per process, :func:`new_key`) is an
Ed25519 NKey whose seed never leaves the process; only its public half is announced. See
:mod:`bus.peers` for why the announcement binds it to this node.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import msgspec

from bus import jwt
from bus import peers as contract
from bus.errors import BusError

if TYPE_CHECKING:  # the one-shot pull imports this module, and never the bus transport
    from bus.connection import Connection

__all__ = ["Directory", "PeerSettings", "Peering", "follow", "new_key"]

log = logging.getLogger(__name__)


class PeerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Peer delivery of one model agent (off without a ``port``: no serving, no pulling)."""

    port: int | None = None
    """Where ``/peer/v1/...`` is served (plain HTTP: every byte is verified by digest); None:
    peer delivery is off (``--peer-port=0``); 0 in tests: any free port."""
    bind_address: str = "0.0.0.0"
    address: str = ""
    """The address other nodes reach this one at (the Pod IP); empty: no serving, no offer."""
    announce_s: float = 30.0
    serving_streams: int = 8
    """Files served at once; a request waits up to ``queue_s`` for a slot, then 503."""
    queue_s: float = 5.0

    @property
    def enabled(self) -> bool:
        return self.port is not None


def new_key() -> jwt.NKey:
    """A fresh peer key for this process (a user NKey: the type bus.peers accepts)."""
    return jwt.NKey.generate("user")


@dataclass
class Directory:
    """The live offers of the other model agents (pure bookkeeping; the loop owns it)."""

    node: str
    clock: Callable[[], float] = time.monotonic
    offers: dict[str, tuple[contract.PeerOffer, float]] = field(default_factory=dict)
    newcomer: bool = False
    """A node not known (or forgotten) offered: it has not heard our offer yet, so ours goes
    out again at once rather than at the next period (a node that starts learns every peer's
    key within a tick, not a period)."""

    def on_message(self, subject: str, payload: bytes) -> None:
        """Keep the offer in ``payload`` (a bad one is dropped; our own is ignored)."""
        offer = contract.decode_offer(subject, payload)
        if offer is None:
            log.debug("dropped a peer offer on %s", subject)
            return
        if offer.node != self.node:
            self.newcomer |= offer.node not in self.offers
            self.offers[offer.node] = (offer, self.clock())

    def _live(self) -> list[contract.PeerOffer]:
        now = self.clock()
        for node, (_, at) in list(self.offers.items()):
            if now - at > contract.OFFER_TTL_S:
                del self.offers[node]
        return [o for o, _ in self.offers.values()]

    def holders(self, hex_: str) -> list[contract.PeerOffer]:
        """The live peers that offer ``hex_``, in the order the download tries them: an order
        of this node's own (a hash of both names), so the nodes pulling one model spread over
        the nodes that hold it instead of all asking the first by name."""
        return sorted((o for o in self._live() if hex_ in o.digests), key=self._rank)

    def _rank(self, offer: contract.PeerOffer) -> bytes:
        return hashlib.sha256(f"{self.node}\0{offer.node}".encode()).digest()

    def keys(self) -> dict[str, str]:
        """node -> the public key of its live offer (whose signatures the server accepts)."""
        return {o.node: o.key for o in self._live()}


async def follow(
    conn: Connection,
    directory: Directory,
    own: Callable[[], Awaitable[contract.PeerOffer | None]],
    *,
    every_s: float,
    tick_s: float = 1.0,
) -> None:
    """Read every peer's offers and announce ``await own()`` until cancelled.

    The own offer is looked at every ``tick_s`` and sent when it changed (a tree was published
    or collected: peers learn of it within a tick), when a node we did not know offered (it
    missed ours), or when ``every_s`` passed since it was last sent. None: nothing to offer. A publish that fails (not connected) is tried at the next
    tick: an offer is a repeated claim, never a queued one.
    """
    async with conn.subscribe(contract.ALL, _quiet(directory.on_message)):
        subject = contract.subject(directory.node)
        sent: contract.PeerOffer | None = None
        sent_at = -float("inf")
        while True:
            offer = await own()
            now = anyio.current_time()
            hello, directory.newcomer = directory.newcomer, False
            if offer is not None and (hello or offer != sent or now - sent_at >= every_s):
                try:
                    await conn.publish(subject, contract.encode_offer(offer))
                    sent, sent_at = offer, now
                except BusError as e:
                    log.debug("peer offer not sent: %s", e)
            await anyio.sleep(tick_s)


def _quiet(handler: Callable[[str, bytes], None]) -> Callable[[str, bytes], None]:
    """``handler`` that never raises into the client's reader path."""

    def call(subject: str, payload: bytes) -> None:
        try:
            handler(subject, payload)
        except Exception:
            log.exception("peer offer on %s", subject)

    return call


@dataclass
class Peering:
    """One model agent's part in peer delivery: its key, the peers it knows, where it serves.

    Made once per process when ``settings`` enable it; the plugin sets :attr:`url` once its
    peer server listens, and :meth:`offer` says nothing before that (a peer must never be sent
    to an address that does not answer yet).
    """

    node: str
    settings: PeerSettings
    key: jwt.NKey = field(default_factory=new_key)
    directory: Directory = field(init=False)
    url: str | None = None

    def __post_init__(self) -> None:
        self.directory = Directory(self.node)

    def offer(self, hexes: list[str]) -> contract.PeerOffer | None:
        """This node's offer of the published ``hexes`` (None: not serving yet); at most
        :data:`bus.peers.MAX_DIGESTS` of them, so the offer stays one valid message."""
        if self.url is None:
            return None
        digests = tuple(sorted(hexes)[: contract.MAX_DIGESTS])
        return contract.PeerOffer(
            node=self.node, url=self.url, key=self.key.public_key, digests=digests
        )
