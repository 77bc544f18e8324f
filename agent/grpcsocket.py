"""grpclib servers on unix sockets: :func:`unix_server`, the one way the agent binds one.

The device plugins (one socket per resource, bound again whenever kubelet deletes it) and the CSI
driver both serve kubelet over a unix socket, and both need what grpclib's ``Server`` leaves out:

- the bind shielded from cancellation: a cancel landing inside the event loop's bind would leave
  a listening server that grpclib never recorded, and a socket file nobody removes;
- the socket file's mode set right after the bind (before that it has the umask's mode, which
  lets only its owner connect under the usual 022);
- the accepted connections tracked, each forgotten as soon as it is lost, so a long-lived server
  that kubelet connects to again and again holds only the live ones;
- a bounded, shielded shutdown that closes the server and every connection: ``Server.close()``
  cancels handlers but leaves connections for the peer to drop, and one alive past the event
  loop is an unclosed transport;
- the socket file removed only while it is still the one we bound: kubelet deletes plugin
  sockets when it restarts, and another process may have bound a new one at the same path.

:func:`socket_identity` is how "the one we bound" is told apart: (inode, change time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from asyncio import BaseTransport
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from grpclib.encoding.base import CodecBase
from grpclib.protocol import H2Protocol
from grpclib.server import Server

from kit import files
from kit.options import SettingsError

__all__ = [
    "Bound",
    "Connections",
    "Identity",
    "SocketPathTooLong",
    "socket_identity",
    "unix_server",
]

log = logging.getLogger(__name__)

MODE = 0o600
"""Only the owner (kubelet runs as root, and so do we) may connect."""
CLOSE_TIMEOUT_S = 5.0
"""How long leaving :func:`unix_server` may spend closing the server and its connections."""
_CLOSE_POLL_S = 0.005


class SocketPathTooLong(SettingsError):
    """The socket's path does not fit a unix socket address (:data:`files.SOCKET_PATH_BYTES`).

    A :class:`SettingsError` (exit 2): the path is first whole here, but only a shorter
    directory setting (``--state-dir``, a socket directory) mends it.
    """


Identity = tuple[int, int]
"""(inode, change time in ns) of a socket file: a new socket at the same path differs."""


def socket_identity(path: str | os.PathLike[str]) -> Identity | None:
    """The :data:`Identity` of the socket at ``path``; None when there is no socket there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None


class Connections:
    """The live connections of one server: added when accepted, dropped when lost."""

    def __init__(self) -> None:
        self._live: set[_Tracked] = set()
        self.accepted = 0
        """Connections accepted so far, live or not."""

    def __len__(self) -> int:
        return len(self._live)

    def add(self, protocol: _Tracked) -> None:
        self._live.add(protocol)
        self.accepted += 1

    def lost(self, protocol: _Tracked) -> None:
        self._live.discard(protocol)

    async def close(self) -> None:
        """Close every connection and return once each is lost (callers bound the wait).

        Call it after the server stopped listening. A connection accepted just before may have
        no transport yet (``connection_made`` comes a turn later): a later turn closes it.
        """
        while self._live:
            for protocol in list(self._live):
                protocol.close()
            await anyio.lowlevel.checkpoint()
            if self._live:
                await anyio.sleep(_CLOSE_POLL_S)


class _Tracked(H2Protocol):
    """grpclib's protocol of one connection, telling :class:`Connections` when it is lost."""

    def __init__(self, base: H2Protocol, connections: Connections) -> None:
        super().__init__(base.handler, base.config, base.h2_config)
        self._connections = connections
        self._made = False

    def connection_made(self, transport: BaseTransport) -> None:
        super().connection_made(transport)
        self._made = True

    def connection_lost(self, exc: BaseException | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._connections.lost(self)

    def close(self) -> None:
        """What grpclib does when the peer leaves: close the transport, stop the pings."""
        if self._made:
            self.connection.close()


class _Server(Server):
    """grpclib's server, with every connection's protocol known to :class:`Connections`.

    The override of ``_protocol_factory`` is the one place the agent leans on grpclib's
    internals: it has no public hook for accepted connections.
    """

    def __init__(
        self, handlers: Collection[Any], codec: CodecBase | None, connections: Connections
    ) -> None:
        super().__init__(list(handlers), codec=codec)
        self.connections = connections
        self.started = False
        self._closed = False

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        if self._closed:
            # asyncio makes the protocol of a connection it accepted in a task of its own; once
            # the server is closed, that task fails before the transport exists (and asyncio
            # drops the socket): such a protocol never connects, so it is not waited for.
            return protocol
        tracked = _Tracked(protocol, self.connections)
        self.connections.add(tracked)
        return tracked

    async def shut_down(self) -> None:
        """Stop accepting, cancel handlers, close every connection; wait for all of it."""
        if not self.started:
            return
        # One turn first: connections asyncio accepted on the previous turn get their
        # transport while the server can still take them (it refuses once closed).
        await anyio.lowlevel.checkpoint()
        self._closed = True
        self.close()
        await self.connections.close()
        await self.wait_closed()


@dataclass(frozen=True)
class Bound:
    """What :func:`unix_server` yields: where it listens, and what it bound there."""

    path: Path
    identity: Identity
    connections: Connections

    def intact(self) -> bool:
        """Whether ``path`` is still our socket (kubelet deletes it when it restarts)."""
        return socket_identity(self.path) == self.identity


@asynccontextmanager
async def unix_server(
    path: str | os.PathLike[str],
    handlers: Collection[Any],
    *,
    mode: int = MODE,
    codec: CodecBase | None = None,
    close_timeout_s: float = CLOSE_TIMEOUT_S,
) -> AsyncIterator[Bound]:
    """Serve ``handlers`` on the unix socket ``path`` until the block exits.

    A socket left at ``path`` (a crashed run's) is replaced; anything else there fails the bind.
    ``codec`` is grpclib's (protobuf when None). Leaving closes the server and every
    connection, shielded and within ``close_timeout_s``, then removes ``path`` if it is still
    the socket bound here. A cancelled start leaves nothing behind: no server, no socket file.
    """
    where = Path(path)
    server = _Server(handlers, codec, Connections())
    ours: list[Identity] = []
    await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled already: touch nothing
    try:
        with anyio.CancelScope(shield=True):  # the bind is local and instant
            await _bind(server, where, mode, ours)
        await anyio.lowlevel.checkpoint_if_cancelled()
        yield Bound(where, ours[-1], server.connections)
    finally:
        with anyio.move_on_after(close_timeout_s, shield=True) as scope:
            await server.shut_down()
        if scope.cancelled_caught:
            log.warning(
                "%s: %d connections still open after %.1f s",
                where,
                len(server.connections),
                close_timeout_s,
            )
        _unlink_if(where, ours)


async def _bind(server: _Server, path: Path, mode: int, ours: list[Identity]) -> None:
    """Bind ``path``, recording in ``ours`` each identity it has (the mode changes it).

    :raises SocketPathTooLong: before anything is touched.
    """
    try:
        files.socket_path(path)
    except files.InputRefused as e:
        raise SocketPathTooLong(str(e)) from e
    if socket_identity(path) is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    await server.start(path=str(path))
    server.started = True
    _remember(path, ours)
    os.chmod(path, mode)
    _remember(path, ours)


def _remember(path: Path, ours: list[Identity]) -> None:
    identity = socket_identity(path)
    if identity is not None:
        ours.append(identity)


def _unlink_if(path: Path, ours: list[Identity]) -> None:
    """Remove ``path`` if it is a socket bound here; somebody else's stays."""
    if ours and socket_identity(path) in ours:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
