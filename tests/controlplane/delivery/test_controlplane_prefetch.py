"""ModelPrefetch through the fake Kubernetes API: warm-up Pods created per target node and
removed when done, status fields and conditions as the reference names them, pins handed to
the NodeModelStore spec, the webhook's rules."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from controlplane_fakeapi import fake_api, node
from test_controlplane_bindings import _answer
from test_controlplane_nms_status import strict

from bus import events, records
from controlplane.clustersettings.catalog import DEFAULTS
from controlplane.delivery.prefetching import Prefetcher
from controlplane.k8s.client import KubeSettings, open_client
from controlplane.reconciling.nodestates import Ledger
from controlplane.schema import crds
from controlplane.stores import prefetches
from controlplane.stores.modelstores import ModelStores
from kit.latest import Latest

pytestmark = pytest.mark.anyio

G = "apis/worker.gpustack.ai/v1alpha1"
MPF, MSB, MS, MART = (f"{G}/{p}" for p in ("modelprefetches", "modelstorebindings",
                                           "modelstores", "modelartifacts"))  # fmt: skip
NODES, PODS, ITS = "api/v1/nodes", "api/v1/pods", f"{G}/instancetypes"
D0 = "sha256:" + "a" * 64
NOW = datetime.now(UTC)


def _schema(stem: str) -> jsonschema.Draft7Validator:
    crd = crds.definitions()[stem]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(strict(crd))


def labelled(name: str, **labels: str) -> dict[str, Any]:
    body = node(name)
    body["metadata"]["labels"].update(labels)
    return body


def prefetch(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "ModelPrefetch",
            "metadata": {"name": "warm", "namespace": "team-a"},
            "spec": {"artifactRef": {"name": "llm"}, "bindingRef": {"name": "b1"}, **spec}}  # fmt: skip


def cluster(
    fake: Any, *, allow_pinned: bool = True, resolved: bool = True, revoked: bool = False
) -> None:
    """s1 selects pool=a: n1, n2 (gpu) and n4 (no gpu); n3 (gpu) is in s2's pool."""
    for name, pool in (("s1", "a"), ("s2", "b")):
        fake.put_object(MS, {"metadata": {"name": name},
                             "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}}})  # fmt: skip
    fake.put_object(NODES, labelled("n1", pool="a", gpu="yes", **{"kubernetes.io/os": "linux"}))
    fake.put_object(NODES, labelled("n2", pool="a", gpu="yes"))
    fake.put_object(NODES, labelled("n3", pool="b", gpu="yes"))
    fake.put_object(NODES, labelled("n4", pool="a"))
    art: dict[str, Any] = {
        "metadata": {"name": "llm", "namespace": "team-a", "uid": "art-uid"},
        "spec": {"source": {"huggingFace": {"repository": "o/m", "secretRef": {"name": "hf"}}}},
    }
    if resolved:
        art["status"] = {"resolved": {"manifestDigest": D0, "sizeBytes": 100}}
    if revoked:
        art["status"]["conditions"] = [{"type": "Resolved", "status": "False",
                                        "reason": "AccessDenied"}]  # fmt: skip
    fake.put_object(MART, art)
    fake.put_object(MSB, {"metadata": {"name": "b1", "namespace": "team-a"},
                          "spec": {"storeRefs": [{"name": "s1"}], "allowPinned": allow_pinned},
                          "status": {"phase": "Ready"}})  # fmt: skip


def held(name: str, state: str, **kw: Any) -> events.ModelsEvent:
    model = events.ModelState(model=D0, digest=D0, state=state, **kw)  # type: ignore[arg-type]
    return events.ModelsEvent(node=name, ts=NOW, models=(model,))


def conditions(body: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in body["status"]["conditions"]}


def warmups(fake: Any) -> dict[str, dict[str, Any]]:
    return {b["spec"]["nodeName"]: b for (c, _, _), b in fake.objects.items() if c == PODS}


async def test_a_prefetch_delivers_with_one_warmup_pod_per_missing_node_and_pins() -> None:
    ledger = Ledger()
    ledger.apply(held("n1", "ready"))
    pinned_nodes: list[str] = []
    prefetcher = Prefetcher(ledger, image="img:1".strip, on_pins=pinned_nodes.append)
    spec = {"placement": {"nodeSelector": {"matchLabels": {"gpu": "yes"}}}, "minReady": 1,
            "retention": {"pinned": True}}  # fmt: skip
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        cluster(fake)
        fake.put_object(MPF, prefetch(**spec))
        await prefetcher.refresh(api)
        first = fake.get(MPF, "warm", "team-a")
        pods = warmups(fake)
        ledger.apply(held("n2", "downloading"))
        await prefetcher.refresh(api)
        second = fake.get(MPF, "warm", "team-a")["status"]
        assert fake.writes["create"] == 1  # the Pod of n2 exists: not made again
        pod = fake.get(PODS, pods["n2"]["metadata"]["name"], "team-a")
        pod["status"] = {"phase": "Succeeded"}
        ledger.apply(held("n2", "ready"))
        await prefetcher.refresh(api)
        third = fake.get(MPF, "warm", "team-a")
        left = warmups(fake)

    _schema("modelprefetches").validate(first)
    assert list(pods) == ["n2"]  # n1 holds it; n3 is not in the binding's store; n4 no gpu
    assert {k: first["status"][k] for k in ("desiredNodes", "readyNodes", "downloadingNodes")} == {
        "desiredNodes": 2, "readyNodes": 1, "downloadingNodes": 0,
    }  # fmt: skip
    assert conditions(first) == {
        "Progressing": ("True", "Downloading"), "Available": ("True", "MinReady"),
        "Degraded": ("False", "AsExpected"), "Lapsed": ("False", "InUse"),
    }  # fmt: skip
    assert second["downloadingNodes"] == 1
    assert left == {}  # finished: removed
    assert (third["status"]["readyNodes"], conditions(third)["Progressing"]) == (
        2, ("False", "Complete"),
    )  # fmt: skip
    assert prefetcher.pins("n1") == prefetcher.pins("n2") == (D0,)
    assert prefetcher.pins("n3") == ()
    assert pinned_nodes == ["n1", "n2"]
    warm = pods["n2"]
    assert "kueue.x-k8s.io/queue-name" not in warm["metadata"]["labels"]
    assert warm["metadata"]["labels"][prefetches.POD_LABEL] == first["metadata"]["uid"]
    assert warm["metadata"]["ownerReferences"][0]["kind"] == "ModelPrefetch"
    assert warm["spec"]["nodeName"] == "n2" and warm["spec"]["containers"][0]["image"] == "img:1"
    assert warm["spec"]["volumes"][0]["csi"] == {
        "driver": "model.csi.gpustack.ai", "readOnly": True,
        "volumeAttributes": {"artifact": "llm", "artifactUID": "art-uid", "manifestDigest": D0},
        "nodePublishSecretRef": {"name": "hf"},
    }  # fmt: skip


async def test_pins_reach_the_node_model_store_spec_the_agent_reads() -> None:
    """Pinned on every node of the binding's store (n4 has no gpu label: no placement here),
    written into the spec the node's agent reads, and gone with the prefetch."""
    ledger = Ledger()
    changed: list[str] = []
    pins: Latest[str, tuple[str, ...]] = Latest(())
    prefetcher = Prefetcher(ledger, pins=pins, on_pins=changed.append)
    stores = ModelStores(lambda: DEFAULTS, pins.get)
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        cluster(fake)
        fake.put_object(MPF, prefetch(retention={"ttlAfterLastUse": "72h"}))
        await prefetcher.refresh(api)
        spec = stores.spec_for({"pool": "a"}, "n4")
        other = stores.spec_for({"pool": "b"}, "n3")
        fake.remove(MPF, "warm", "team-a")
        await prefetcher.refresh(api)
    assert spec["pinned"] == [D0] and "pinned" not in other
    _schema("nodemodelstores").validate({"spec": spec})
    assert msgspec.convert(spec, records.StoreSpec).pinned == (D0,)
    assert changed == ["n1", "n2", "n4", "n1", "n2", "n4"]  # pinned, then unpinned
    assert "pinned" not in stores.spec_for({"pool": "a"}, "n4")


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ({"allow_pinned": False}, "PinningNotAllowed"),
        ({"resolved": False}, "ArtifactNotResolved"),
        ({"revoked": True}, "ArtifactNotResolved"),
    ],
)
async def test_what_degrades_a_prefetch(setup: dict[str, bool], reason: str) -> None:
    prefetcher = Prefetcher(Ledger())
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        cluster(fake, **setup)
        fake.put_object(MPF, prefetch(retention={"pinned": True}))
        await prefetcher.refresh(api)
        body = fake.get(MPF, "warm", "team-a")
        pods = warmups(fake)
    assert conditions(body)["Degraded"] == ("True", reason)
    assert prefetcher.pins("n1") == ()
    assert bool(pods) is (reason == "PinningNotAllowed")  # delivered, only not pinned


async def test_a_missing_binding_makes_no_pod() -> None:
    prefetcher = Prefetcher(Ledger())
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        cluster(fake)
        fake.put_object(MPF, {**prefetch(), "spec": {"artifactRef": {"name": "llm"},
                                                     "bindingRef": {"name": "nope"}}})  # fmt: skip
        await prefetcher.refresh(api)
        body = fake.get(MPF, "warm", "team-a")
        assert warmups(fake) == {}
    assert conditions(body)["Degraded"] == ("True", "BindingNotFound")
    assert conditions(body)["Available"] == ("False", "NotEnoughReady")


async def test_unused_past_the_ttl_the_prefetch_lapses_and_unpins() -> None:
    ledger = Ledger()
    ledger.apply(held("n1", "ready", referenced=0, last_used=NOW - timedelta(hours=2)))
    ledger.apply(held("n2", "ready", referenced=0, last_used=NOW - timedelta(hours=3)))
    prefetcher = Prefetcher(ledger)
    spec = {"placement": {"nodeSelector": {"matchLabels": {"gpu": "yes"}}},
            "retention": {"pinned": True, "ttlAfterLastUse": "1h"}}  # fmt: skip
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        cluster(fake)
        fake.put_object(MPF, prefetch(**spec))
        await prefetcher.refresh(api)
        lapsed = fake.get(MPF, "warm", "team-a")
        ledger.apply(held("n2", "ready", referenced=1, last_used=NOW))
        await prefetcher.refresh(api)
        used = fake.get(MPF, "warm", "team-a")
    assert conditions(lapsed)["Lapsed"] == ("True", "TTLExpired")
    assert conditions(used)["Lapsed"] == ("False", "InUse")
    assert prefetcher.pins("n1") == (D0,)  # in use again: pinned again


async def test_instance_type_placement_picks_the_nodes_offering_it() -> None:
    prefetcher = Prefetcher(Ledger())
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        cluster(fake)
        fake.put_object(ITS, {"metadata": {"name": "h100"},
                              "spec": {"acceleratorGroup": "nvidia-h100", "os": "linux",
                                       "arch": "amd64", "unit": 1600000}})  # fmt: skip
        n1 = fake.get(NODES, "n1")
        n1["metadata"]["labels"].update({"acceleratable.feature.gpustack.ai/nvidia-h100": "true",
                                         "kubernetes.io/arch": "amd64"})  # fmt: skip
        fake.put_object(MPF, prefetch(placement={"instanceTypes": ["h100"]}))
        await prefetcher.refresh(api)
        assert list(warmups(fake)) == ["n1"]


def test_prefetch_webhook_rules() -> None:
    old = prefetch(placement={"instanceTypes": ["h100"]})
    both = prefetch(placement={"instanceTypes": ["h100"], "nodeSelector": {}})
    assert _answer("modelprefetches", both) == (
        "spec.placement: Forbidden: placement takes instanceTypes or nodeSelector, not both"
    )
    moved = prefetch()
    moved["spec"]["artifactRef"] = {"name": "other"}
    assert _answer("modelprefetches", moved, old) == (
        "spec.artifactRef: Forbidden: artifactRef is immutable"
    )
    assert _answer("modelprefetches", prefetch(minReady=3), old) == ""
    bad = prefetch(retention={"ttlAfterLastUse": "soon"})
    assert _answer("modelprefetches", bad).startswith("spec.retention.ttlAfterLastUse: Invalid")


def test_the_warmup_command_reads_every_file(tmp_path: Path) -> None:
    """The Pod's shell line, run by the real sh, find and sha256sum on a tree (its output kept
    here): every file, in every directory, is read back whole."""
    tree = tmp_path / "model"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.bin").write_bytes(b"x" * 1000)
    (tree / "sub" / "b.json").write_text("{}")
    line = prefetches.READ_BACK.replace(prefetches.MODEL_PATH, str(tree))
    traced = subprocess.run(["sh", "-c", line.replace("> /dev/null", "")], capture_output=True,
                            text=True, check=True)  # fmt: skip
    read = sorted(row.split()[1] for row in traced.stdout.splitlines())
    assert read == [str(tree / "a.bin"), str(tree / "sub" / "b.json")]


async def test_a_refused_write_stops_only_its_own_prefetch() -> None:
    """The API refuses the first warm-up Pod once: that prefetch waits for the next round, the
    other one (sorted after it) is delivered in the same round."""
    prefetcher = Prefetcher(Ledger())
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        cluster(fake)
        fake.put_object(
            MPF, prefetch(placement={"nodeSelector": {"matchLabels": {"pool": "a", "gpu": "yes"}}})
        )
        other = prefetch(placement={"nodeSelector": {"matchLabels": {"gpu": "yes"}}})
        other["metadata"]["name"] = "warm2"
        fake.put_object(MPF, other)
        fake.fail_next("POST", "/api/v1/namespaces/team-a/pods", 403)
        await prefetcher.refresh(api)
        first = {n: fake.get(MPF, n, "team-a").get("status") for n in ("warm", "warm2")}
        made = sorted(p["metadata"]["name"] for (c, _, _), p in fake.objects.items() if c == PODS)
        await prefetcher.refresh(api)
        again = sorted(p["metadata"]["name"] for (c, _, _), p in fake.objects.items() if c == PODS)
    assert first["warm"] is None and first["warm2"]["desiredNodes"] == 2
    assert made == sorted(prefetches.pod_name("warm2", n) for n in ("n1", "n2"))
    assert len(again) == 4 and prefetches.pod_name("warm", "n1") in again
