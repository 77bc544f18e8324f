"""Model download progress as ``Normal`` events on the Pods that wait for it.

A Pod whose model volume waits for a download should read, in ``kubectl describe pod``, like one
that waits for an image pull: ``Normal  DownloadingModel … 41% (3.2 GiB of 7.8 GiB)``, then
``Normal  DownloadedModel``, not a row of ``FailedMount`` warnings. The model agent holds no
Kubernetes access; its ``models`` event names, per download, the Pods waiting for it
(``waitingPods``, docs/bus.md). The worker turns that into core/v1 Events on those Pods, once
it has checked that each Pod runs on the node that named it (an agent's word about Pods is not
trusted further than its own node).

:func:`plan` is the pure decision, per node: a Pod newly waiting gets ``DownloadingModel`` at
once; after that at most one per Pod and digest every ``every_s`` (while the message changed);
a Pod that waited when the model turned ``ready`` gets ``DownloadedModel``. A failed download
posts nothing here (kubelet's own ``FailedMount`` carries its real error), nor does a Pod that
stopped waiting. A models event older than ``max_age_s`` (retained state replayed at start)
only updates what is known, posting nothing: its Pods may be long gone.

:class:`PodEventer` notes every models event in every replica (bounded: the oldest unwritten
post is dropped first) and writes in the leader only. The progress of one Pod and digest is one
Event object, patched (``count``, ``message``, ``lastTimestamp``), so ``describe`` shows one line
``(x4 over 2m)`` instead of a list; a restarted worker whose create meets the existing Event
reads it and patches it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import anyio

from bus import events
from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.reconciling.storing import progress
from controlplane.resources import EVENTS, PODS, Ref
from kit.tables import human_bytes

__all__ = [
    "COMPONENT",
    "DOWNLOADED",
    "DOWNLOADING",
    "PodEventer",
    "Post",
    "Seen",
    "event_body",
    "event_name",
    "plan",
]

log = logging.getLogger(__name__)

DOWNLOADING: Final = "DownloadingModel"
DOWNLOADED: Final = "DownloadedModel"
COMPONENT: Final = "gpustack-operator-worker"
MAX_TRIES: Final = 5


@dataclass(frozen=True)
class Post:
    """One Event to post (or to update, when its name exists) on a Pod."""

    node: str
    digest: str
    pod: events.WaitingPod
    reason: str
    message: str


@dataclass(frozen=True)
class Seen:
    """A Pod known to wait for a digest on a node, and the last progress it was told."""

    pod: events.WaitingPod
    posted_at: float
    message: str


Tracked = Mapping[str, Mapping[str, Seen]]
"""digest -> Pod key -> what it was last told (one node's)."""


def _key(pod: events.WaitingPod) -> str:
    return pod.uid or f"{pod.namespace}/{pod.name}"


def _short(m: events.ModelState) -> str:
    """``sha256:<12 hex>``, as the agent's own messages name a model (the rest is noise)."""
    digest = m.digest or m.model
    return digest[:19] if digest.startswith("sha256:") else digest


def _downloading(node: str, m: events.ModelState) -> str:
    how = progress(m.bytes_done, m.bytes_total)
    where = f"Downloading model {_short(m)} on node {node}"
    return f"{where}: {how}" if how else where


def _downloaded(node: str, m: events.ModelState) -> str:
    size = f" ({human_bytes(m.bytes_total)})" if m.bytes_total else ""
    return f"Downloaded model {_short(m)}{size} on node {node}"


def plan(
    node: str,
    models: tuple[events.ModelState, ...],
    tracked: Tracked,
    *,
    now: float,
    every_s: float,
    fresh: bool = True,
) -> tuple[list[Post], dict[str, dict[str, Seen]]]:
    """The posts one ``models`` event calls for, and what is known afterwards (pure).

    ``tracked`` is what was known of ``node`` before; ``fresh`` False (an old event) posts
    nothing but still updates what is known, so the next fresh event is measured from it.
    """
    posts: list[Post] = []
    known: dict[str, dict[str, Seen]] = {}
    for m in models:
        digest = m.digest or m.model
        before = tracked.get(digest, {})
        if m.state == "ready":
            posts += [Post(node, digest, s.pod, DOWNLOADED, _downloaded(node, m))
                      for s in before.values()]  # fmt: skip
            continue
        if m.state != "downloading" or not m.waiting_pods:
            continue
        message = _downloading(node, m)
        now_known: dict[str, Seen] = {}
        for pod in m.waiting_pods:
            seen = before.get(_key(pod))
            if seen is None or (now - seen.posted_at >= every_s and seen.message != message):
                posts.append(Post(node, digest, pod, DOWNLOADING, message))
                seen = Seen(pod, now, message)
            now_known[_key(pod)] = seen
        known[digest] = now_known
    return (posts if fresh else []), known


def event_name(post: Post) -> str:
    """Stable per Pod, digest and reason: the progress of one download is one Event."""
    tag = hashlib.sha256(f"{_key(post.pod)}|{post.digest}|{post.reason}".encode()).hexdigest()
    return f"{post.pod.name[:200]}.{tag[:16]}"


def _stamp(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(post: Post, *, now: float, count: int = 1) -> dict[str, Any]:
    """A core/v1 Event about ``post.pod``, as ``kubectl describe pod`` lists them."""
    involved: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "namespace": post.pod.namespace, "name": post.pod.name,
    }  # fmt: skip
    if post.pod.uid:
        involved["uid"] = post.pod.uid
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(post), "namespace": post.pod.namespace},
        "involvedObject": involved, "type": "Normal",
        "reason": post.reason, "message": post.message,
        "source": {"component": COMPONENT, "host": post.node},
        "reportingComponent": COMPONENT, "reportingInstance": post.node,
        "firstTimestamp": _stamp(now), "lastTimestamp": _stamp(now), "count": count,
    }  # fmt: skip


class PodEventer:
    """Plans on every models event (:meth:`note`, every replica) and posts (:meth:`run`, leader).

    Bounded: at most ``max_pending`` unwritten posts (the oldest dropped first; a later post of
    the same Pod, digest and reason replaces an unwritten one) and ``max_nodes`` nodes tracked.
    """

    def __init__(
        self,
        *,
        every_s: float = 20.0,
        max_age_s: float = 120.0,
        max_pending: int = 4096,
        max_nodes: int = 20_000,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.every_s = every_s
        self.max_age_s = max_age_s
        self._max_pending = max_pending
        self._max_nodes = max_nodes
        self._retry_s = retry_s
        self._clock = clock
        self._tracked: dict[str, dict[str, dict[str, Seen]]] = {}
        self._pending: OrderedDict[str, Post] = OrderedDict()
        self._counts: dict[str, int] = {}
        """Event name -> the count it was last written with (this process's)."""
        self._refused: dict[tuple[str, str, str, str | None], None] = {}
        """(node, namespace, name, uid) a node named but does not run (bounded as _counts):
        asked once, so a lying agent's every report costs no Pod read and no log line."""
        self._wake = anyio.Event()
        self.posted = 0
        """Events created or updated so far (tests, metrics)."""

    def note(self, event: events.Event) -> None:
        """Plan the posts ``event`` calls for (never blocks, never raises)."""
        if not isinstance(event, events.ModelsEvent):
            return
        now = self._clock()
        fresh = now - event.ts.timestamp() <= self.max_age_s
        before = self._tracked.get(event.node, {})
        posts, known = plan(
            event.node, event.models, before, now=now, every_s=self.every_s, fresh=fresh
        )
        self._tracked.pop(event.node, None)
        if known and len(self._tracked) < self._max_nodes:
            self._tracked[event.node] = known
        for post in posts:
            name = f"{post.pod.namespace}/{event_name(post)}"
            self._pending.pop(name, None)
            self._pending[name] = post
        while len(self._pending) > self._max_pending:
            self._pending.popitem(last=False)
        if posts:
            self._wake.set()

    async def run(self, api: KubeClient) -> None:
        """Post what was noted until cancelled; a failed post is retried, then given up."""
        tries: dict[str, int] = {}
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._pending:
                name, post = self._pending.popitem(last=False)
                try:
                    await self.write(api, post)
                except errors.ApiError as e:
                    tries[name] = tries.get(name, 0) + 1
                    where = f"{post.pod.namespace}/{post.pod.name}"
                    if tries[name] >= MAX_TRIES:
                        log.warning("event on pod %s: %s; given up", where, e)
                    else:
                        log.warning("event on pod %s: %s; again", where, e)
                        self._pending.setdefault(name, post)
                        await anyio.sleep(self._retry_s)
                        continue
                tries.pop(name, None)

    async def write(self, api: KubeClient, post: Post) -> None:
        """Create the Event, or bump the existing one's count and message.

        :raises errors.ApiError: the API failed.
        """
        now = self._clock()
        ref = Ref(resource=EVENTS, name=event_name(post), namespace=post.pod.namespace)
        count = self._counts.get(str(ref), 0)
        if count == 0:
            claim = (post.node, post.pod.namespace, post.pod.name, post.pod.uid)
            if claim in self._refused:
                return
            if not await _runs_on(api, post):
                self._refused[claim] = None
                while len(self._refused) > self._max_pending:
                    self._refused.pop(next(iter(self._refused)))
                return
            try:
                await api.create(ref, event_body(post, now=now))
                self._remember(str(ref), 1)
                return
            except errors.Conflict:  # written before this process: continue its count
                current = await api.get(ref)
                count = int(current.get("count") or 1)
        patch = {"message": post.message, "lastTimestamp": _stamp(now), "count": count + 1}
        try:
            await api.patch(ref, patch)
        except errors.NotFound:  # expired (the API keeps events an hour): start it again
            await api.create(ref, event_body(post, now=now))
            count = 0
        self._remember(str(ref), count + 1)

    def _remember(self, name: str, count: int) -> None:
        self._counts.pop(name, None)
        self._counts[name] = count
        while len(self._counts) > self._max_pending:
            self._counts.pop(next(iter(self._counts)))
        self.posted += 1


async def _runs_on(api: KubeClient, post: Post) -> bool:
    """Whether the Pod ``post`` names exists and runs on the node that reported it waiting.

    A node's agent may publish only its own node's events (the bus enforces it), but the Pods
    it names are its word: checked here before the first Event on a Pod, so an agent cannot
    write Events about Pods of other nodes (or none). A refusal is logged once and remembered
    by the caller, never asked again.
    """
    where = f"{post.pod.namespace}/{post.pod.name}"
    try:
        pod = await api.get(Ref(resource=PODS, name=post.pod.name, namespace=post.pod.namespace))
    except errors.NotFound:
        log.info("no event on pod %s: it does not exist (any more)", where)
        return False
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if spec.get("nodeName") != post.node or (post.pod.uid and meta.get("uid") != post.pod.uid):
        log.warning(
            "no event on pod %s: node %s reported it waiting, but it is not that node's Pod "
            "(runs on %s)", where, post.node, spec.get("nodeName") or "no node",
        )  # fmt: skip
        return False
    return True
