"""ModelStoreBinding quotas at mount time: grpcio's client against the plugin's CSI server.

The control plane puts the namespace's bindings (their stores, quota and last counted usage)
and the model's size into the artifact record; the plugin refuses a NodePublishVolume that
would start a download past a binding's quota with RESOURCE_EXHAUSTED naming the binding.
"""

from __future__ import annotations

import grpc
import msgspec
import pytest
from models_harness import (
    FILES,
    Rig,
    code_of,
    publish_request,
    publish_until_done,
    settled,
    unpublish,
)

from agent.models.policy import MemoryPolicy
from bus.records import ArtifactRecord, BindingQuota, StoreSpec

pytestmark = pytest.mark.anyio

SIZE = sum(len(v) for v in FILES.values())


def _metered(
    rig: Rig, record: ArtifactRecord, *, quota: int, used: int, store: str
) -> ArtifactRecord:
    """``record`` with one binding over store ``s1`` and the node's spec naming ``store``."""
    metered = msgspec.structs.replace(
        record,
        size_bytes=SIZE,
        quotas=(BindingQuota(name="team-quota", stores=("s1",), quota_bytes=quota,
                             used_bytes=used),),
    )  # fmt: skip
    rig.policy.replace(MemoryPolicy([metered], StoreSpec(store=store)))
    return metered


async def test_a_download_past_the_quota_is_resource_exhausted_naming_the_binding(
    rig: Rig,
) -> None:
    record = _metered(rig, rig.artifact("org/model", FILES), quota=SIZE + 10, used=11, store="s1")
    async with rig.running() as plugin:
        code, message = await code_of(plugin.socket, publish_request(record, rig.target()))
        await settled(plugin)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert message.startswith("ModelStoreBinding team-a/team-quota: quota")
    assert f"needs {SIZE} more" in message
    assert rig.hub.seen == []  # refused before the download: not one request to the Hub


@pytest.mark.usefixtures("mounts")
async def test_within_the_quota_or_on_another_store_the_model_downloads(rig: Rig) -> None:
    fits = _metered(rig, rig.artifact("org/model", FILES), quota=SIZE + 10, used=10, store="s1")
    async with rig.running() as plugin:
        await publish_until_done(plugin.socket, publish_request(fits, rig.target()))
        await settled(plugin)
        await unpublish(plugin.socket, "csi-abc", rig.target())
    other = _metered(
        rig, rig.artifact("org/other", {"a.txt": b"x" * 100}, name="o"), quota=1, used=5,
        store="s2",
    )  # fmt: skip
    async with rig.running() as plugin:
        await publish_until_done(plugin.socket, publish_request(other, rig.target("pod-2")))
        await unpublish(plugin.socket, "csi-abc", rig.target("pod-2"))


@pytest.mark.usefixtures("mounts")
async def test_a_model_already_on_the_node_mounts_even_over_quota(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)
    async with rig.running() as plugin:
        await publish_until_done(plugin.socket, publish_request(record, rig.target()))
        await settled(plugin)
        over = _metered(rig, record, quota=1, used=SIZE, store="s1")
        request = publish_request(over, rig.target("pod-2"), volume_id="csi-def")
        code, message = await code_of(plugin.socket, request)
        await unpublish(plugin.socket, "csi-abc", rig.target())
        await unpublish(plugin.socket, "csi-def", rig.target("pod-2"))
    assert (code, message) == (grpc.StatusCode.OK, "")
