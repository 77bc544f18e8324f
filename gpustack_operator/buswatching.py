"""``gpustack-operator bus watch``: print the retained state of the bus, then follow it live.

``json`` writes one compact JSON object per line, ``yaml`` documents separated by ``---``,
``wide`` a kubectl-style table (:mod:`gpustack_operator.buswide`). JSON and YAML are the wire
form (camelCase keys), so a line can be replayed onto the bus. ``--once`` prints the retained
state and exits, as the nats CLI's ``--terminate-at-end`` does.

The JSON path is a relay, and keeps up with a bare nats-py subscriber (docs/benchmarks.md):
every message is decoded once, by the same :class:`~bus.codec.Guard` every subscriber passes,
and the *payload it arrived as* is written, never encoded again (a payload holding a raw newline,
valid JSON from another publisher, is the one exception: it is re-encoded so one line
stays one event). Output is binary and buffered; it is flushed after every event on a
terminal, and otherwise whenever nothing more is waiting, so ``| jq`` and ``| head`` still see
each event as soon as the stream goes quiet, while a burst costs one write per buffer.

Standard output is written by a thread of its own (:class:`Stdout`), never by the event loop:
a reader that stops reading (a stalled ``| consumer``, a paused pager) fills the pipe, and a
loop blocked in ``write`` would never see SIGTERM or SIGINT. The loop keeps running, so a signal
ends the watch at once; what stays unwritten is abandoned with the (daemon) thread. While more
than :data:`BACKLOG_BYTES` wait for the reader, events are dropped whole (never a torn line) and
counted, and the count is logged when the reader catches up, as a NATS server treats a slow
consumer.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from typing import Final, Protocol

import anyio
import msgspec

from bus import codec, connection, events, state, subjects, subscribing
from bus.errors import NotConnected, StateUnavailable
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from gpustack_operator import buswide
from gpustack_operator.buscli import WatchSettings, credentials_hint
from kit import rendering

__all__ = ["FORMATS", "Printer", "Stdout", "format_event", "main", "watch"]

log = logging.getLogger(__name__)

FORMATS: Final = ("json", "yaml", "wide")
STATE_RETRY_S: Final = 1.0
_BUFFER: Final = 1 << 16
BACKLOG_BYTES: Final = 16 << 20
"""Output waiting for a reader beyond which events are dropped (whole) until it catches up."""
DRAIN_S: Final = 1.0
"""How long a stopping watch waits for the reader to take what is already printed."""


class Output(Protocol):
    """Where events are written: a binary file (tests), or :class:`Stdout`."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


def format_event(event: events.Event, fmt: str) -> str:
    """One event as text in ``fmt``, ending with a newline (a ``wide`` row has no header).

    :raises ValueError: ``fmt`` is not one of :data:`FORMATS`.
    """
    return _render(codec.encode(event), event, fmt).decode()


def _render(data: bytes, event: events.Event, fmt: str) -> bytes:
    """``data`` (the payload ``event`` was decoded from) as ``fmt``, ending in a newline."""
    if fmt == "json":
        if b"\n" in data:
            data = codec.encode(event)  # one event, one line
        return data + b"\n"
    if fmt == "yaml":
        # The payload itself, so YAML shows exactly the wire form (camelCase, RFC 3339 strings),
        # in the one YAML style every command prints.
        return ("---\n" + rendering.yaml_text(msgspec.json.decode(data))).encode()
    if fmt == "wide":
        return buswide.wide_row(event).encode()
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


class Printer:
    """Writes events to a binary stream in one format; flushes as the module docstring says."""

    def __init__(self, out: Output, fmt: str, *, tty: bool) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        self._out, self._fmt, self._tty = out, fmt, tty
        self._json = fmt == "json"
        self._stdout = out if isinstance(out, Stdout) else None
        """The output when it can stall (decided once, not per event)."""
        self._header = buswide.HEADER.encode() if fmt == "wide" else b""
        """A table's header, until the first row is written (an empty table has none)."""
        self._said_none = False

    def stalled(self) -> bool:
        """The reader is not keeping up: the next event is dropped and counted instead
        (only a :class:`Stdout` output ever stalls)."""
        out = self._stdout
        return out is not None and out.over_backlog()

    def print(self, valid: state.Valid, *, more: bool) -> None:
        """Write one event; ``more``: another is already waiting (flush later, off a TTY)."""
        (_, data), event = valid
        if self.stalled():
            return
        self.relay(data, event)
        if not more and not self._tty:
            self._out.flush()

    def relay(self, data: bytes, event: events.Event) -> None:
        """Write one event that ``data`` was decoded to, more to come (flushed only on a TTY)."""
        if self._json and b"\n" not in data:
            # the hot path: no copy, no encode, no str
            if (out := self._stdout) is not None:
                out.line(data)
            else:
                self._out.write(data)
                self._out.write(b"\n")
        else:
            if self._header:
                self._out.write(self._header)
                self._header = b""
            self._out.write(_render(data, event, self._fmt))
        if self._tty:
            self._out.flush()

    def flush(self) -> None:
        self._out.flush()

    def none_found(self) -> None:
        """The retained state was empty: a table with no row yet says so on stderr, as
        ``kubectl get`` does (a document stream stays empty, so ``| jq`` reads nothing)."""
        if self._header and not self._said_none:
            self._said_none = True  # once, not again after every reconnect
            sys.stderr.write("No resources found.\n")


async def watch(
    *,
    settings: BusSettings,
    node: str | None,
    subject: str | None,
    fmt: str,
    out: Output,
    kind: subjects.Kind | None = None,
    once: bool = False,
    tty: bool = False,
) -> None:
    """Print retained state of every matching node, then live events, until cancelled.

    :param node: only this node (combined with ``subject`` and ``kind``).
    :param subject: a filter such as ``gpustack.v1.node.*.health``.
    :param kind: only this kind of event.
    :param once: print the retained state and return.
    :param tty: ``out`` is a terminal: flush after every event.
    :raises ValueError: unknown ``fmt``.
    :raises InvalidSubject: ``subject`` is outside the bus's subject space.
    :raises InvalidNodeName: ``node`` cannot be put in a subject.
    :raises NotConnected: no server answered.
    :raises StateUnavailable: ``once`` and the retained state cannot be read.

    Until the retention streams exist (no agent or worker has run yet) a live watch waits.
    """
    printer = Printer(out, fmt, tty=tty)
    if subject is not None:
        sub_node, sub_kind = subscribing.parse_filter(subject)
        if (sub_node and node and sub_node != node) or (sub_kind and kind and sub_kind != kind):
            printer.flush()
            return  # the filters exclude each other
        node, kind = node or sub_node, kind or sub_kind
    async with connection.connect(settings, name="bus-watch", retry=False) as conn:
        if once:
            await _once(conn, settings, node, kind, printer)
            return
        await _relay(conn, settings, node, kind, printer)


async def _once(
    conn: connection.Connection,
    settings: BusSettings,
    node: str | None,
    kind: subjects.Kind | None,
    printer: Printer,
) -> None:
    found = await state.retained(conn, settings, node=node, kind=kind)
    for valid in found:
        printer.print(valid, more=True)
    printer.flush()
    if not found:
        printer.none_found()


async def _relay(
    conn: connection.Connection,
    settings: BusSettings,
    node: str | None,
    kind: subjects.Kind | None,
    printer: Printer,
) -> None:
    """Live messages are printed in the client's delivery callback, as they come (no hop
    through another task: that hop cost as much as the client's own delivery); the retained
    state is printed when its read completes, so it lands after the live messages received
    before it, the order :mod:`bus.subscribing` keeps. It is read again after every reconnect.
    A flush waits until the client has delivered everything queued (the flusher runs only then).

    :raises OSError: writing failed (``BrokenPipeError``: the reader went away).
    """
    relay = _Relay(conn, settings, node, kind, printer)
    with relay.stop:
        async with (
            conn.subscribe(subjects.filter_for(node, kind), relay.on_message),
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(relay.flusher)
            await relay.read_state()
            await conn.every_reconnect(relay.read_state)
    if relay.failed:
        raise relay.failed[0]


class _Relay:
    """The parts of :func:`_relay`: a write failure, in whichever of them, ends the watch
    from the relay's own task (never inside the client's callback, which must not raise)."""

    def __init__(
        self,
        conn: connection.Connection,
        settings: BusSettings,
        node: str | None,
        kind: subjects.Kind | None,
        printer: Printer,
    ) -> None:
        self._conn, self._settings, self._node, self._kind = conn, settings, node, kind
        self._printer = printer
        self._guard = state.guard_for(settings, BusMetrics())
        self._dirty = anyio.Event()
        self.failed: list[OSError] = []
        self.stop = anyio.CancelScope()

    def _fail(self, e: OSError) -> None:
        self.failed.append(e)
        self.stop.cancel()

    def on_message(self, subj: str, data: bytes) -> None:
        event = self._guard.accept(subj, data)
        if event is None or self.failed or self._printer.stalled():
            return
        try:
            self._printer.relay(data, event)
        except OSError as e:
            self._fail(e)
        if not self._dirty.is_set():
            self._dirty.set()

    async def flusher(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            try:
                self._printer.flush()
            except OSError as e:
                self._fail(e)

    async def read_state(self) -> None:
        while True:
            try:
                found = await state.retained(
                    self._conn, self._settings, node=self._node, kind=self._kind, guard=self._guard
                )
            except StateUnavailable as e:
                # A dashboard may start before any agent: wait for the state to appear.
                log.warning("waiting for the bus's retained state: %s", e)
                await anyio.sleep(STATE_RETRY_S)
                continue
            try:
                for valid in found:
                    self._printer.print(valid, more=True)
                self._printer.flush()
                if not found:
                    self._printer.none_found()
            except OSError as e:
                self._fail(e)
            return


async def main(settings: WatchSettings) -> int | None:
    """The ``bus watch`` service: print to standard output until stopped (``--once``: until
    the retained state is printed, then exit 0).

    :raises NotConnected: no server answered, or it refused the credentials (with what to pass).
    """
    out = Stdout(sys.stdout.fileno())
    try:
        try:
            await watch(
                settings=settings.bus,
                node=settings.node,
                kind=settings.kind,
                subject=settings.subject,
                fmt=settings.output,
                once=settings.once,
                out=out,
                tty=out.isatty(),
            )
        except NotConnected as e:
            hint = credentials_hint(settings.bus, str(e))
            if hint is None:
                raise
            raise NotConnected(f"{e}; {hint}") from e
        finally:
            # Stopped mid-burst: what was taken is still printed, if the reader takes it soon.
            with anyio.CancelScope(shield=True):
                await out.drain()
        out.check()
    except BrokenPipeError:
        # The reader went away (``| head``): that ends the watch, and is not a failure.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0 if settings.once else None


class Stdout:
    """A file descriptor written by a daemon thread: ``write`` and ``flush`` never block.

    ``write`` gathers bytes in a buffer only the event loop touches (no lock per event);
    ``flush``, or a pipe's worth gathered, hands the buffer whole to the thread, which writes
    the buffers in order. A write error (``BrokenPipeError``) is raised by the next ``write``,
    ``flush`` or :meth:`check`. Invariant: the event loop never waits on the descriptor, so
    nothing a reader does can keep it from a signal.
    """

    def __init__(self, fd: int, *, backlog: int = BACKLOG_BYTES) -> None:
        self._fd, self._limit = fd, backlog
        self._local = bytearray()
        self._chunks: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._handed = 0
        """Bytes handed to the thread so far: only the event loop changes it."""
        self._written = 0
        """Bytes the thread wrote so far: only the thread changes it (no lock for either)."""
        self._draining = False
        self._drained = threading.Condition()
        """Waited on only by :meth:`drain`; the thread notifies it only while one waits."""
        self._error: OSError | None = None
        self._dropped = 0
        threading.Thread(target=self._run, name="bus-watch-stdout", daemon=True).start()

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: bytes) -> int:
        if self._error is not None:
            raise self._error
        self._local += data
        if len(self._local) >= _BUFFER:
            self._hand()
        return len(data)

    def line(self, data: bytes) -> None:
        """:meth:`write` of ``data`` and a newline, in one call (the relay's hot path)."""
        if self._error is not None:
            raise self._error
        local = self._local
        local += data
        local += b"\n"
        if len(local) >= _BUFFER:
            self._hand()

    def flush(self) -> None:
        self.check()
        if self._local:
            self._hand()

    def _hand(self) -> None:
        """Give the buffer to the thread: a ``SimpleQueue.put`` (C, wakes the thread), not a
        ``Condition`` (a Python lock dance per flush: 5 % of a busy watch's CPU measured)."""
        chunk, self._local = self._local, bytearray()
        self._handed += len(chunk)
        self._chunks.put(chunk)

    def check(self) -> None:
        """:raises OSError: the last write failed (the reader went away)."""
        if self._error is not None:
            raise self._error

    def backlog(self) -> int:
        """Bytes taken and not yet written."""
        return self._handed - self._written + len(self._local)

    def over_backlog(self) -> bool:
        """True (and one more event counted as dropped) while too much waits for the reader."""
        if self._handed - self._written + len(self._local) <= self._limit:  # backlog(), inline
            if self._dropped:
                log.warning("standard output was not read: %d events dropped", self._dropped)
                self._dropped = 0
            return False
        if not self._dropped:
            log.warning("standard output is not read: dropping events until it is")
        self._dropped += 1
        return True

    async def drain(self, timeout_s: float = DRAIN_S) -> None:
        """Wait until everything taken is written, a write failed, or ``timeout_s`` passed
        (a reader that does not read: the rest is abandoned)."""
        if self._local:
            self._hand()
        await anyio.to_thread.run_sync(self._wait_drained, timeout_s, abandon_on_cancel=True)

    def _wait_drained(self, timeout_s: float) -> None:
        handed = self._handed
        self._draining = True  # before the first look: the thread notifies from now on
        with self._drained:
            self._drained.wait_for(
                lambda: self._error is not None or self._written >= handed, timeout_s
            )

    def _run(self) -> None:
        while True:
            chunk = self._chunks.get()
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError as e:
                self._error = e
                self._notify()
                return
            self._written += len(chunk)
            if self._draining:
                self._notify()

    def _notify(self) -> None:
        """Wake a :meth:`drain` (under the lock: it cannot miss this between its look and
        its wait)."""
        with self._drained:
            self._drained.notify_all()
