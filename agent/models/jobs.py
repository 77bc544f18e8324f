"""The records of materialization: who asks (:class:`Pod`), where the bytes are (:class:`Source`),
the attempt running for one digest (:class:`Job`), and the progress text a person reads.

These are the nouns that :mod:`.materializing` (the job table and its attempts),
:mod:`.reporting`, :mod:`.volumes` and :mod:`.pull` share. Nothing here does I/O or logs.

Invariants: a :class:`Source`'s key names its credential by a hash, never by the token (the key
is written to the ledger and shown with a backoff), and a ModelScope source's key names its hub
so it never shares a Hugging Face one's backoff; a :class:`Job`'s ``done`` never passes its
``size``, and :func:`fraction` says 100 % only once every byte arrived. :class:`JobMetrics` is a
Protocol, so the ``pull`` one-shot, which serves no metrics, never loads prometheus.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import anyio

from agent.models import backoff
from agent.models.backoff import Failure
from hub import kinds
from hub.manifest import Manifest

__all__ = [
    "Job",
    "JobMetrics",
    "Pod",
    "Reserve",
    "Source",
    "fraction",
    "human",
]


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def fraction(done: int, size: int) -> str:
    """``41 % (3.2 of 7.8 GiB)``: both sizes in the unit of ``size``, the percentage floored
    (100 % only once every byte arrived)."""
    if size <= 0:
        return "100 % (0 B)"
    scale, unit = 1, "B"
    for name in ("KiB", "MiB", "GiB", "TiB"):
        if size < scale * 1024:
            break
        scale, unit = scale * 1024, name
    if unit == "B":
        return f"{done * 100 // size} % ({done} of {size} B)"
    return f"{done * 100 // size} % ({done / scale:.1f} of {size / scale:.1f} {unit})"


@dataclass(frozen=True)
class Pod:
    """A Pod whose volume waits for a digest (from NodePublishVolume's pod info)."""

    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return self.uid or f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Source:
    """Where a volume says the digest's bytes are (from its authorized ModelArtifact)."""

    repository: str
    commit: str
    token: str | None = field(repr=False)
    allow: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    listed: Manifest | None = field(default=None, repr=False, compare=False)
    """This source's listing when the caller just made it (``mm pull`` resolved the revision
    a moment ago): the attempt uses it instead of listing again."""
    hub: kinds.Kind = kinds.HUGGING_FACE
    """Which hub the repository is on (its client is :meth:`.attempting.Attempts.client`)."""

    @property
    def key(self) -> str:
        """What a failure of this source holds back (no token in it: see :mod:`.backoff`).
        A ModelScope repository's key names the hub, so it never shares a Hugging Face one's."""
        where = (
            self.repository if self.hub == kinds.HUGGING_FACE else f"{self.hub}:{self.repository}"
        )
        return backoff.source_key(where, self.commit, self.token)


@dataclass
class Job:
    """A running attempt for one digest; what ``/model/downloads`` and the bus report."""

    hex: str
    sources: list[Source]
    started: float
    asked: float
    phase: str = "listing the files"
    size: int = 0
    done: int = 0
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    trying: Source | None = None
    """The source being listed or downloaded: a Hub failure is its failure."""
    denied: dict[str, Failure] = field(default_factory=dict)
    """Source key -> its refusal, for sources that were passed over for the next one."""
    ended: anyio.Event = field(default_factory=anyio.Event)
    """Set once the attempt's outcome is recorded and the job left :attr:`.materializing.Materializer.jobs`."""
    waiters: int = 0
    """Callers inside :meth:`.materializing.Materializer.wait` right now (a job with waiters is asked for)."""
    pods: dict[str, tuple[Pod, float]] = field(default_factory=dict)
    """Pod key -> (the Pod, when it last asked): who waits for this digest."""
    peer_bytes: int = 0
    """Bytes of this attempt received from peer model agents..."""
    hub_bytes: int = 0
    """...and from the Hub."""

    @property
    def source(self) -> Literal["Hub", "Peer"]:
        """``Peer`` when more than half of the bytes received came from peers (reference:
        NodeModelStore ``status.models[].source``)."""
        return "Peer" if self.peer_bytes * 2 > self.peer_bytes + self.hub_bytes else "Hub"

    def received(self, n: int, via: Literal["hub", "peer"]) -> None:
        """Count ``n`` more bytes from ``via`` (``done`` never passes ``size``)."""
        self.done = min(self.size, self.done + n)
        if via == "peer":
            self.peer_bytes += n
        else:
            self.hub_bytes += n

    def join(self, source: Source, now: float, pod: Pod | None = None) -> None:
        """Add ``source`` unless one with its key (repository, commit, credential) is listed.

        Sources are tried in order when one is refused, so a request with another credential
        joins rather than waits for someone else's refusal.
        """
        self.asked = now
        if pod is not None:
            self.pods[pod.key] = (pod, now)
        if all(s.key != source.key for s in self.sources):
            self.sources.append(source)

    def waiting(self, now: float, horizon_s: float) -> list[Pod]:
        """The Pods that asked within ``horizon_s`` (older ones are forgotten: a deleted Pod's
        kubelet stops asking), by namespace and name."""
        for key, (_, at) in list(self.pods.items()):
            if now - at > horizon_s:
                del self.pods[key]
        return sorted((p for p, _ in self.pods.values()), key=lambda p: (p.namespace, p.name))

    def progress(self) -> str:
        """What a person reads in ``kubectl describe pod``: still downloading, not failing."""
        head = f"model sha256:{self.hex[:12]} still downloading"
        if self.phase == "downloading":
            return f"{head}: {fraction(self.done, self.size)}"
        return f"{head}: {self.phase}"


class _Count(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _Labelled(Protocol):
    def labels(self, *, result: str = ..., source: str = ...) -> _Count: ...


class _Observe(Protocol):
    def observe(self, amount: float) -> None: ...


class JobMetrics(Protocol):
    """What the jobs count (:class:`agent.models.metrics.ModelMetrics` in the plugin; the
    ``pull`` one-shot, which serves no metrics, passes a null one and skips prometheus)."""

    @property
    def download_bytes(self) -> _Labelled: ...
    @property
    def materializations(self) -> _Labelled: ...
    @property
    def publish_duration(self) -> _Observe: ...


Reserve = Callable[[str, int], Awaitable[None]]
"""Make room for ``(hex, bytes)`` more, or raise :class:`~agent.models.errors.NoSpace` (the
collector's reserve)."""
