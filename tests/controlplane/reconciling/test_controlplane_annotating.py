"""The allocation written back to its Pod, and ``Devices.status`` from the agents' own charges.

The pure entry, merge and status fold first; then :class:`PodAnnotator` against the stateful fake
API over HTTP (the real kubernetes_asyncio client), as the leader runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from controlplane_fakeapi import fake_api

from bus import events
from bus.devices import DeviceGroup
from bus.testing import eventually
from controlplane.k8s.client import KubeSettings, open_client
from controlplane.reconciling import allocating
from controlplane.reconciling.annotating import ANNOTATION, PodAnnotator, entry, merged
from controlplane.reconciling.nodestates import Ledger

HERE = Path(__file__).parents[1]
PODS = "api/v1/pods"


def groups(name: str) -> tuple[DeviceGroup, ...]:
    return msgspec.json.decode((HERE / name).read_bytes(), type=tuple[DeviceGroup, ...])


H200 = groups("controlplane_detect_h200x8.json")
H100 = groups("controlplane_detect_h100x8_mig.json")
CARD = H200[0].accelerators[2]
TOKEN = f"{H200[0].id}:{CARD.id}:0005"


def sliced(**over: Any) -> events.AllocationEvent:
    base = events.AllocationEvent(
        node="n1", allocation_id=f"nvidia.com/gpu.sliced/{TOKEN}", action="allocated",
        resource="nvidia.com/gpu.sliced", device_ids=(TOKEN,), pod_namespace="ns", pod_name="p",
        container="main", pod_uid="uid-p",
        charges=(events.CardCharge(accelerator_id=CARD.id, units=400_000),),
        memory_mib=35_942, cores_percentage=50,
    )  # fmt: skip
    return msgspec.structs.replace(base, **over)


def test_a_slice_entry_names_the_card_its_units_and_caps() -> None:
    assert entry(sliced(), H200) == {
        "devices": {"groups": [{"id": "nvidia-h200", "manufacturer": "nvidia", "accelerators": [
            {"id": CARD.id, "index": 2, "mode": 3, "allocated": 400_000, "memoryMib": 35_942,
             "coresPercentage": 50}]}]},
        "deviceIDs": [TOKEN],
    }  # fmt: skip


def test_an_event_without_charges_is_entered_at_its_token_share() -> None:
    got = entry(sliced(charges=(), memory_mib=None, cores_percentage=None), H200)
    assert got is not None
    assert got["devices"]["groups"][0]["accelerators"][0]["allocated"] == 1_600_000 // 128


def test_an_event_naming_no_known_card_has_no_entry() -> None:
    assert entry(sliced(device_ids=("g:GPU-gone:0000",), charges=()), H200) is None
    assert entry(sliced(resource="device.gpustack.ai/nvidia.visibility"), H200) is None


def test_a_partition_entry_names_its_profile_and_instance() -> None:
    card = H100[0].accelerators[0]
    event = events.AllocationEvent(
        node="n1", allocation_id="a", action="allocated", resource="nvidia.com/gpu.partitioned",
        device_ids=(f"{H100[0].id}:{card.id}:0000",), profile="3g.40gb", partition_id="MIG-1",
        charges=(events.CardCharge(accelerator_id=card.id, units=793_496),),
    )  # fmt: skip
    got = entry(event, H100)
    assert got is not None
    (acc,) = got["devices"]["groups"][0]["accelerators"]
    assert acc["mode"] == 4 and acc["allocated"] == 793_496
    assert acc["allocatedPhysicalProfile"] == "3g.40gb" and acc["allocatedPhysicalID"] == "MIG-1"


def test_merging_keeps_other_containers_and_says_when_nothing_changes() -> None:
    mine = {"deviceIDs": ["x"]}
    first = merged(json.dumps({"other": {"deviceIDs": ["y"]}}), "main", mine)
    assert first is not None and json.loads(first) == {"other": {"deviceIDs": ["y"]}, "main": mine}
    assert merged(first, "main", mine) is None
    assert json.loads(merged("{not json", "main", mine) or "") == {"main": mine}
    assert json.loads(merged("[1]", "main", mine) or "") == {"main": mine}


def test_status_charges_what_the_agent_charged_and_counts_slices_and_profiles() -> None:
    h100 = H100[0].accelerators[1]
    part = events.AllocationEvent(
        node="n1", allocation_id="b", action="allocated", resource="nvidia.com/gpu.partitioned",
        device_ids=(f"{H100[0].id}:{h100.id}:0001",), profile="1g.10gb",
        charges=(events.CardCharge(accelerator_id=h100.id, units=195_918),),
    )  # fmt: skip
    status = allocating.devices_status((*H200, *H100), {"a": sliced(), "b": part})
    cards = {c["id"]: c for g in status.body["groups"] for c in g["accelerators"]}
    assert cards[CARD.id] == {"id": CARD.id, "index": 2, "mode": "Sliced", "allocated": 400_000,
                              "remaining": 1_200_000, "allocatedSlices": 1}  # fmt: skip
    assert cards[h100.id]["allocated"] == 195_918
    assert cards[h100.id]["allocatedProfiles"] == [{"name": "1g.10gb", "count": 1}]
    left = {p["name"]: p["count"] for p in cards[h100.id]["remainingProfiles"]}
    assert left == {"1g.10gb": 6, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1,
                    "7g.80gb": 0}  # fmt: skip
    assert [p["name"] for p in cards[h100.id]["remainingProfiles"]][:2] == ["1g.10gb", "1g.20gb"]
    idle = cards[H100[0].accelerators[0].id]["remainingProfiles"]
    assert {p["name"]: p["count"] for p in idle}["7g.80gb"] == 1


def test_a_partitioned_card_held_in_another_mode_or_unhealthy_fits_no_profile() -> None:
    card = H100[0].accelerators[2]
    whole = events.AllocationEvent(
        node="n1", allocation_id="w", action="allocated", resource="nvidia.com/gpu",
        device_ids=(f"{H100[0].id}:{card.id}:0000",),
    )  # fmt: skip
    sick = msgspec.structs.replace(
        H100[0].accelerators[3],
        status=msgspec.structs.replace(H100[0].accelerators[3].status, unhealthy=True),
    )
    group = msgspec.structs.replace(
        H100[0], accelerators=(*H100[0].accelerators[:3], sick, *H100[0].accelerators[4:])
    )
    status = allocating.devices_status((group,), {"w": whole})
    cards = {c["id"]: c for g in status.body["groups"] for c in g["accelerators"]}
    for held in (card.id, sick.id):
        assert all(p["count"] == 0 for p in cards[held]["remainingProfiles"])
        assert len(cards[held]["remainingProfiles"]) == 6
    assert "remainingProfiles" not in cards[H100[0].accelerators[4].id]


def pod(uid: str = "uid-p", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": uid}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"nodeName": "n1", "containers": [{"name": "main"}]}}


@pytest.mark.anyio
async def test_the_annotator_writes_the_entry_onto_the_pod_it_names() -> None:
    ledger = Ledger()
    ledger.apply(events.DevicesEvent(node="n1", groups=H200))
    annotator = PodAnnotator(ledger, retry_s=0.01)
    async with (
        fake_api() as (fake, url),
        open_client(KubeSettings.for_tests(url, backoff_s=0.01)) as api,
        anyio.create_task_group() as tg,
    ):
        fake.put_object(PODS, pod(annotations={ANNOTATION: json.dumps({"side": {"x": 1}})}))
        fake.fail_next("PATCH", "/api/v1/namespaces/ns/pods/p", 500)
        tg.start_soon(annotator.run, api)
        annotator.note(sliced())
        await eventually(lambda: _written(annotator, 1))
        value = json.loads(fake.get(PODS, "p", "ns")["metadata"]["annotations"][ANNOTATION])
        assert value["side"] == {"x": 1}  # another container's entry is kept
        assert value["main"] == entry(sliced(), H200)
        assert not await annotator.write(api, sliced())  # already there: no write
        fake.put_object(PODS, pod(uid="uid-other"))
        assert not await annotator.write(api, sliced())  # same name, another Pod
        fake.remove(PODS, "p", "ns")
        assert not await annotator.write(api, sliced())  # gone: nothing to do
        tg.cancel_scope.cancel()
    assert fake.writes["patch"] == 1


async def _written(annotator: PodAnnotator, count: int) -> bool:
    return annotator.written == count


@pytest.mark.anyio
async def test_a_pod_that_refuses_the_patch_for_good_is_given_up_and_others_still_written() -> None:
    ledger = Ledger()
    ledger.apply(events.DevicesEvent(node="n1", groups=H200))
    annotator = PodAnnotator(ledger, retry_s=0.01)
    other = pod()
    other["metadata"].update(name="q", uid="uid-q")
    async with (
        fake_api() as (fake, url),
        open_client(KubeSettings.for_tests(url, backoff_s=0.01)) as api,
        anyio.create_task_group() as tg,
    ):
        fake.put_object(PODS, pod())
        fake.put_object(PODS, other)
        fake.fail_next("PATCH", "/api/v1/namespaces/ns/pods/p", 403, times=100)
        tg.start_soon(annotator.run, api)
        annotator.note(sliced())
        annotator.note(sliced(allocation_id="other", pod_name="q", pod_uid="uid-q"))
        await eventually(lambda: _written(annotator, 1))
        await eventually(lambda: _given_up(annotator))
        tg.cancel_scope.cancel()
    assert ANNOTATION in fake.get(PODS, "q", "ns")["metadata"]["annotations"]
    assert ANNOTATION not in (fake.get(PODS, "p", "ns")["metadata"].get("annotations") or {})


async def _given_up(annotator: PodAnnotator) -> bool:
    return not annotator._pending and not annotator._failures


@pytest.mark.anyio
async def test_an_allocation_before_its_nodes_cards_is_written_once_they_arrive() -> None:
    ledger = Ledger()
    annotator = PodAnnotator(ledger, retry_s=0.2)
    async with (
        fake_api() as (fake, url),
        open_client(KubeSettings.for_tests(url, backoff_s=0.01)) as api,
        anyio.create_task_group() as tg,
    ):
        fake.put_object(PODS, pod())
        tg.start_soon(annotator.run, api)
        annotator.note(sliced())
        await eventually(lambda: _tried(annotator))  # tried once: nothing known, nothing written
        assert annotator.written == 0
        ledger.apply(events.DevicesEvent(node="n1", groups=H200))
        await eventually(lambda: _written(annotator, 1))
        tg.cancel_scope.cancel()


async def _tried(annotator: PodAnnotator) -> bool:
    return bool(annotator._failures)
