"""Whether a process is on the bus, and for how long it has not been: what ``/livez`` tells.

A :class:`Presence` exists before the process's first connection (it is off the bus from its
start until then) and is told by :func:`bus.connection.connect` when a client connects and
when one is lost. Pure and synchronous: the caller passes the clock (anyio's monotonic
``current_time``), so the decision is tested without a loop or a server.

Invariant: ``offline_since`` is the moment the process last went off the bus and has not been
back since; a connection that comes and goes again does not reset it unless it was up.
"""

from __future__ import annotations

__all__ = ["Presence"]


class Presence:
    """On the bus or not, and since when not."""

    def __init__(self, *, since: float) -> None:
        """:param since: when the process started (off the bus until its first connection)."""
        self._offline_since: float | None = since

    @property
    def online(self) -> bool:
        """True while a client is connected."""
        return self._offline_since is None

    def connected(self) -> None:
        """A client is connected (the first one, or one replacing a lost one)."""
        self._offline_since = None

    def lost(self, now: float) -> None:
        """The connection ended at ``now``; a loss while already off changes nothing."""
        if self._offline_since is None:
            self._offline_since = now

    def offline_for(self, now: float) -> float:
        """Seconds off the bus at ``now`` (0 while on it)."""
        return 0.0 if self._offline_since is None else max(0.0, now - self._offline_since)

    def alive(self, now: float, bound_s: float) -> bool:
        """The liveness verdict: not off the bus for longer than ``bound_s``."""
        return self.offline_for(now) <= bound_s
