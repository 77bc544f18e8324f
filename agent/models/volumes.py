"""NodePublishVolume / NodeUnpublishVolume, independent of gRPC.

:func:`validate` is pure (shape of the request), :func:`~agent.models.policy.authorize` is pure
(the rules); :class:`Volumes` does the I/O in the order the CSI spec needs: one lock per target
(different targets run in parallel), authorize, idempotency checks, claim the tree (under the
claim lock the collector also takes, so a claimed tree is never collected), bind-mount.

A model that must be downloaded first is waited for *outside* the target's lock, within
:func:`wait_window` (the caller's deadline less a margin, capped by ``publish_wait_s``): a
download that ends in time mounts in the same call, so kubelet records no event at all; one
that does not is answered ABORTED with a message that says it is still downloading (kubelet
retries). A failed download answers its own error at once. The download is shared by every
publish of the digest and is never cancelled by a caller leaving.

Before the bus's first sync, a policy kept on the node from the last run
(:mod:`agent.models.policyfile`) authorizes mounts of trees already cached, and nothing else:
a download waits for the bus. Unpublish never waits for anything.

References live in ``ledger/refs`` and are rebuilt from ``/proc/self/mountinfo`` on start: a
mount of ``published/<hex>/tree`` under kubelet's pods directory is a reference, whatever the
ledger says, and a ledger entry whose target is not mounted is dropped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
import msgspec

from agent.models import layout, mounting, targets
from agent.models.errors import (
    AlreadyPublished,
    InvalidVolume,
    Materializing,
    MountFailed,
    NotReady,
)
from agent.models.jobs import Pod, Source
from agent.models.materializing import Materializer
from agent.models.metrics import ModelMetrics
from agent.models.policy import Policy, VolumeAsk, authorize, check_quota
from agent.models.tuning import Tuning
from bus.records import ArtifactRecord
from hub import kinds
from hub.manifest import is_digest

__all__ = ["PublishRequest", "Volumes", "kubelet_volume_id", "validate", "wait_window"]

log = logging.getLogger(__name__)

EPHEMERAL = "csi.storage.k8s.io/ephemeral"
NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_NAME = "csi.storage.k8s.io/pod.name"
POD_UID = "csi.storage.k8s.io/pod.uid"
_TREE = re.compile(r"/published/([0-9a-f]{64})/tree$")
_TARGET = re.compile(r"^([^/]+)/volumes/kubernetes\.io~csi/([^/]+)/mount$")


@dataclass(frozen=True)
class PublishRequest:
    volume_id: str
    target_path: str
    context: Mapping[str, str]
    secrets: Mapping[str, str]
    mount_capability: bool
    """A mount (not block) access type was requested."""


def validate(req: PublishRequest, pods_dir: Path) -> tuple[Path, VolumeAsk]:
    """Check the request's shape. :raises InvalidVolume: naming the first problem."""
    if not layout.VOLUME_ID.fullmatch(req.volume_id):
        raise InvalidVolume(f"volume_id {req.volume_id[:140]!r} is missing or malformed")
    target = targets.checked(req.target_path, pods_dir)
    if not req.mount_capability:
        raise InvalidVolume("volume_capability must be a mount (not block) capability")
    if req.context.get(EPHEMERAL) != "true":
        raise InvalidVolume(
            "only inline ephemeral volumes are served (csi.storage.k8s.io/ephemeral)"
        )
    missing = [
        k
        for k in ("artifact", "artifactUID", "manifestDigest", NAMESPACE)
        if not req.context.get(k)
    ]
    if missing:
        raise InvalidVolume(f"volume attributes missing: {', '.join(missing)}")
    digest = req.context["manifestDigest"]
    if not is_digest(digest):
        raise InvalidVolume(f"manifestDigest {digest[:80]!r} is not sha256:<64 lowercase hex>")
    ask = VolumeAsk(
        req.context[NAMESPACE], req.context["artifact"], req.context["artifactUID"], digest
    )
    return target, ask


def kubelet_volume_id(target: Path, pods_dir: Path) -> str | None:
    """Kubelet's inline volume id for ``target``: ``csi-`` + sha256(podUID + volumeName)."""
    m = _TARGET.match(str(target.relative_to(pods_dir)))
    if m is None:
        return None
    return "csi-" + hashlib.sha256((m.group(1) + m.group(2)).encode()).hexdigest()


class Volumes:
    def __init__(
        self,
        cache: layout.Cache,
        policy: Policy,
        materializer: Materializer,
        *,
        pods_dir: Path,
        metrics: ModelMetrics,
        claim: anyio.Lock,
        default_token: str | None = None,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.default_token = default_token
        self.cache = cache
        self.policy = policy
        self.materializer = materializer
        self.pods_dir = pods_dir
        self.metrics = metrics
        self.claim = claim
        self.refs: dict[str, layout.Ref] = {}
        self.ready = False
        self._locks: dict[str, anyio.Lock] = {}
        self._waited: set[str] = set()
        self.changed = changed
        """Called when the references change (the reporter publishes at once)."""

    def referenced(self) -> set[str]:
        return {r.hex for r in self.refs.values()}

    def reference_counts(self) -> dict[str, int]:
        """hex -> how many published volumes (mounts) use it."""
        return dict(Counter(r.hex for r in self.refs.values()))

    # ------------------------------------------------------------------ restart

    async def rebuild(self) -> None:
        """Rebuild references from mountinfo and the ledger; then the plugin is ready."""
        self.refs = await anyio.to_thread.run_sync(self._rebuild)
        self.ready = True

    def _rebuild(self) -> dict[str, layout.Ref]:
        st = os.stat(self.cache.root)
        device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        ledger = {r.target_path: r for r in self.cache.load_refs().values()}
        refs: dict[str, layout.Ref] = {}
        for m in mounting.read_mountinfo():
            found = _TREE.search(m.root)
            target = targets.under(Path(m.mount_point), self.pods_dir)
            if found is None or m.device != device or target is None:
                continue
            ref = ledger.pop(str(target), None)
            if ref is None or ref.hex != found.group(1):
                volume_id = kubelet_volume_id(target, self.pods_dir)
                if volume_id is None:
                    continue
                ref = layout.Ref(volume_id=volume_id, target_path=str(target), hex=found.group(1))
                log.info("adopting mount %s of sha256:%s", target, ref.hex[:12])
                self.cache.save_ref(ref)
            refs[ref.volume_id] = ref
        for stale in ledger.values():
            self.cache.drop_ref(stale.volume_id)
        return refs

    # ------------------------------------------------------------------ publish

    async def publish(self, req: PublishRequest, *, remaining_s: float | None = None) -> None:
        """Publish, holding the call while the model downloads, up to :func:`wait_window`.

        ``remaining_s``: what is left of the caller's gRPC deadline (None: it set none). The
        target's lock is not held while waiting, so each turn re-authorizes and re-checks the
        target; the download is shared by every caller of the digest and outlives them all.

        :raises Materializing: the window ran out (the message has the progress).
        """
        target, ask = validate(req, self.pods_dir)
        await anyio.to_thread.run_sync(self._reachable, target)
        if not self.ready or not (self.policy.synced() or self.policy.provisional()):
            raise NotReady("the plugin is starting: references or artifacts not synced yet")
        hex_ = ask.digest.removeprefix("sha256:")
        until = anyio.current_time() + wait_window(remaining_s, self.materializer.tuning)
        while True:
            try:
                return await self._locked(req, target, ask)
            except Materializing as e:
                if await self.materializer.wait(hex_, until=until):
                    continue  # it ended: published (mount) or failed (its error), ask again
                progress = self.materializer.progress(hex_)
                if progress is None:
                    continue  # it ended as the window closed
                raise Materializing(progress) from e

    async def _locked(self, req: PublishRequest, target: Path, ask: VolumeAsk) -> None:
        lock = self._locks.setdefault(str(target), anyio.Lock())
        async with lock:
            try:
                await self._publish(req, target, ask)
            finally:
                if not lock.statistics().tasks_waiting:
                    self._locks.pop(str(target), None)

    async def _publish(self, req: PublishRequest, target: Path, ask: VolumeAsk) -> None:
        try:
            record = authorize(ask, self.policy.artifact(ask.namespace, ask.artifact))
        except Exception:
            self.metrics.mounts.labels(result="denied").inc()
            raise
        hex_ = ask.digest.removeprefix("sha256:")
        ref = layout.Ref(
            volume_id=req.volume_id,
            target_path=str(target),
            hex=hex_,
            artifact=ask.artifact,
            artifact_uid=ask.artifact_uid,
            pod_namespace=ask.namespace,
            pod_name=req.context.get(POD_NAME),
            pod_uid=req.context.get(POD_UID),
        )
        if await self._already(ref, target):
            return
        async with self.claim:
            published = await anyio.to_thread.run_sync(self.cache.is_published, hex_)
            if published:
                await anyio.to_thread.run_sync(self.cache.save_ref, ref)
                self.refs[ref.volume_id] = ref
        if not published:
            self._materialize(req, record, hex_)
            return
        try:
            await anyio.to_thread.run_sync(self._mount, hex_, target)
        except BaseException:
            self.refs.pop(ref.volume_id, None)
            await anyio.to_thread.run_sync(self.cache.drop_ref, ref.volume_id)
            raise
        self.metrics.mounts.labels(result="materialized" if hex_ in self._waited else "hit").inc()
        self._waited.discard(hex_)
        await self._touch(hex_)
        self.changed()

    def _materialize(self, req: PublishRequest, record: ArtifactRecord, hex_: str) -> None:
        """Start (or join) the download of ``hex_``; raises :class:`Materializing` meanwhile.

        :raises NotReady: the policy is only the view kept on the node: what it authorized
            then may have been revoked since, and only the bus may start a download.
        """
        if not self.policy.synced():
            raise NotReady(
                f"sha256:{hex_[:12]} is not cached and the artifacts are not synced from the "
                "bus yet (serving only cached models from the view kept on the node)"
            )
        if self.materializer.progress(hex_) is None:  # a running download was counted already
            spec = self.policy.spec()
            try:
                check_quota(record, spec.store if spec is not None else None)
            except Exception:
                self.metrics.mounts.labels(result="denied").inc()
                raise
        self.metrics.mounts.labels(result="pending").inc()
        self._waited.add(hex_)
        kind, repository = record.hub or ("huggingface", "")
        hub = kinds.MODELSCOPE if kind == kinds.MODELSCOPE else kinds.HUGGING_FACE
        # The node's own token is a Hugging Face one: never sent to ModelScope.
        token = req.secrets.get("token") or (
            self.default_token if hub == kinds.HUGGING_FACE else None
        )
        self.materializer.ensure(
            hex_,
            Source(
                repository,
                record.revision or "",
                token,
                record.allow_patterns,
                record.ignore_patterns,
                hub=hub,
            ),
            pod=_pod(req.context),
        )

    async def _already(self, ref: layout.Ref, target: Path) -> bool:
        """Idempotency: True when ``target`` already holds exactly this volume."""
        real = targets.real(target, self.pods_dir)
        mounted = await anyio.to_thread.run_sync(mounting.is_mount_point, real)
        known = next((r for r in self.refs.values() if r.target_path == ref.target_path), None)
        if known is not None and known != ref and _attributes(known) != _attributes(ref):
            raise AlreadyPublished(
                f"{ref.target_path} is already published as volume {known.volume_id} of "
                f"sha256:{known.hex[:12]}"
            )
        if mounted is None:
            return False
        if not mounted.read_only:
            await anyio.to_thread.run_sync(self._detach, target)
            raise NotReady(f"{target} was mounted writable; unmounted it, retry")
        if known is None:
            await anyio.to_thread.run_sync(self.cache.save_ref, ref)
            self.refs[ref.volume_id] = ref
        return True

    def _reachable(self, target: Path) -> None:
        """Refuse, before any download starts, a target reached through a symlink or a file
        (INVALID_ARGUMENT); a parent kubelet has not created is left to the mount to report."""
        try:
            with targets.parent(target, self.pods_dir):
                pass
        except FileNotFoundError:
            pass

    def _mount(self, hex_: str, target: Path) -> None:
        """Create ``target`` and bind the tree on it, through real directories only
        (:mod:`agent.models.targets`): a symlink on the way is INVALID_ARGUMENT."""
        try:
            with targets.parent(target, self.pods_dir) as parent:
                _make_directory(parent, target)
                mounting.bind_read_only_at(self.cache.tree(hex_), parent, target.name, target)
        except FileNotFoundError as e:
            raise MountFailed(f"cannot create {target}: {e.strerror}") from e

    async def _touch(self, hex_: str) -> None:
        """Note a use of ``hex_`` for collection; bookkeeping only, so a failure is logged.

        It runs after the mount or unmount happened: raising would tell kubelet a mount that
        exists failed (and it would never unpublish it).
        """
        try:
            await anyio.to_thread.run_sync(
                self.cache.update_digest,
                hex_,
                lambda r: msgspec.structs.replace(r, last_used=time.time()),
            )
        except OSError as e:
            log.warning("sha256:%s: cannot record its last use: %s", hex_[:12], e)

    # ------------------------------------------------------------------ unpublish

    async def unpublish(self, volume_id: str, target_path: str) -> None:
        """Unmount and remove ``target_path``; success also when it was never published."""
        if not volume_id:
            raise InvalidVolume("volume_id is required")
        target = targets.checked(target_path, self.pods_dir)
        if not self.ready:
            raise NotReady("the plugin is starting: references not rebuilt yet")
        async with self._locks.setdefault(str(target), anyio.Lock()):
            await anyio.to_thread.run_sync(self._unmount, target)
            ref = self.refs.pop(volume_id, None)
            for other in [r for r in self.refs.values() if r.target_path == str(target)]:
                self.refs.pop(other.volume_id, None)
                await anyio.to_thread.run_sync(self.cache.drop_ref, other.volume_id)
            await anyio.to_thread.run_sync(self.cache.drop_ref, volume_id)
            if ref is not None:
                await self._touch(ref.hex)
                self.changed()

    def _unmount(self, target: Path) -> None:
        """Unmount everything on ``target`` and remove it, through real directories only: what
        publish made is found the way publish made it; a missing parent means nothing is there."""
        try:
            with targets.parent(target, self.pods_dir) as parent:
                mounting.unmount_at(parent, target.name, target)
                try:
                    os.rmdir(target.name, dir_fd=parent)
                except FileNotFoundError:
                    pass
                except NotADirectoryError as e:  # publish never makes one: not ours to touch
                    raise InvalidVolume(
                        f"target_path {str(target)[:200]!r} is not a directory"
                    ) from e
                except OSError as e:
                    raise MountFailed(f"cannot remove {target}: {e.strerror}") from e
        except FileNotFoundError:
            pass

    def _detach(self, target: Path) -> None:
        """Unmount everything on ``target``, reached through real directories only."""
        with targets.parent(target, self.pods_dir) as parent:
            mounting.unmount_at(parent, target.name, target)


def _make_directory(parent: int, target: Path) -> None:
    """``target`` (named in ``parent``) as a directory: created, or one that is there already
    (an idempotent publish). :raises InvalidVolume: it is a symlink or a file."""
    try:
        os.mkdir(target.name, 0o750, dir_fd=parent)
        return
    except FileExistsError:
        pass
    except OSError as e:
        raise MountFailed(f"cannot create {target}: {e.strerror}") from e
    if not stat.S_ISDIR(os.stat(target.name, dir_fd=parent, follow_symlinks=False).st_mode):
        raise InvalidVolume(f"target_path {str(target)[:200]!r} is a symlink or not a directory")


def wait_window(remaining_s: float | None, tuning: Tuning) -> float:
    """How long NodePublishVolume may wait for a download: ``publish_wait_s``, and no later
    than ``publish_margin_s`` before the caller's deadline (``remaining_s``, None: none)."""
    if remaining_s is None:
        return max(0.0, tuning.publish_wait_s)
    return max(0.0, min(tuning.publish_wait_s, remaining_s - tuning.publish_margin_s))


def _pod(context: Mapping[str, str]) -> Pod | None:
    """The Pod kubelet named in the volume context (``podInfoOnMount``); None without a name."""
    name, namespace = context.get(POD_NAME), context.get(NAMESPACE)
    if not name or not namespace:
        return None
    return Pod(namespace=namespace, name=name, uid=context.get(POD_UID) or "")


def _attributes(ref: layout.Ref) -> tuple[object, ...]:
    return (ref.volume_id, ref.hex, ref.artifact, ref.artifact_uid)
