"""NodeModelStore.spec = settings + the winning ModelStore + the user's own edits (never reverted).

Pure rules first (:mod:`controlplane.stores.storespec`), then the worker against the stateful fake API
and a real nats-server: a settings change reaches an untouched field, a ``kubectl edit`` survives
every later reconcile, and overlapping ModelStores say so in their status.
"""

from __future__ import annotations

import base64
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node
from test_controlplane_nms_e2e import NMS, T0, models_event, publish, settings, until

from bus.testing import nats_server, settings_for
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.reconciling.planning import Desired
from controlplane.resources import Observed
from controlplane.stores import storespec
from controlplane.worker import running

MS = "apis/worker.gpustack.ai/v1alpha1/modelstores"
SECRETS = "api/v1/secrets"


def store(name: str, selector: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeSelector": selector, **spec}}


def test_the_first_matching_store_in_name_order_overrides_field_by_field() -> None:
    base = storespec.from_settings(settingscatalog.validate_all({}))
    stores = [
        store("b-fast", {"matchLabels": {"pool": "a"}}, download={"concurrency": 32}),
        store("a-small", {"matchExpressions": [{"key": "pool", "operator": "In",
                                                "values": ["a", "b"]}]},
              watermarks={"highPercent": 60}, download={"bytesPerSecond": 0}),
    ]  # fmt: skip
    spec = storespec.with_store(base, storespec.winner(stores, {"pool": "a"}))
    assert spec["store"] == "a-small"
    assert spec["watermarks"] == {"highPercent": 60, "lowPercent": 70}
    assert spec["download"] == {"concurrency": 8, "bytesPerSecond": 0, "peerSync": True}
    assert storespec.winner(stores, {"pool": "c"}) is None
    statuses = storespec.store_statuses(stores, {"n1": {"pool": "a"}, "n2": {"pool": "b"}})
    assert statuses["a-small"]["nodes"] == 2
    overlap = {c["type"]: c for c in statuses["b-fast"]["conditions"]}["SelectorOverlap"]
    assert overlap["status"] == "True" and "a-small" in overlap["message"]
    assert {c["type"]: c for c in statuses["a-small"]["conditions"]}["SelectorOverlap"][
        "status"
    ] == "False"


def test_an_edited_field_is_kept_and_the_rest_follows_the_settings() -> None:
    applied = {"watermarks": {"highPercent": 80, "lowPercent": 70}}
    observed = {"watermarks": {"highPercent": 90, "lowPercent": 70}, "extra": "mine"}
    desired = {"watermarks": {"highPercent": 85, "lowPercent": 60}}
    merged = storespec.keep_user_edits(desired, observed, applied)
    assert merged == {"watermarks": {"highPercent": 90, "lowPercent": 60}, "extra": "mine"}
    # respec records what it applied and keeps other annotations
    obs = Observed(
        body={"metadata": {"annotations": {"a": "b", storespec.APPLIED: msgspec.json.encode(
            applied).decode()}}, "spec": observed},
        resource_version="1",
    )  # fmt: skip
    out = storespec.respec(Desired(spec=desired), obs)
    assert out.spec == merged
    assert out.metadata["annotations"]["a"] == "b"
    assert msgspec.json.decode(out.metadata["annotations"][storespec.APPLIED]) == desired


def _spec(fake: FakeApi) -> dict[str, Any]:
    return dict(fake.get(NMS, "n1").get("spec") or {})


def _set(fake: FakeApi, name: str, text: str) -> None:
    secret = fake.objects[(SECRETS, "ns", settingscatalog.SECRET_NAME)]
    secret["data"] = {**secret["data"], name: base64.b64encode(text.encode()).decode()}


@pytest.mark.anyio
async def test_settings_and_user_edits_make_the_spec(tmp_path: Path) -> None:
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        bus = settings_for(server)
        fake.put_object("api/v1/nodes", node("n1"))
        conf = msgspec.structs.replace(
            settings(bus, url), namespace="ns", settings_period_s=0.05,
            settings_seed=settingscatalog.seed({"GPUSTACK_MODEL_STORE_DOWNLOAD_CONCURRENCY": "4"}),
        )  # fmt: skip
        worker = await tg.start(running.run, conf)
        await publish(bus, models_event(T0, done=1, used=1))
        await until(lambda: _spec(fake)["download"]["concurrency"] == 4)

        # A user raises the high watermark by hand: kept through every later reconcile.
        nms = fake.objects[(NMS, None, "n1")]
        nms["spec"] = {**nms["spec"], "watermarks": {"highPercent": 92, "lowPercent": 70}}
        # A settings change reaches the fields nobody edited.
        _set(fake, "model-store-download-concurrency", "12")
        _set(fake, "model-store-low-watermark", "50")
        await until(lambda: worker.settings.values.model_store_download_concurrency == 12)
        await publish(bus, models_event(T0 + timedelta(seconds=1), done=2, used=2))
        await until(lambda: _spec(fake)["download"]["concurrency"] == 12)
        spec = _spec(fake)
        # 85 % used: above the settings' 80, below the user's 92: judged against the user's.
        await publish(bus, models_event(T0 + timedelta(seconds=2), done=3, used=8_500))
        await until(lambda: fake.get(NMS, "n1")["status"]["models"][0]["downloadedBytes"] == 3)
        status = fake.get(NMS, "n1")["status"]
        tg.cancel_scope.cancel()
    assert spec["watermarks"] == {"highPercent": 92, "lowPercent": 50}
    assert _spec(fake)["watermarks"]["highPercent"] == 92
    low = {c["type"]: c for c in status["conditions"]}["CapacityLow"]
    assert low["status"] == "False" and "92%" in low["message"]


@pytest.mark.anyio
async def test_a_model_store_overrides_its_nodes_and_reports_overlap(tmp_path: Path) -> None:
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        bus = settings_for(server)
        labelled = node("n1")
        labelled["metadata"]["labels"]["pool"] = "fast"
        fake.put_object("api/v1/nodes", labelled)
        for name, concurrency in (("a-pool", 24), ("b-pool", 2)):
            fake.put_object(MS, {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "ModelStore",
                                 **store(name, {"matchLabels": {"pool": "fast"}},
                                         download={"concurrency": concurrency})})  # fmt: skip
        await tg.start(running.run, msgspec.structs.replace(settings(bus, url), namespace="ns"))
        await publish(bus, models_event(T0, done=1, used=1))
        await until(lambda: _spec(fake).get("store") == "a-pool")
        await until(lambda: fake.get(MS, "b-pool")["status"]["nodes"] == 0)
        spec, b_status = _spec(fake), fake.get(MS, "b-pool")["status"]
        # Another labelled Node: the stores learn its labels from the worker's Node watch, and
        # their refreshes (every resync, 0.3 s here) list no Nodes once it has listed.
        node_lists, store_lists = fake.lists["api/v1/nodes"], fake.lists[MS]
        second = node("n2")
        second["metadata"]["labels"]["pool"] = "fast"
        fake.put_object("api/v1/nodes", second)
        await until(lambda: fake.get(MS, "a-pool")["status"]["nodes"] == 2)
        # Two more lists from here: the refresh that wrote a-pool's count (and, after it, b-pool's
        # overlap naming n2) has finished, since refreshes run one after another.
        seen = fake.lists[MS]
        await until(lambda: fake.lists[MS] >= max(seen, store_lists) + 2)
        # Settled: later refreshes plan the same statuses and write nothing.
        writes, settled_lists = fake.object_writes[(MS, None, "b-pool")], fake.lists[MS]
        await until(lambda: fake.lists[MS] >= settled_lists + 2)
        tg.cancel_scope.cancel()
    assert fake.object_writes[(MS, None, "b-pool")] == writes >= 1  # its status, once
    assert fake.lists["api/v1/nodes"] == node_lists
    assert spec["download"]["concurrency"] == 24
    overlap = {c["type"]: c for c in b_status["conditions"]}["SelectorOverlap"]
    assert overlap["status"] == "True"


def test_the_merged_spec_is_the_same_bytes_every_time() -> None:
    """The agents' bucket is written only when the encoded spec changes: key order matters."""
    desired = storespec.from_settings(settingscatalog.validate_all({}))
    observed = msgspec.json.decode(msgspec.json.encode(desired))
    observed["mine"] = 1
    merged = storespec.keep_user_edits(desired, observed, desired)
    assert list(merged) == [*desired, "mine"]
    assert msgspec.json.encode(storespec.keep_user_edits(desired, desired, desired)) == (
        msgspec.json.encode(desired)
    )


@pytest.mark.anyio
async def test_a_settings_change_reaches_the_spec_without_waiting_for_a_resync(
    tmp_path: Path,
) -> None:
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        bus = settings_for(server)
        fake.put_object("api/v1/nodes", node("n1"))
        conf = msgspec.structs.replace(
            settings(bus, url), namespace="ns", settings_period_s=0.05, resync_s=3600.0
        )
        await tg.start(running.run, conf)
        await publish(bus, models_event(T0, done=1, used=1))
        await until(lambda: _spec(fake)["download"]["bytesPerSecond"] == 0)
        _set(fake, "model-store-download-bandwidth", "1Mi")  # no event follows
        await until(lambda: _spec(fake)["download"]["bytesPerSecond"] == 2**20)
        tg.cancel_scope.cancel()
