"""The ModelArtifact reconciler: resolve against the Hub, write status, push agent records.

Keys are ``(namespace, name)``; the same coalescing queue as the nodes serializes them. A key is
queued by the ModelArtifact watch (Kubernetes sink), by every resync (the safety net, and the
only source with the KV sink), by retries, and by ``models`` events that mention the artifact's
manifest digest (``status.nodes`` follows the nodes' caches).

One reconcile: read the object; absent -> delete its agent record. Otherwise, while nothing is
pinned yet and no retry is pending, resolve (the token read from the ``secretRef`` Secret in the
artifact's namespace, never logged, never on the bus); then write ``status`` when it differs
(:mod:`controlplane.reconciling.artifacts` decides) and the ``artifacts.<ns>.<name>`` record
when it differs. Failures are retried after :func:`~controlplane.reconciling.artifacts.backoff_s`:
exponentially while temporary, at the cap while someone has to fix something.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import msgspec
from anyio.abc import TaskGroup

from bus import kv, records
from bus.errors import BusError
from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling import applying, artifacts, revalidating
from controlplane.reconciling.artifacts import Failure, HuggingFace, ModelScope, Spec
from controlplane.reconciling.hubresolver import Resolved, Resolver
from controlplane.reconciling.nodestates import Ledger
from controlplane.reconciling.planning import Desired, Patch, plan
from controlplane.reconciling.queueing import AsyncKeyQueue
from controlplane.reconciling.sinks import Sink
from controlplane.resources import MODELARTIFACTS, SECRETS, Observed, Ref

__all__ = ["ArtifactReconciler", "Inputs"]

log = logging.getLogger(__name__)

Key = tuple[str, str]
MAX_CONFLICTS: Final = 5
MAX_KEYS: Final = 20_000
TOKEN_KEY: Final = "token"


@dataclass(frozen=True)
class Inputs:
    """What the reconciler reads from the worker's other parts, asked each time it needs them
    (given at construction: the meter and the settings are made beside it, not wired later)."""

    quotas: Callable[[str], tuple[records.BindingQuota, ...]] = lambda _ns: ()
    """A namespace's ModelStoreBinding quotas, carried in its records (the meter's latest)."""
    revalidate_s: Callable[[], float] = lambda: 86400.0
    """``model-artifact-revalidate-interval`` as the settings hold it now."""
    clock: Callable[[], float] = time.monotonic
    """What times a reconcile (the metrics' durations)."""


class ArtifactReconciler:
    """Owns the artifact queue, the retry timers and what was pushed to the agents."""

    def __init__(
        self,
        *,
        sink: Sink,
        resolvers: Mapping[str, Resolver],
        ledger: Ledger,
        metrics: WorkerMetrics,
        agents: kv.Bucket | None = None,
        retry_base_s: float = 1.0,
        retry_cap_s: float = 300.0,
        inputs: Inputs = Inputs(),
    ) -> None:
        self.inputs = inputs
        self.recheck_s = revalidating.RECHECK_S
        self._strikes: dict[Key, str] = {}
        self._outcomes: dict[Key, revalidating.Outcome] = {}
        self._recheck: set[Key] = set()
        self._sink = sink
        self.resolvers = dict(resolvers)
        """Hub kind (:mod:`hub.kinds`) -> its resolver (absent: an artifact of that hub stays
        unresolved, SourceUnavailable)."""
        self._ledger = ledger
        self._metrics = metrics
        self._agents = agents
        self._base_s, self._cap_s = retry_base_s, retry_cap_s
        self.queue: AsyncKeyQueue[Key] = AsyncKeyQueue(MAX_KEYS)
        self._attempts: dict[Key, int] = {}
        self._failures: dict[Key, Failure] = {}
        self._waiting: set[Key] = set()
        self._unreachable: dict[Key, int] = {}
        """Consecutive resolutions the Hub did not answer (``expectedDigest`` anchoring)."""
        self._digests: dict[Key, str] = {}
        self._pushed: dict[Key, bytes] = {}
        self._tg: TaskGroup | None = None

    def add(self, key: Key) -> None:
        if not self.queue.add(key):
            self._metrics.rejected.labels(kind="modelartifact", reason="queue_full").inc()

    def models_changed(self, digests: Iterable[str]) -> None:
        """A node's cache changed for these digests: re-count the artifacts pinned to them."""
        wanted = set(digests)
        for key, digest in list(self._digests.items()):
            if digest in wanted:
                self.add(key)

    def quotas_changed(self, namespace: str) -> None:
        """The namespace's ModelStoreBindings changed: push its resolved artifacts again."""
        for key in list(self._digests):
            if key[0] == namespace:
                self.add(key)

    async def work(self, concurrency: int) -> None:
        """Reconcile queued artifacts until cancelled (leader only)."""
        self._pushed.clear()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                await self.resync()
            except (errors.ApiError, BusError) as e:
                log.warning("listing ModelArtifacts failed: %s (the next resync retries)", e)
            for _ in range(concurrency):
                tg.start_soon(self._worker)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile(key)
            except (errors.ApiError, BusError) as e:
                log.warning("modelartifact %s/%s: %s; retrying in %.1fs", *key, e, self._base_s)
                if self._tg is not None:
                    self._tg.start_soon(self._later, key, self._base_s, False)
            finally:
                self.queue.done(key)

    async def reconcile(self, key: Key) -> None:
        started = self.inputs.clock()
        ref = Ref(resource=MODELARTIFACTS, name=key[1], namespace=key[0])
        observed = await self._sink.get(ref)
        if observed is None:
            await self._drop(key)
            return
        parsed = artifacts.parse_spec(observed.body)
        spec = parsed if isinstance(parsed, Spec) else None
        resolved, failure = await self._attempt(key, observed.body, spec, parsed)
        if resolved is not None:
            self._digests[key] = resolved.digest
        written = await self._write_status(ref, observed, resolved, failure)
        outcome = self._outcomes.get(key)
        if outcome is not None and outcome.passed:
            self._outcomes[key] = msgspec.structs.replace(outcome, passed=False)
        await self._push(key, artifacts.record(written, spec, self.inputs.quotas(key[0])))
        self._metrics.reconcile_seconds.labels(kind="modelartifact").observe(
            self.inputs.clock() - started
        )

    async def _attempt(
        self, key: Key, body: dict[str, Any], spec: Spec | None, parsed: Spec | Failure
    ) -> tuple[Resolved | None, Failure | None]:
        """Resolve when due; otherwise say why the artifact stays as it is."""
        pinned = (body.get("status") or {}).get("resolved") or {}
        if pinned.get("manifestDigest"):
            self._digests[key] = pinned["manifestDigest"]
        if spec is None:
            return None, parsed if isinstance(parsed, Failure) else None
        if artifacts.spec_changed(body):
            message = "spec is immutable after creation; create a new ModelArtifact instead"
            return None, Failure(reason="SpecChanged", message=message)
        if pinned:
            return None, await self._revalidate(key, body, spec, pinned)
        if key in self._waiting:
            return None, self._failures.get(key)
        try:
            resolved = await self._resolve(key[0], spec)
        except errors.ResolveFailed as e:
            failure = Failure(reason=e.reason, message=e.message, temporary=e.temporary)
            unreachable = (
                self._unreachable.get(key, 0) + 1 if e.reason == "SourceUnavailable" else 0
            )
            self._unreachable[key] = unreachable
            if not artifacts.anchors(spec, failure, unreachable):
                self._retry(key, failure)
                return None, failure
            assert spec.expected_digest is not None  # anchors() checked it
            log.warning(
                "modelartifact %s/%s: the Hub is unreachable (%s); pinned to expectedDigest %s, "
                "which nodes fetch from peers only", *key, e.message, spec.expected_digest,
            )  # fmt: skip
            resolved = Resolved.anchored(spec.expected_digest)
        self._attempts.pop(key, None)
        self._failures.pop(key, None)
        self._unreachable.pop(key, None)
        return resolved, None

    async def _hub_of(
        self, namespace: str, spec: Spec
    ) -> tuple[Resolver, HuggingFace | ModelScope, str | None]:
        """The resolver of the artifact's hub, its source, and its token (from its Secret).

        :raises errors.ResolveFailed: no resolver for that hub, or the token is unreadable.
        """
        kind, source = spec.source.hub
        resolver = self.resolvers.get(kind)
        if resolver is None:
            raise errors.ResolveFailed(
                "SourceUnavailable", f"no {kind} resolver is configured", temporary=True
            )
        secret = source.secret_ref
        token = await self._token(namespace, secret.name) if secret else None
        return resolver, source, token

    async def _resolve(self, namespace: str, spec: Spec) -> Resolved:
        resolver, source, token = await self._hub_of(namespace, spec)
        resolved = await resolver.resolve(
            source.repository,
            source.revision,
            token=token,
            allow=spec.allow_patterns,
            ignore=spec.ignore_patterns,
        )
        expected = spec.expected_digest
        if expected and resolved.digest != expected:
            raise errors.ResolveFailed(
                "DigestMismatch",
                f"expectedDigest is {expected} but {source.repository}@{resolved.commit[:12]} "
                f"lists {resolved.digest} ({resolved.file_count} files)",
            )
        return resolved

    async def _revalidate(
        self, key: Key, body: dict[str, Any], spec: Spec, pinned: dict[str, Any]
    ) -> Failure | None:
        """Check a resolved artifact against the Hub when due (:mod:`.revalidating`); the
        failure its last check left (None: it passed, or none was due)."""
        conditions = (body.get("status") or {}).get("conditions") or []
        unsettled = revalidating.revoked(conditions, pinned) or any(
            c.get("type") == "Degraded" and c.get("status") == "True" for c in conditions
        )
        due = revalidating.due(pinned, datetime.now(UTC), self.inputs.revalidate_s())
        last = self._outcomes.get(key)
        if key in self._waiting or not (due or key in self._recheck or (unsettled and not last)):
            return last.failure if last else None
        if pinned.get("digestSource") == "Expected":
            return None  # an anchor names no commit to list again: its digest is the user's own
        failure = None
        try:
            resolver, source, token = await self._hub_of(key[0], spec)
            await resolver.revalidate(
                source.repository, str(pinned.get("revision") or ""),
                str(pinned.get("manifestDigest") or ""), token=token,
                allow=spec.allow_patterns, ignore=spec.ignore_patterns,
            )  # fmt: skip
        except errors.ResolveFailed as e:
            failure = Failure(reason=e.reason, message=e.message, temporary=e.temporary)
        outcome = revalidating.judge(self._strikes.get(key), failure)
        self._outcomes[key] = outcome
        self._strikes.pop(key, None)
        if outcome.strike:
            self._strikes[key] = outcome.strike
        if failure is None:
            self._recheck.discard(key)
            return None
        self._recheck.add(key)
        delay = self._cap_s if outcome.revoked else self.recheck_s
        log.info(
            "modelartifact %s/%s: revalidation: %s; again in %.1fs", *key, failure.reason, delay
        )
        if self._tg is not None:
            self._waiting.add(key)
            self._tg.start_soon(self._later, key, delay, True)
        return outcome.failure

    async def _token(self, namespace: str, name: str) -> str:
        secret = await self._sink.get(Ref(resource=SECRETS, name=name, namespace=namespace))
        encoded = ((secret.body.get("data") or {}) if secret else {}).get(TOKEN_KEY)
        if secret is None or not encoded:
            where = f"Secret {namespace}/{name}"
            what = "not found" if secret is None else f"has no {TOKEN_KEY!r} key"
            raise errors.ResolveFailed("SecretNotFound", f"{where} {what}")
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8").strip()
        except (binascii.Error, UnicodeDecodeError) as e:
            raise errors.ResolveFailed(
                "SecretNotFound", f"Secret {namespace}/{name}: {TOKEN_KEY!r} is not base64 text"
            ) from e

    def _retry(self, key: Key, failure: Failure) -> None:
        """Queue ``key`` again after the backoff (once; later failures wait for that one)."""
        self._failures[key] = failure
        if self._tg is None or key in self._waiting:
            return
        attempt = self._attempts.get(key, 0)
        self._attempts[key] = attempt + 1
        delay = artifacts.backoff_s(attempt, failure, base_s=self._base_s, cap_s=self._cap_s)
        log.info("modelartifact %s/%s: %s; next try in %.1fs", *key, failure.reason, delay)
        self._waiting.add(key)
        self._tg.start_soon(self._later, key, delay, True)

    async def _later(self, key: Key, delay_s: float, waiting: bool) -> None:
        await anyio.sleep(delay_s)
        if waiting:
            self._waiting.discard(key)
        self.add(key)

    async def _write_status(
        self, ref: Ref, observed: Observed, resolved: Resolved | None, failure: Failure | None
    ) -> dict[str, Any]:
        """Converge ``status`` (re-reading on conflicts); the body as it now stands."""
        current: Observed | None = observed
        for _ in range(MAX_CONFLICTS):
            if current is None:
                return {}
            want = self._status(current.body, resolved, failure)
            try:
                desired = Desired(status=want, whole=frozenset({"status"}))
                for action in plan(ref, desired, current):
                    assert isinstance(action, Patch)  # the object exists and only status is owned
                    await applying.apply(self._sink, action, current)
                return {**current.body, "status": want}
            except errors.Conflict:
                current = await self._sink.get(ref)
        raise errors.Conflict(409, f"{ref}: still conflicting after {MAX_CONFLICTS} tries")

    def _status(
        self, body: dict[str, Any], resolved: Resolved | None, failure: Failure | None
    ) -> dict[str, Any]:
        pinned = (body.get("status") or {}).get("resolved") or {}
        digest = resolved.digest if resolved else pinned.get("manifestDigest")
        counts = (
            artifacts.node_counts(self._ledger.all_models(), digest)
            if digest
            else {"ready": 0, "downloading": 0, "failed": 0}
        )
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta = body.get("metadata") or {}
        outcome = self._outcomes.get((meta.get("namespace") or "", meta.get("name") or ""))
        return artifacts.status(
            body, resolved=resolved, failure=failure, counts=counts, now=now,
            revoked=outcome is not None and outcome.revoked,
            passed=outcome is not None and outcome.passed,
        )  # fmt: skip

    async def _push(self, key: Key, record: records.ArtifactRecord | None) -> None:
        if self._agents is None or record is None:
            return
        data = msgspec.json.encode(record)
        if self._pushed.get(key) != data:
            with errors.mapped_bus_errors("push the artifact record"):
                await self._agents.put(kv.artifact_key(*key), data)
            self._pushed[key] = data

    async def _drop(self, key: Key) -> None:
        """The artifact is gone: its record goes, and everything known about it."""
        if self._agents is not None:
            with errors.mapped_bus_errors("delete the artifact record"):
                await self._agents.delete(kv.artifact_key(*key))
        self._attempts.pop(key, None)
        self._failures.pop(key, None)
        self._unreachable.pop(key, None)
        self._digests.pop(key, None)
        self._pushed.pop(key, None)
        self._strikes.pop(key, None)
        self._outcomes.pop(key, None)
        self._recheck.discard(key)

    def forget_pushed(self) -> None:
        """Forget what was pushed to the agents' bucket (the bus may have lost it)."""
        self._pushed.clear()

    async def resync(self) -> None:
        """Queue every artifact, and every pushed record whose artifact may be gone."""
        keys = {
            (o.body["metadata"].get("namespace") or "", o.body["metadata"]["name"])
            for o in await self._sink.list(MODELARTIFACTS)
        }
        if self._agents is not None:
            for k in await self._agents.keys("artifacts.>"):
                _, ns, name = k.split(".", 2)
                keys.add((kv.unescape(ns), kv.unescape(name)))
        for key in sorted(keys):
            self.add(key)

    async def resync_every(self, period_s: float) -> None:
        while True:
            await anyio.sleep(period_s)
            try:
                await self.resync()
            except (errors.ApiError, BusError) as e:
                log.warning("artifact resync failed: %s", e)

    async def watch(self, api: KubeClient, *, timeout_s: int = 300, retry_s: float = 1.0) -> None:
        """Queue every ModelArtifact the API reports added, changed or deleted."""
        since: str | None = None
        while True:
            try:
                events = api.watch(MODELARTIFACTS, resource_version=since, timeout_s=timeout_s)
                async with aclosing(events):
                    async for event in events:
                        meta = event.object.get("metadata") or {}
                        since = meta.get("resourceVersion") or since
                        if event.type != "BOOKMARK" and meta.get("name"):
                            self.add((meta.get("namespace") or "", meta["name"]))
            except errors.ApiError as e:
                log.warning("watching ModelArtifacts failed: %s; watching again", e)
                since = None
                await anyio.sleep(retry_s)
