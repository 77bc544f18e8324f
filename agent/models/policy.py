"""Who may mount what: the control plane's records behind a Protocol, and the rules.

The plugin never talks to the Kubernetes API. The control plane publishes, per namespace, the
ModelArtifacts it resolved (:class:`bus.records.ArtifactRecord`) and, per node, the
NodeModelStore spec (:class:`bus.records.StoreSpec`); a :class:`Policy` is how the plugin
reads them. :func:`authorize` is pure: the rules, in order, each failure naming its rule.
"""

from __future__ import annotations

from typing import Protocol

from agent.models.errors import Denied, QuotaExceeded
from bus.records import ArtifactRecord, StoreSpec

__all__ = ["MemoryPolicy", "Policy", "VolumeAsk", "authorize", "check_quota"]


class Policy(Protocol):
    """The control plane's view, as last synced."""

    def synced(self) -> bool:
        """True once the first full set of records arrived (before: answer Unavailable)."""
        ...

    def provisional(self) -> bool:
        """True while the view is the last one kept on the node, not yet confirmed by the bus:
        it authorizes mounts of trees already cached, never a download."""
        ...

    def artifact(self, namespace: str, name: str) -> ArtifactRecord | None: ...

    def spec(self) -> StoreSpec | None:
        """This node's NodeModelStore spec; None until the worker wrote one."""
        ...


class MemoryPolicy:
    """A :class:`Policy` held in memory: tests, and the cache a bus-backed policy fills."""

    def __init__(
        self, artifacts: list[ArtifactRecord] | None = None, spec: StoreSpec | None = None
    ) -> None:
        self._artifacts = {(a.namespace, a.name): a for a in artifacts or []}
        self._spec = spec
        self._synced = artifacts is not None
        self._provisional = False

    def synced(self) -> bool:
        return self._synced

    def provisional(self) -> bool:
        return self._provisional and not self._synced

    def view(self) -> tuple[tuple[ArtifactRecord, ...], StoreSpec | None]:
        """Every record, in a stable order: what is kept on disk and compared for changes."""
        return tuple(self._artifacts[k] for k in sorted(self._artifacts)), self._spec

    def artifact(self, namespace: str, name: str) -> ArtifactRecord | None:
        return self._artifacts.get((namespace, name))

    def spec(self) -> StoreSpec | None:
        return self._spec

    def put(self, record: ArtifactRecord) -> None:
        self._artifacts[(record.namespace, record.name)] = record
        self._synced = True

    def delete(self, namespace: str, name: str) -> None:
        self._artifacts.pop((namespace, name), None)

    def replace(self, other: MemoryPolicy) -> None:
        """Take ``other``'s whole view at once (a fresh full read of the bus)."""
        self._artifacts = dict(other._artifacts)
        self._spec = other._spec
        self._synced = True
        self._provisional = False

    def assume(self, artifacts: list[ArtifactRecord], spec: StoreSpec | None) -> bool:
        """Take the view kept on the node before a restart, provisionally; the bus's first
        read replaces it. False (nothing taken) once the bus has synced: it is newer."""
        if self._synced:
            return False
        self._artifacts = {(a.namespace, a.name): a for a in artifacts}
        self._spec = spec
        self._provisional = True
        return True


class VolumeAsk:
    """The volume attributes that matter for authorization (already validated for shape)."""

    __slots__ = ("artifact", "artifact_uid", "digest", "namespace")

    def __init__(self, namespace: str, artifact: str, artifact_uid: str, digest: str) -> None:
        self.namespace = namespace
        self.artifact = artifact
        self.artifact_uid = artifact_uid
        self.digest = digest


def authorize(ask: VolumeAsk, record: ArtifactRecord | None) -> ArtifactRecord:
    """Return the record that authorizes ``ask``. :raises Denied: naming the failed rule."""
    who = f"ModelArtifact {ask.namespace}/{ask.artifact}"
    if record is None:
        raise Denied(f"the Pod's namespace has no such ModelArtifact: {who}: does not exist")
    if record.uid != ask.artifact_uid:
        raise Denied(
            f"the ModelArtifact is not the one the volume names: {who}: uid {record.uid}, "
            f"the volume says {ask.artifact_uid}"
        )
    if record.hub is None:
        raise Denied(f"the ModelArtifact is not on a model hub: {who}")
    if not record.resolved:
        raise Denied(f"the ModelArtifact is not resolved: {who}")
    if record.manifest_digest != ask.digest:
        raise Denied(
            f"the ModelArtifact resolves to another digest: {who}: {record.manifest_digest}, "
            f"the volume says {ask.digest}"
        )
    return record


def check_quota(record: ArtifactRecord, store: str | None) -> None:
    """Refuse a *new* download of ``record`` onto a node of ``store`` that would take one of
    the namespace's ModelStoreBindings past its quota.

    Only bindings whose ``stores`` hold this node's store apply (a node no store won, or no
    binding covers, is not metered). The cost is the artifact's whole size, since the download
    adds this digest on one more node; the used bytes are the control plane's last count, so a
    download already running here was counted and is never checked again (the caller joins it).

    :raises QuotaExceeded: naming the binding, its quota and the figures.
    """
    size = record.size_bytes
    if store is None or not size:
        return
    for quota in record.quotas:
        if store not in quota.stores or quota.quota_bytes is None:
            continue
        if quota.used_bytes + size > quota.quota_bytes:
            raise QuotaExceeded(
                f"ModelStoreBinding {record.namespace}/{quota.name}: quota {quota.quota_bytes} "
                f"bytes exceeded: {quota.used_bytes} used, downloading ModelArtifact "
                f"{record.namespace}/{record.name} onto store {store} needs {size} more"
            )
