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
    streams_per_source: int = 4
    """Files served at once to one asking node (within ``serving_streams``): one node pulling
    many files never takes every stream from the others."""
    queue_s: float = 5.0
    hello_wait_s: float = 2.0
    """How long a request of a node with no live offer here waits for one to arrive (a node
    that just started asks as its first offer travels), then 401 ``unknown-node``."""

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
    """A node not known (or forgotten) offered, or a peer refused us as unknown
    (:meth:`announce`): ours goes out again at the next tick rather than at the next period (a
    node that starts learns every peer's key within a tick, not a period)."""
    waiting: int = 0
    """Requests waiting in :meth:`wait_for` now (the peer server bounds them)."""
    _arrived: anyio.Event | None = None
    """Set (and dropped) when an offer arrives: what :meth:`wait_for` waits on."""
    _sent: anyio.Event | None = None
    """Set (and dropped) when our offer went out: what :meth:`announce` waits on."""
    _wake: anyio.Event | None = None
    """Set by :meth:`announce` to end :meth:`nap` early."""

    def on_message(self, subject: str, payload: bytes) -> None:
        """Keep the offer in ``payload`` (a bad one is dropped; our own is ignored)."""
        offer = contract.decode_offer(subject, payload)
        if offer is None:
            log.debug("dropped a peer offer on %s", subject)
            return
        if offer.node != self.node:
            self.newcomer |= offer.node not in self.offers
            self.offers[offer.node] = (offer, self.clock())
            if self._arrived is not None:
                self._arrived.set()
                self._arrived = None

    async def wait_for(self, node: str, timeout_s: float) -> bool:
        """Whether ``node`` has a live offer, waiting up to ``timeout_s`` for one to arrive (a
        node that just started may ask before its first offer reached us: it is on its way)."""
        self.waiting += 1
        try:
            with anyio.move_on_after(timeout_s):
                while not self.knows(node):
                    if self._arrived is None:
                        self._arrived = anyio.Event()
                    await self._arrived.wait()
        finally:
            self.waiting -= 1
        return self.knows(node)

    def sent(self) -> None:
        """Our offer went out (:func:`follow` says so): wakes :meth:`announce`."""
        if self._sent is not None:
            self._sent.set()
            self._sent = None

    async def announce(self, timeout_s: float) -> bool:
        """Have our offer sent again at the next tick, and wait (up to ``timeout_s``) until it
        was: a peer that answered "unknown node" missed it. False: not sent in time (no
        connection, or nothing to offer yet)."""
        if self._sent is None:
            self._sent = anyio.Event()
        sent, self.newcomer = self._sent, True
        if self._wake is not None:
            self._wake.set()
        with anyio.move_on_after(timeout_s):
            await sent.wait()
            return True
        return False

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

    async def nap(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when :meth:`announce` asks for our offer meanwhile."""
        self._wake = anyio.Event()
        with anyio.move_on_after(seconds):
            await self._wake.wait()
        self._wake = None

    def knows(self, node: str) -> bool:
        """Whether ``node`` has a live offer here (its signatures can be checked)."""
        return node in self.keys()

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
    missed ours) or a peer refused us as unknown (:meth:`Directory.announce`), or when ``every_s`` passed since it was last sent. None: nothing to offer. A publish that fails (not connected) is tried at the next
    tick: an offer is a repeated claim, never a queued one.
    """
    async with conn.subscribe(contract.ALL, _quiet(directory.on_message)):
        subject = contract.subject(directory.node)
        sent: contract.PeerOffer | None = None
        sent_at = -float("inf")
        while True:
            offer = await own()
            now = anyio.current_time()
            due = directory.newcomer or offer != sent or now - sent_at >= every_s
            if offer is not None and due:
                try:
                    await conn.publish(subject, contract.encode_offer(offer))
                    sent, sent_at, directory.newcomer = offer, now, False
                    directory.sent()
                except BusError as e:
                    log.debug("peer offer not sent: %s", e)
            await directory.nap(tick_s)


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
