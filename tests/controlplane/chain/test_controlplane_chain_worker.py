"""The scheduling chain end to end: the worker, real nats-server, the stateful fake API serving
Kueue's kinds (validated, tests/controlplane/kueue_schemas.py), two simulated nodes."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api
from kueue_schemas import node_labels, validator
from test_controlplane_worker import publish, worker_settings

from bus import events
from bus.devices import DeviceGroup
from bus.testing import eventually, nats_server, settings_for
from controlplane.chain import naming
from controlplane.chain.inventory import general_key
from controlplane.chain.settings import ChainSettings
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.worker import running

pytestmark = pytest.mark.anyio
HERE = Path(__file__).parents[1]
H200 = msgspec.json.decode(
    (HERE / "controlplane_detect_h200x8.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
AMD = msgspec.json.decode(
    (HERE / "controlplane_detect_amd_x2.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
MIG = msgspec.json.decode(
    (HERE / "controlplane_detect_h100x8_mig.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
KUEUE = "apis/kueue.x-k8s.io/v1beta2"
OURS = "apis/worker.gpustack.ai/v1alpha1"
IT_H200 = "gpustack--nvidia-h200-linux-amd64"
IT_RX = "gpustack--amd-radeon-rx-7800-xt-linux-amd64"
IT_CPU = "gpustack--generic-linux-amd64"
FLAVOR_H200 = "gpustack--generic--nvidia-h200-linux-amd64-8d"
FLAVOR_RX = "gpustack--generic--amd-radeon-rx-7800-xt-linux-amd64-2d"
M = 1_600_000
CHAIN = ChainSettings(fit_coalesce_s=0.1, period_s=0.5, retry_s=0.2, retry_cap_s=0.4)


def a_node(name: str, cpu: str) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64"}  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
        "status": {"capacity": {"cpu": cpu}, "allocatable": {"cpu": cpu}},
    }  # fmt: skip


@asynccontextmanager
async def cluster(
    tmp_path: Path, *, resync_s: float = 0.3, seed: dict[str, str] | None = None, **chain: Any
) -> AsyncIterator[tuple[FakeApi, running.Worker, object]]:
    async with nats_server(tmp_path) as server, fake_api() as (fake, url):
        for plural in ("resourceflavors", "clusterqueues", "localqueues", "admissionchecks",
                       "topologies", "workloads"):  # fmt: skip
            check = validator(f"{KUEUE}/{plural}")
            assert check is not None
            fake.validators[f"{KUEUE}/{plural}"] = check
        for ns in ("default", "team-a", "kube-system", "gpustack-system"):
            fake.put_object("api/v1/namespaces", {"metadata": {"name": ns}})
        fake.put_object("api/v1/nodes", a_node("h200", "96"))
        fake.put_object("api/v1/nodes", a_node("rx", "16"))
        bus = settings_for(server)
        settings = worker_settings(
            bus, url, chain=msgspec.structs.replace(CHAIN, **chain), resync_s=resync_s,
            settings_seed=settingscatalog.seed(seed or {}), settings_period_s=0.2,
        )  # fmt: skip
        async with anyio.create_task_group() as tg:
            worker: running.Worker = await tg.start(running.run, settings)
            await publish(bus, [
                events.DevicesEvent(node="h200", ts=events.now(), groups=H200),
                events.DevicesEvent(node="rx", ts=events.now(), groups=AMD),
            ])  # fmt: skip
            yield fake, worker, bus
            tg.cancel_scope.cancel()


def kueue(fake: FakeApi, plural: str) -> dict[str, dict[str, Any]]:
    return {
        (f"{ns}/" if ns else "") + name: body
        for (coll, ns, name), body in fake.objects.items()
        if coll == f"{KUEUE}/{plural}"
    }


def ours(fake: FakeApi, plural: str) -> dict[str, dict[str, Any]]:
    return {n: b for (c, _, n), b in fake.objects.items() if c == f"{OURS}/{plural}"}


def labels(fake: FakeApi, node: str) -> dict[str, str]:
    return dict(fake.get("api/v1/nodes", node)["metadata"].get("labels") or {})


def writes(fake: FakeApi) -> tuple[int, int, dict[Any, int]]:
    """Creates, deletes and updates per object, the leader's Lease renewals left out."""
    updates = {k: v for k, v in fake.object_writes.items() if "leases" not in k[0]}
    return fake.writes["create"], fake.writes["delete"], updates


async def settled(fake: FakeApi) -> bool:
    """Every queue has its LocalQueue in both namespaces and the H200 queue lists the check."""
    cqs = kueue(fake, "clusterqueues")
    cq = cqs.get(IT_H200)
    return bool(
        cq
        and cq["spec"].get("admissionChecksStrategy")
        and len(kueue(fake, "localqueues")) == 2 * len(cqs)
    )


async def passes(worker: running.Worker, n: int) -> None:
    """Wait until the chain reconciled ``n`` more times."""
    name = "gpustack_worker_reconcile_seconds_count"
    start = worker.metrics.count(name, kind="chain")

    async def done() -> bool:
        return worker.metrics.count(name, kind="chain") >= start + n

    await eventually(done, timeout_s=30)


async def test_two_nodes_make_the_chain_and_it_follows_the_ledger(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (fake, worker, bus):
        await eventually(lambda: settled(fake), timeout_s=30)
        assert set(ours(fake, "instancetypes")) == {IT_H200, IT_RX, IT_CPU}
        it = ours(fake, "instancetypes")[IT_H200]
        assert it["spec"]["acceleratorGroup"] == "nvidia-h200" and it["spec"]["memory"] == 143771
        assert it["metadata"]["labels"][naming.ENTRANCE] == naming.local_queue(IT_H200)
        assert it["status"]["summary"] == "8/8 8/80 100/800 0/0"
        flavors = kueue(fake, "resourceflavors")
        assert set(flavors) == {FLAVOR_H200, FLAVOR_RX, "gpustack--generic-linux-amd64-96c",
                                "gpustack--generic-linux-amd64-16c"}  # fmt: skip
        assert flavors[FLAVOR_RX]["spec"]["nodeLabels"] == {
            "acceleratable.feature.gpustack.ai/amd-radeon-rx-7800-xt": "true",
            "acceleratable.feature.gpustack.ai/amd-radeon-rx-7800-xt.count": "2",
            "general.feature.gpustack.ai/generic": "true", "kubernetes.io/arch": "amd64",
            "kubernetes.io/os": "linux", "topology.gpustack.ai/profile": "default",
        }  # fmt: skip
        assert set(ours(fake, "instancetypeflavors")) == set(flavors)
        cqs = kueue(fake, "clusterqueues")
        assert set(cqs) == {IT_H200, IT_RX, IT_CPU}
        rg = cqs[IT_RX]["spec"]["resourceGroups"]
        assert rg[0]["coveredResources"] == ["credits.gpustack.ai/amd"]
        assert rg[0]["flavors"][0]["resources"][0]["nominalQuota"] == "3200k"
        assert cqs[IT_H200]["spec"]["admissionChecksStrategy"] == {
            "admissionChecks": [{"name": "gpustack-node-devices"}]
        }
        assert cqs[IT_H200]["spec"]["stopPolicy"] == "None"
        assert "cohortName" not in cqs[IT_H200]["spec"]
        lqs = kueue(fake, "localqueues")
        assert {k.split("/")[0] for k in lqs} == {"default", "team-a"}
        assert lqs[f"default/{naming.local_queue(IT_RX)}"]["spec"]["clusterQueue"] == IT_RX
        checks = kueue(fake, "admissionchecks")
        assert set(checks) == {"gpustack-node-devices", "gpustack-model-deployment-joint"}
        active = checks["gpustack-node-devices"]["status"]["conditions"][0]
        assert (active["type"], active["status"]) == ("Active", "True")
        assert set(kueue(fake, "topologies")) == {"gpustack--default"}
        node = labels(fake, "h200")
        assert node["gpustack.ai/managed"] == "true"
        assert node["shared-free-cards.fit.gpustack.ai/nvidia-h200"] == "8"
        assert node["sliced-max-free-units.fit.gpustack.ai/nvidia-h200"] == str(M)

        # Nothing changed: passes go by and nothing is written.
        await passes(worker, 2)
        before = writes(fake)
        await passes(worker, 4)
        assert writes(fake) == before

        # An allocation: the InstanceType's remaining and the fit labels follow.
        card = H200[0].accelerators[0]
        await publish(bus, [events.AllocationEvent(
            node="h200", ts=events.now(), allocation_id="p/c", action="allocated",
            resource="nvidia.com/gpu", device_ids=(f"{H200[0].id}:{card.id}:0000",),
            pod_namespace="team-a", pod_name="p",
        )])  # fmt: skip

        async def allocated() -> bool:
            status = ours(fake, "instancetypes")[IT_H200].get("status") or {}
            return (status.get("accelerator") or {}).get("remaining") == 7 and labels(
                fake, "h200"
            ).get("shared-free-cards.fit.gpustack.ai/nvidia-h200") == "7"

        await eventually(allocated, timeout_s=30)
        assert ours(fake, "instancetypes")[IT_H200]["status"]["summary"] == "7/7 7/70 100/700 0/0"

        # A node removed: its flavor is deleted, its queue drained; the InstanceType stays.
        fake.remove("api/v1/nodes", "rx")

        async def drained() -> bool:
            cq = kueue(fake, "clusterqueues")[IT_RX]["spec"]
            return (
                FLAVOR_RX not in kueue(fake, "resourceflavors")
                and cq["stopPolicy"] == "HoldAndDrain"
            )

        await eventually(drained, timeout_s=30)
        assert kueue(fake, "clusterqueues")[IT_RX]["spec"]["resourceGroups"] == []
        assert IT_RX in ours(fake, "instancetypes")
        assert FLAVOR_RX not in ours(fake, "instancetypeflavors")


async def test_a_queue_past_kueues_flavor_limit_is_capped_and_names_the_nodes_left_out(
    tmp_path: Path,
) -> None:
    """65 CPU shapes: the ClusterQueue lists 64 (the Kueue schema refuses 65, so uncapped the
    queue would stop following its nodes) and the InstanceType says Degraded, naming the node
    left out; when a shape goes, the 65th is listed again and the condition goes."""
    cpu_96 = "gpustack--generic-linux-amd64-96c"
    async with cluster(tmp_path) as (fake, _worker, _bus):
        await eventually(lambda: settled(fake), timeout_s=30)
        for cores in range(1, 65):  # with rx's 16 and h200's 96: 65 shapes
            if cores != 16:
                fake.put_object("api/v1/nodes", a_node(f"c{cores:03d}", str(cores)))

        def status() -> dict[str, Any]:
            return dict(ours(fake, "instancetypes")[IT_CPU].get("status") or {})

        def listed() -> list[str]:
            (group,) = kueue(fake, "clusterqueues")[IT_CPU]["spec"]["resourceGroups"]
            return [f["name"] for f in group["flavors"]]

        async def capped() -> bool:
            return "conditions" in status() and len(listed()) == 64

        await eventually(capped, timeout_s=60)
        (condition,) = status()["conditions"]
        assert (condition["type"], condition["status"], condition["reason"]) == (
            "Degraded", "True", "TooManyFlavors",
        )  # fmt: skip
        assert condition["message"].endswith("1 nodes get no work from it: h200")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", condition["lastTransitionTime"])
        assert cpu_96 not in listed() and cpu_96 in kueue(fake, "resourceflavors")
        assert status()["entrance"] == naming.local_queue(IT_CPU)

        fake.remove("api/v1/nodes", "c001")

        async def healed() -> bool:
            return "conditions" not in status() and cpu_96 in listed()

        await eventually(healed, timeout_s=60)
        assert len(listed()) == 64


async def test_a_long_cpu_model_name_makes_valid_node_labels_and_flavors(tmp_path: Path) -> None:
    """A CPU name whose key is 79 characters: the Node patch and the ResourceFlavor pass the API's
    label rule (the old key was refused on both) with the key cut to 63 and a digest."""
    cpu_name = "GenuineIntel Xeon Platinum 8480+ Sapphire Rapids Processor with a long suffix"
    annotations = {"feature.gpustack.ai/cpu-name": cpu_name}
    key = general_key({}, annotations)
    flavor = naming.flavor(key, None, "linux", "amd64", 24, "default")
    async with cluster(tmp_path) as (fake, _worker, _bus):
        fake.validators["api/v1/nodes"] = node_labels
        await eventually(lambda: settled(fake), timeout_s=30)
        node = a_node("long", "24")
        node["metadata"]["annotations"] = annotations
        fake.put_object("api/v1/nodes", node)

        async def labelled() -> bool:
            cq = kueue(fake, "clusterqueues")[IT_CPU]["spec"]["resourceGroups"][0]
            return labels(fake, "long").get(f"{naming.GENERAL_PREFIX}{key}") == "true" and (
                flavor in {f["name"] for f in cq["flavors"]}
            )

        await eventually(labelled, timeout_s=30)
        selector = kueue(fake, "resourceflavors")[flavor]["spec"]["nodeLabels"]
        assert selector[f"{naming.GENERAL_PREFIX}{key}"] == "true"
    assert len(key) == 63 and key.startswith("genuineintel-xeon-platinum-8480")


def workload(
    name: str, limits: dict[str, str], count: int = 1, node: str = "h200"
) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"queueName": naming.local_queue(IT_H200), "podSets": [{
            "name": "main", "count": count,
            "template": {"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}},
        }]},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admission": {"clusterQueue": IT_H200, "podSetAssignments": [{
                "name": "main", "count": count,
                "flavors": {"credits.gpustack.ai/nvidia": FLAVOR_H200},
                "topologyAssignment": {"levels": ["kubernetes.io/hostname"],
                                       "domains": [{"values": [node], "count": count}]},
            }]},
            "admissionChecks": [{"name": "gpustack-node-devices", "state": "Pending"},
                                {"name": "other-check", "state": "Pending"}],
        },
    }  # fmt: skip


CASES = {
    "exclusive-fits": ({"nvidia.com/gpu": "8"}, 1, "Ready"),
    "exclusive-too-many": ({"nvidia.com/gpu": "3"}, 3, "Retry"),
    "shared-fits": ({"nvidia.com/gpu.shared": "8"}, 1, "Ready"),
    "shared-too-many": ({"nvidia.com/gpu.shared": "9"}, 1, "Retry"),
    "sliced-fits": ({"nvidia.com/gpu.sliced": "1", "nvidia.com/gpu.sliced.units": "800k"}, 16, "Ready"),
    "sliced-too-many": ({"nvidia.com/gpu.sliced": "1", "nvidia.com/gpu.sliced.units": "800k"}, 17, "Retry"),
    "partitioned-fits": ({"nvidia.com/gpu.partitioned": "1", "nvidia.com/gpu.partitioned.units": "400k"}, 4, "Ready"),
    "partitioned-no-mig": ({"nvidia.com/gpu.partitioned": "1", "nvidia.com/gpu.partitioned.units": "400k"}, 1, "Retry"),
}  # fmt: skip


async def test_admission_check_answers_ready_or_retry_per_family(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (fake, _worker, bus):
        # a third node with MIG on cards 0-3, for the partitioned family
        fake.put_object("api/v1/nodes", a_node("mig", "64"))
        await publish(bus, [events.DevicesEvent(node="mig", ts=events.now(), groups=MIG)])
        await eventually(lambda: settled(fake), timeout_s=30)

        def state(name: str) -> dict[str, Any]:
            body = fake.get(f"{KUEUE}/workloads", name, "team-a")
            return dict(body["status"]["admissionChecks"][0])

        async def answer(name: str, limits: dict[str, str], count: int) -> dict[str, Any]:
            node = "mig" if name == "partitioned-fits" else "h200"
            fake.put_object(f"{KUEUE}/workloads", workload(name, limits, count, node))

            async def answered() -> bool:
                return state(name).get("state") != "Pending"

            await eventually(answered, timeout_s=30)
            body = fake.get(f"{KUEUE}/workloads", name, "team-a")
            assert body["status"]["admissionChecks"][1] == {
                "name": "other-check",
                "state": "Pending",
            }
            # finished: it no longer holds cards for the next case
            body["status"]["conditions"].append({"type": "Finished", "status": "True"})
            return state(name)

        for name, (limits, count, expected) in CASES.items():
            entry = await answer(name, limits, count)
            assert entry["state"] == expected, (name, entry)
            if expected == "Retry":
                assert entry["requeueAfterSeconds"] > 0 and "does not fit" in entry["message"]

        # Two admitted together cannot both count the same free cards.
        for name in ("first", "second"):
            fake.put_object(f"{KUEUE}/workloads", workload(name, {"nvidia.com/gpu": "8"}))

        async def both() -> bool:
            return all(state(n).get("state") != "Pending" for n in ("first", "second"))

        await eventually(both, timeout_s=30)
        assert sorted(state(n)["state"] for n in ("first", "second")) == ["Ready", "Retry"]


async def test_kueue_absent_waits_then_manages(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as server, fake_api() as (fake, url):
        fake.absent.add("apis/kueue.x-k8s.io")
        fake.put_object("api/v1/namespaces", {"metadata": {"name": "default"}})
        fake.put_object("api/v1/nodes", a_node("h200", "96"))
        bus = settings_for(server)
        async with anyio.create_task_group() as tg:
            await tg.start(running.run, worker_settings(bus, url, chain=CHAIN))
            await publish(bus, [events.DevicesEvent(node="h200", ts=events.now(), groups=H200)])

            async def typed() -> bool:
                it = ours(fake, "instancetypes").get(IT_H200)
                return bool(it and it.get("status"))

            await eventually(typed, timeout_s=30)
            assert not any(c.startswith("apis/kueue") for c, _, _ in fake.objects)
            fake.absent.clear()  # Kueue installed

            async def managed() -> bool:
                return IT_H200 in kueue(fake, "clusterqueues")

            await eventually(managed, timeout_s=30)
            tg.cancel_scope.cancel()


async def test_workload_webhook_pins_podsets_to_fitting_nodes(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (fake, worker, _bus):
        await eventually(lambda: settled(fake), timeout_s=30)
        wl = workload("w", {"nvidia.com/gpu.sliced": "1", "nvidia.com/gpu.sliced.units": "800k"})
        del wl["status"]
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u1", "kind": {"group": "kueue.x-k8s.io", "version": "v1beta2", "kind": "Workload"},
            "operation": "CREATE", "namespace": "team-a", "object": wl,
        }}  # fmt: skip
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{worker.url}/webhooks/v1/workloads/mutate", json=review,
                                    ssl=False) as r:  # fmt: skip
                assert r.status == 200
                answer = await r.json()
            async with session.post(f"{worker.url}/webhooks/v1/workloads/mutate", data=b"{",
                                    ssl=False) as bad:  # fmt: skip
                assert bad.status == 400
        response = answer["response"]
        assert response["uid"] == "u1" and response["allowed"] is True
        ops = json.loads(base64.b64decode(response["patch"]))
        assert ops[0]["path"] == "/spec/podSets/0/template/spec/affinity"
        terms = ops[0]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [{"matchExpressions": [{
            "key": "sliced-max-free-units.fit.gpustack.ai/nvidia-h200", "operator": "Gt",
            "values": ["799999"],
        }]}]  # fmt: skip


def _looks_of(chain: Any) -> list[str]:
    """The names of the nodes ``chain`` looks at from now on (each signature it computes)."""
    looked: list[str] = []
    signature = chain._signature

    def counted(body: dict[str, Any]) -> tuple[Any, ...]:
        looked.append(body["metadata"]["name"])
        return signature(body)

    chain._signature = counted
    return looked


async def test_the_chain_lists_no_nodes_and_looks_only_at_changed_ones(tmp_path: Path) -> None:
    """After start, the chain's passes make no Node LIST (the informer's watch feeds them) and
    look again only at the nodes whose ledger state or Node changed; the watch's echo of the
    chain's own label patch is no reason for another patch."""
    # resyncs (which list Nodes for the node objects and the stores) out of the way
    async with cluster(tmp_path, resync_s=3600.0, period_s=3600.0) as (fake, worker, bus):
        await eventually(lambda: settled(fake), timeout_s=30)
        await passes(worker, 2)
        chain = worker.chain
        assert chain is not None
        node_lists = fake.lists["api/v1/nodes"]  # the informer's, the first resyncs'
        assert node_lists <= 3
        looked = _looks_of(chain)
        node_writes = {n: fake.object_writes[("api/v1/nodes", None, n)] for n in ("h200", "rx")}
        await passes(worker, 3)
        assert looked == []  # idle: nothing to look at
        card = H200[0].accelerators[0]
        await publish(bus, [events.AllocationEvent(
            node="h200", ts=events.now(), allocation_id="p/c", action="allocated",
            resource="nvidia.com/gpu", device_ids=(f"{H200[0].id}:{card.id}:0000",),
            pod_namespace="team-a", pod_name="p",
        )])  # fmt: skip

        async def relabelled() -> bool:
            return labels(fake, "h200").get("shared-free-cards.fit.gpustack.ai/nvidia-h200") == "7"

        await eventually(relabelled, timeout_s=30)
        fake.put_object("api/v1/nodes", a_node("late", "8"))  # its ADDED follows h200's echo

        async def late_managed() -> bool:
            return labels(fake, "late").get(naming.MANAGED) == "true"

        await eventually(late_managed, timeout_s=30)
        await passes(worker, 3)
        assert set(looked) == {"h200", "late"}
        assert fake.object_writes[("api/v1/nodes", None, "h200")] == node_writes["h200"] + 1
        assert fake.object_writes[("api/v1/nodes", None, "rx")] == node_writes["rx"]
        assert fake.lists["api/v1/nodes"] == node_lists
        assert fake.lists["api/v1/namespaces"] >= 1  # the small kinds are still listed


async def test_the_chains_full_passes_read_the_informer_not_a_node_list(tmp_path: Path) -> None:
    async with cluster(tmp_path, resync_s=3600.0) as (fake, _worker, _bus):
        await eventually(lambda: settled(fake), timeout_s=30)
        node_lists = fake.lists["api/v1/nodes"]
        namespace_lists = fake.lists["api/v1/namespaces"]

        async def two_more_periods() -> bool:  # each period lists the small kinds again
            return fake.lists["api/v1/namespaces"] >= namespace_lists + 2

        await eventually(two_more_periods, timeout_s=30)
        assert fake.lists["api/v1/nodes"] == node_lists
        assert labels(fake, "h200")[naming.MANAGED] == "true"


async def test_after_the_informer_lists_again_the_chain_looks_at_every_node(tmp_path: Path) -> None:
    async with cluster(tmp_path, resync_s=3600.0, period_s=3600.0) as (fake, worker, _bus):
        await eventually(lambda: settled(fake), timeout_s=30)
        await passes(worker, 2)
        chain = worker.chain
        assert chain is not None
        looked = _looks_of(chain)
        before = writes(fake)
        lists = fake.lists["api/v1/nodes"]
        held = fake.hold("GET", "/api/v1/nodes")  # the Node watch resumed after its stream ended
        fake.end_watches()
        await held.reached.wait()
        fake.put_object("api/v1/namespaces", {"metadata": {"name": "elsewhere"}})
        fake.compact()  # the watch resumes from history: 410, the informer lists again
        held.release.set()

        async def relisted() -> bool:
            return chain._nodes.lists == 2  # the first list, and this one applied

        await eventually(relisted, timeout_s=30)
        await passes(worker, 2)  # the second began after the list: a full pass
        assert fake.lists["api/v1/nodes"] == lists + 1
        assert {"h200", "rx"} <= set(looked)
        assert writes(fake) == before  # nothing differed: nothing written


async def test_mixed_on_node_follows_the_setting_live(tmp_path: Path) -> None:
    """``instance-type-mixed-on-node=false`` (seeded): only the node with no accelerator takes
    CPU work, labelled ``cpu-only``; set back to true, the label goes and every node's CPU
    joins the CPU queue again, without a restart."""
    seed = {"GPUSTACK_INSTANCE_TYPE_MIXED_ON_NODE": "false"}
    async with cluster(tmp_path, seed=seed) as (fake, worker, _):
        fake.put_object("api/v1/nodes", a_node("cpu1", "8"))

        def cpu_flavors() -> list[str]:
            cq = kueue(fake, "clusterqueues").get(IT_CPU) or {"spec": {}}
            groups = cq["spec"].get("resourceGroups") or [{"flavors": []}]
            return [f["name"] for f in groups[0]["flavors"]]

        async def apart() -> bool:
            return labels(fake, "cpu1").get(naming.CPU_ONLY) == "true" and cpu_flavors() == [
                "gpustack--generic-linux-amd64-8c"
            ]

        await eventually(apart, timeout_s=30)
        flavor = kueue(fake, "resourceflavors")["gpustack--generic-linux-amd64-8c"]
        assert flavor["spec"]["nodeLabels"][naming.CPU_ONLY] == "true"
        assert naming.CPU_ONLY not in labels(fake, "h200")
        assert worker.chain is not None and worker.chain.flavor_nodes[
            "gpustack--generic-linux-amd64-8c"
        ] == ["cpu1"]

        assert worker.settings is not None
        await worker.settings.write("instance-type-mixed-on-node", "true")

        async def mixed() -> bool:
            return naming.CPU_ONLY not in labels(fake, "cpu1") and cpu_flavors() == [
                "gpustack--generic-linux-amd64-8c",
                "gpustack--generic-linux-amd64-16c",
                "gpustack--generic-linux-amd64-96c",
            ]

        await eventually(mixed, timeout_s=30)
        flavor = kueue(fake, "resourceflavors")["gpustack--generic-linux-amd64-8c"]
        assert naming.CPU_ONLY not in flavor["spec"]["nodeLabels"]
