"""Who may mount what: the control plane's records behind a Protocol, and the rules.

The plugin never talks to the Kubernetes API. The control plane publishes, per namespace, the
ModelArtifacts it resolved (:class:`bus.records.ArtifactRecord`) and, per node, the
NodeModelStore spec (:class:`bus.records.StoreSpec`); a :class:`Policy` is how the plugin
reads them. :func:`authorize` is pure: the rules, in order, each failure naming its rule.
"""

from __future__ import annotations

from typing import Protocol

from agent.models.errors import Denied
from bus.records import ArtifactRecord, StoreSpec

__all__ = ["MemoryPolicy", "Policy", "VolumeAsk", "authorize"]


class Policy(Protocol):
    """The control plane's view, as last synced."""

    def synced(self) -> bool:
        """True once the first full set of records arrived (before: answer Unavailable)."""
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

    def synced(self) -> bool:
        return self._synced

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
    if not record.resolved:
        raise Denied(f"the ModelArtifact is not resolved: {who}")
    if record.manifest_digest != ask.digest:
        raise Denied(
            f"the ModelArtifact resolves to another digest: {who}: {record.manifest_digest}, "
            f"the volume says {ask.digest}"
        )
    return record
