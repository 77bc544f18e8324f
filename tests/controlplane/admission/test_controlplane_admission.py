"""The Pod webhooks end to end: AdmissionReview documents over HTTPS to a running worker.

The worker runs with ``--kubeconfig=none`` (the bus-KV ledger, as in ``standalone``) against a
real nats-server, and learns its accelerator groups from devices events like in production: an
H200 node (``nvidia-h200``, 143,771 MiB) and an H100 node in MIG mode. Every Pod goes through the
pipeline the API server runs: the mutating webhook, its JSON Patch applied, then the validating
webhook on the result. Every rule and message of ``docs/requests.md`` is exercised here.
"""

from __future__ import annotations

import base64
import io
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from admission_helpers import GROUP, H100_MIG, H200, apply_patch, container, patch_of, pod, review
from controlplane_fakeapi import fake_api

from bus import codec, connection, events, subjects
from bus.testing import eventually, nats_server, settings_for
from controlplane.admission.webhooks import MUTATE_PATH, VALIDATE_PATH, WebhookSettings
from controlplane.k8s.client import KubeSettings
from controlplane.worker import running
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NV = "nvidia.com/gpu"
LIMITS = "spec.containers[0].resources.limits"
H200_NODE = {"nodeSelector": {f"{GROUP}nvidia-h200": "true"}}


def _slice(**keys: str) -> dict[str, str]:
    return {
        f"{NV}.sliced": "1",
        **{f"{NV}.sliced.{k.replace('_', '-')}": v for k, v in keys.items()},
    }


@dataclass
class Webhooks:
    session: aiohttp.ClientSession
    url: str
    bus: Any = None

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        data = io.BytesIO(body if isinstance(body, bytes) else json.dumps(body).encode())
        async with self.session.post(self.url + path, data=data, ssl=False) as r:
            text = await r.text()
            return r.status, json.loads(text) if r.content_type == "application/json" else text

    async def call(self, path: str, obj: Any) -> dict[str, Any]:
        doc = review(obj)
        status, answer = await self.post(path, doc)
        assert status == 200, answer
        assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
        assert answer["response"]["uid"] == doc["request"]["uid"]
        response: dict[str, Any] = answer["response"]
        return response

    async def admit(self, obj: Any) -> tuple[Any, dict[str, Any]]:
        """Mutate, apply the patch, validate: the mutated Pod and the validating answer."""
        mutation = await self.call(MUTATE_PATH, obj)
        assert mutation["allowed"] is True, mutation
        mutated = apply_patch(obj, patch_of(mutation))
        return mutated, await self.call(VALIDATE_PATH, mutated)

    async def refused(self, obj: Any) -> str:
        _, answer = await self.admit(obj)
        assert answer["allowed"] is False, answer
        assert (answer["status"]["code"], answer["status"]["reason"]) == (422, "Invalid")
        message: str = answer["status"]["message"]
        return message


async def _publish(bus: object, evs: list[events.Event]) -> None:
    async with connection.connect(bus, name="test") as conn:  # type: ignore[arg-type]
        for e in evs:
            await conn.publish(subjects.subject(e.node, events.kind_of(e)), codec.encode(e))
        await conn.flush()


@asynccontextmanager
async def webhooks(tmp_path: Path, *, groups: bool = True) -> AsyncIterator[Webhooks]:
    """A worker with no cluster, knowing an H200 node and an H100 MIG node (unless not)."""
    async with nats_server(tmp_path) as server, anyio.create_task_group() as tg:
        bus = settings_for(server)
        settings = running.WorkerSettings(
            concurrency=16,
            bus=bus, kube=None, https=HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
            resync_s=0.3,
        )  # fmt: skip
        worker: running.Worker = await tg.start(running.run, settings)
        async with aiohttp.ClientSession() as session:
            client = Webhooks(session, worker.url, bus)
            if groups:
                await _publish(bus, [
                    events.DevicesEvent(node="h200", ts=T0, groups=H200),
                    events.DevicesEvent(node="h100", ts=T0, groups=H100_MIG),
                ])  # fmt: skip

                async def knows_both() -> bool:
                    answer = await client.call(MUTATE_PATH, pod(container("c", _slice(memory_mib="1")),
                                                                **H200_NODE))  # fmt: skip
                    part = {f"{NV}.partitioned": "1", f"{NV}.partitioned.mig-1g.10gb": "1"}
                    other = await client.call(MUTATE_PATH, pod(container("c", part)))
                    return len(patch_of(answer)) == 4 and len(patch_of(other)) == 2

                await eventually(knows_both, timeout_s=20)
            yield client
        tg.cancel_scope.cancel()


def _resources(obj: Any, index: int = 0) -> tuple[dict[str, str], dict[str, str]]:
    res = obj["spec"]["containers"][index]["resources"]
    return res["limits"], res["requests"]


async def test_slices_and_partitions_fold_into_units(tmp_path: Path) -> None:
    async with webhooks(tmp_path) as hooks:
        # 25 % of a card: 400,000 units in limits and requests, cores defaulted to 100.
        answer = await hooks.call(MUTATE_PATH, pod(container("c", _slice(memory_percentage="25"))))
        paths = {op["path"] for op in patch_of(answer)}
        assert "/spec/containers/0/resources/limits/nvidia.com~1gpu.sliced.units" in paths
        mutated, verdict = await hooks.admit(pod(container("c", _slice(memory_percentage="25"))))
        assert verdict == {"uid": verdict["uid"], "allowed": True}
        for side in _resources(mutated):
            assert side[f"{NV}.sliced.units"] == "400000"
            assert side[f"{NV}.sliced.cores-percentage"] == "100"
        # A client's own units are overwritten; its own cores budget is kept.
        forged = _slice(memory_percentage="50", cores_percentage="40", units="1600000")
        mutated, verdict = await hooks.admit(pod(container("c", forged)))
        assert verdict["allowed"] is True
        for side in _resources(mutated):
            assert (side[f"{NV}.sliced.units"], side[f"{NV}.sliced.cores-percentage"]) == (
                "800000",
                "40",
            )
        # MiB on the H200 the node selector names: floor(71885 x 1.6e6 / 143771).
        mutated, verdict = await hooks.admit(
            pod(container("c", _slice(memory_mib="71885")), **H200_NODE)
        )
        assert verdict["allowed"] is True
        assert _resources(mutated)[0][f"{NV}.sliced.units"] == "799994"
        # ... or the group a required affinity term selects.
        term = {
            "matchExpressions": [
                {"key": f"{GROUP}nvidia-h200", "operator": "In", "values": ["true"]}
            ]
        }
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
        mutated, verdict = await hooks.admit(
            pod(container("c", _slice(memory_mib="143771")), affinity=affinity)
        )
        assert (
            verdict["allowed"] is True and _resources(mutated)[1][f"{NV}.sliced.units"] == "1600000"
        )
        # A MIG profile folds its memory on its card: 40448 MiB of 81559 MiB.
        mig = {f"{NV}.partitioned": "1", f"{NV}.partitioned.mig-3g.40gb": "1"}
        mutated, verdict = await hooks.admit(pod(container("c", mig)))
        assert verdict["allowed"] is True
        assert _resources(mutated) == ({**mig, f"{NV}.partitioned.units": "793496"},) * 2


async def test_a_lying_node_does_not_change_the_vram_of_the_group(tmp_path: Path) -> None:
    """One node claims -143771 MiB (out of bounds: dropped), another 1 MiB (in bounds: outvoted
    by the two honest H200 nodes); a 71885 MiB request still folds on 143771 MiB."""
    a10 = msgspec.structs.replace(H200[0], id="nvidia-a10", name="NVIDIA A10", memory=22_000)
    l4 = msgspec.structs.replace(H200[0], id="nvidia-l4", name="NVIDIA L4", memory=23_034)
    async with webhooks(tmp_path) as hooks:
        await _publish(hooks.bus, [
            events.DevicesEvent(node="h200-b", ts=T0, groups=H200),
            events.DevicesEvent(node="garbage", ts=T0, groups=(
                msgspec.structs.replace(H200[0], memory=-143771),)),
            events.DevicesEvent(node="liar", ts=T0, groups=(
                msgspec.structs.replace(H200[0], memory=1),)),
            events.DevicesEvent(node="l4-a", ts=T0, groups=(l4,)),
            events.DevicesEvent(node="l4-b", ts=T0, groups=(msgspec.structs.replace(l4, memory=5),)),
            events.DevicesEvent(node="marker", ts=T0, groups=(a10,)),  # published last
        ])  # fmt: skip
        a10_pod = pod(container("c", _slice(memory_mib="22000")), nodeSelector={
            f"{GROUP}nvidia-a10": "true"})  # fmt: skip

        async def marker_known() -> bool:
            _, verdict = await hooks.admit(a10_pod)
            return bool(verdict["allowed"])

        await eventually(marker_known, timeout_s=20)  # the liars were applied before it
        mutated, verdict = await hooks.admit(
            pod(container("c", _slice(memory_mib="71885")), **H200_NODE)
        )
        disputed = await hooks.refused(pod(container("c", _slice(memory_mib="1000")), nodeSelector={
            f"{GROUP}nvidia-l4": "true"}))  # fmt: skip

    assert verdict["allowed"] is True, verdict
    assert _resources(mutated)[0][f"{NV}.sliced.units"] == "799994"
    # two nodes, two sizes, no majority: neither caps the other, MiB cannot be folded
    assert disputed.endswith(
        'Invalid value: "1000": cannot fold MiB into units: the nodes of nvidia-l4 do not agree '
        "on its VRAM (no majority reports one size); or request "
        "nvidia.com/gpu.sliced.memory-percentage instead"
    ), disputed


async def test_shared_requests_are_pinned_to_nodes_with_enough_cards(tmp_path: Path) -> None:
    def pins(obj: Any) -> list[list[tuple[str, str, list[str] | None]]]:
        terms = obj["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        return [
            [
                (e["key"].removeprefix(GROUP), e["operator"], e.get("values"))
                for e in t["matchExpressions"]
            ]
            for t in terms["nodeSelectorTerms"]
        ]

    shared = container("c", {f"{NV}.shared": "2"})
    async with webhooks(tmp_path) as hooks:
        mutated, verdict = await hooks.admit(pod(shared))  # every known NVIDIA group
        assert verdict["allowed"] is True
        assert pins(mutated) == [
            [("nvidia-h100-80gb-hbm3.count", "Gt", ["1"])],
            [("nvidia-h200.count", "Gt", ["1"])],
        ]
        mutated, verdict = await hooks.admit(pod(shared, **H200_NODE))  # the named group only
        assert verdict["allowed"] is True and pins(mutated) == [
            [("nvidia-h200.count", "Gt", ["1"])]
        ]
        terms = [
            {"matchExpressions": [{"key": f"{GROUP}nvidia-h200", "operator": "Exists"}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
        ]  # fmt: skip
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}},
                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}  # fmt: skip
        mutated, verdict = await hooks.admit(
            pod(container("c", {f"{NV}.shared": "3"}), affinity=affinity)
        )
        assert verdict["allowed"] is True
        assert pins(mutated) == [
            [("nvidia-h200", "Exists", None), ("nvidia-h200.count", "Gt", ["2"])],
            [("zone", "In", ["a"]), ("nvidia-h100-80gb-hbm3.count", "Gt", ["2"])],
            [("zone", "In", ["a"]), ("nvidia-h200.count", "Gt", ["2"])],
        ]
        term = mutated["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["nodeSelectorTerms"][1]["matchFields"] == terms[1]["matchFields"]
        assert "podAntiAffinity" in mutated["spec"]["affinity"]
        # One share of one card needs no pin; nor do whole cards.
        for limits in ({f"{NV}.shared": "1"}, {NV: "2"}):
            answer = await hooks.call(MUTATE_PATH, pod(container("c", limits)))
            assert answer == {"uid": answer["uid"], "allowed": True}


async def test_pods_without_our_resources_pass_untouched(tmp_path: Path) -> None:
    plain = pod(container("c", {"cpu": "1", "memory": "1Gi"}))
    sidecar = container("sshd", {"device.gpustack.ai/nvidia.visibility": "1"})
    async with webhooks(tmp_path, groups=False) as hooks:
        for obj in (
            plain,
            pod(container("c")),
            pod(sidecar),
            pod(container("c", {"nvidia.com/gpux": "1"})),
        ):
            for path in (MUTATE_PATH, VALIDATE_PATH):
                answer = await hooks.call(path, obj)
                assert answer == {"uid": answer["uid"], "allowed": True}, (path, obj)
        # The visibility sidecar is outside the families: a slice beside it is still one slicer.
        _, verdict = await hooks.admit(pod(container("c", _slice(memory_percentage="50")), sidecar))
        assert verdict["allowed"] is True
        # A native sidecar without an accelerator is fine beside an app container with one.
        log_shipper = container("log", {"cpu": "100m"}, restartPolicy="Always")
        _, verdict = await hooks.admit(pod(container("c", {NV: "1"}), init=[log_shipper]))
        assert verdict["allowed"] is True


REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("rule 1: two families",
     pod(container("a", {NV: "1"}), container("b", _slice(memory_percentage="50"))),
     "spec: Forbidden: a Pod may request only one accelerator family, found [exclusive sliced]"),
    ("rule 1: two container groups",
     pod(container("main", {NV: "1"}), init=[container("warmup", {NV: "1"})]),
     ("spec.initContainers: Forbidden: a Pod's accelerator requests must all sit in one container "
     "group; spec.initContainers must give up its request, because its devices are held for the "
     "Pod's whole life while the scheduler charges the Pod only once")),
    ("rule 2: more than one card",
     pod(container("c", {**_slice(memory_percentage="50"), f"{NV}.sliced": "2"})),
     (f'{LIMITS}[{NV}.sliced]: Invalid value: "2": a logical slice request is always a single '
     "accelerator; multi-accelerator logical slicing is not supported yet")),
    ("rule 2: no slice count",
     pod(container("c", {f"{NV}.sliced.memory-percentage": "50"})),
     f"{LIMITS}[{NV}.sliced]: Required value: a logical slice is requested with {NV}.sliced: 1"),
    ("rule 2: no memory budget",
     pod(container("c", _slice())),
     (f"{LIMITS}: Required value: a {NV}.sliced request must set {NV}.sliced.memory-percentage or "
     f"{NV}.sliced.memory-mib")),
    ("rule 2: two memory budgets",
     pod(container("c", _slice(memory_percentage="50", memory_mib="1000")), **H200_NODE),
     f"{LIMITS}: Forbidden: cannot set both {NV}.sliced.memory-percentage and {NV}.sliced.memory-mib"),
    ("rule 2: percentage above 100",
     pod(container("c", _slice(memory_percentage="150"))),
     f'{LIMITS}[{NV}.sliced.memory-percentage]: Invalid value: "150": must be within (0, 100]'),
    ("rule 2: percentage 0",
     pod(container("c", _slice(memory_percentage="0"))),
     f'{LIMITS}[{NV}.sliced.memory-percentage]: Invalid value: "0": must be within (0, 100]'),
    ("rule 2: cores above 100",
     pod(container("c", _slice(memory_percentage="10", cores_percentage="101"))),
     f'{LIMITS}[{NV}.sliced.cores-percentage]: Invalid value: "101": must be within (0, 100]'),
    ("rule 2: a fraction of a percent",
     pod(container("c", _slice(memory_percentage="50.5"))),
     f'{LIMITS}[{NV}.sliced.memory-percentage]: Invalid value: "50.5": must be an integer'),
    ("rule 2: no MiB",
     pod(container("c", _slice(memory_mib="0")), **H200_NODE),
     f'{LIMITS}[{NV}.sliced.memory-mib]: Invalid value: "0": must be greater than 0'),
    ("rule 2: more MiB than the card",
     pod(container("c", _slice(memory_mib="143772")), **H200_NODE),
     (f'{LIMITS}[{NV}.sliced.memory-mib]: Invalid value: "143772": must not exceed the per-card '
     "VRAM (143771 MiB)")),
    ("rule 2: MiB with no group named",
     pod(container("c", _slice(memory_mib="20000"))),
     (f'{LIMITS}[{NV}.sliced.memory-mib]: Invalid value: "20000": cannot fold MiB into units: the '
     "card's VRAM is unknown, because the Pod names no known accelerator group; name it with a "
     f'node selector {GROUP}<group>: "true", or request {NV}.sliced.memory-percentage instead')),
    ("rule 2: MiB on groups of different VRAM",
     pod(container("c", _slice(memory_mib="20000")), affinity={"nodeAffinity": {
         "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
             {"matchExpressions": [{"key": f"{GROUP}nvidia-h200", "operator": "Exists"}]},
             {"matchExpressions": [{"key": f"{GROUP}nvidia-h100-80gb-hbm3", "operator": "Exists"}]},
         ]}}}),
     (f'{LIMITS}[{NV}.sliced.memory-mib]: Invalid value: "20000": cannot fold MiB into units: the '
     "named accelerator groups differ in VRAM: nvidia-h200 (143771 MiB), nvidia-h100-80gb-hbm3 "
     f"(81559 MiB); or request {NV}.sliced.memory-percentage instead")),
    ("rule 3: more than one card",
     pod(container("c", {f"{NV}.partitioned": "2", f"{NV}.partitioned.mig-1g.10gb": "1"})),
     (f'{LIMITS}[{NV}.partitioned]: Invalid value: "2": a partition request is always a single '
     "accelerator; request one Pod per instance")),
    ("rule 3: no profile",
     pod(container("c", {f"{NV}.partitioned": "1"})),
     (f"{LIMITS}: Required value: a {NV}.partitioned request must name a profile, e.g. "
     f"{NV}.partitioned.<kind>-<profile>")),
    ("rule 3: a profile the cluster has not",
     pod(container("c", {f"{NV}.partitioned": "1", f"{NV}.partitioned.mig-9g.99gb": "1"})),
     (f'{LIMITS}[{NV}.partitioned.mig-9g.99gb]: Invalid value: "1": no known accelerator group '
     "offers partition profile 9g.99gb")),
    ("rule 4: two profiles",
     pod(container("c", {f"{NV}.partitioned": "1", f"{NV}.partitioned.mig-1g.10gb": "1",
                         f"{NV}.partitioned.mig-3g.40gb": "1"})),
     "spec: Forbidden: a Pod may request only one partition profile, found [1g.10gb 3g.40gb]"),
    ("rule 5: two instances of a profile",
     pod(container("c", {f"{NV}.partitioned": "1", f"{NV}.partitioned.mig-3g.40gb": "2"})),
     (f'{LIMITS}[{NV}.partitioned.mig-3g.40gb]: Invalid value: "2": a partition profile request '
     "must be exactly 1 instance")),
    ("rule 6: two slicers",
     pod(container("a", _slice(memory_percentage="50")), container("b", _slice(memory_percentage="50"))),
     "spec: Forbidden: at most one container may request a slicing family, found 2"),
    ("rule 7: a native sidecar",
     pod(container("main"), init=[container("log", {NV: "1"}, restartPolicy="Always")]),
     ("spec.initContainers[0].resources.limits: Forbidden: a restartable init container (a native "
     "sidecar) may not request an accelerator; move the request to an app container")),
    ("shared: no group to pin",
     pod(container("c", {"amd.com/gpu.shared": "2"})),
     ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: Required value: "
     "a amd.com/gpu.shared request of 2 needs nodes with at least 2 cards, so every required "
     f"node-affinity term must carry {GROUP}<group>.count Gt 1; the mutating webhook adds it for "
     "the accelerator groups it knows, and knows none here: name it with a node selector "
     f'{GROUP}<group>: "true"')),
]  # fmt: skip


async def test_every_rule_refuses_with_its_message(tmp_path: Path) -> None:
    async with webhooks(tmp_path) as hooks:
        for name, obj, message in REFUSALS:
            assert await hooks.refused(obj) == message, name
        # Several broken rules: one message listing them all, as the API server aggregates.
        both = pod(container("a", {NV: "1"}), container("b", {**_slice(memory_percentage="150")}))
        assert await hooks.refused(both) == (
            "[spec: Forbidden: a Pod may request only one accelerator family, found [exclusive "
            f"sliced], spec.containers[1].resources.limits[{NV}.sliced.memory-percentage]: Invalid "
            'value: "150": must be within (0, 100]]'
        )


async def test_units_are_checked_after_the_mutation(tmp_path: Path) -> None:
    async with webhooks(tmp_path) as hooks:
        unmutated = pod(container("c", _slice(memory_percentage="25")))
        answer = await hooks.call(VALIDATE_PATH, unmutated)
        assert answer["status"]["message"] == (
            f"{LIMITS}[{NV}.sliced.units]: Required value: the mutating webhook sets it to 400000"
        )
        mutated, _ = await hooks.admit(unmutated)
        mutated["spec"]["containers"][0]["resources"]["limits"][f"{NV}.sliced.units"] = "1600k"
        answer = await hooks.call(VALIDATE_PATH, mutated)
        assert answer["status"]["message"] == (
            f'{LIMITS}[{NV}.sliced.units]: Invalid value: "1600k": must be 400000, the memory '
            "budget folded into units; never set it by hand"
        )
        mutated["spec"]["containers"][0]["resources"]["limits"][f"{NV}.sliced.units"] = "400k"
        assert (await hooks.call(VALIDATE_PATH, mutated))["allowed"] is True  # canonical form


async def test_malformed_bodies_are_refused_and_other_objects_pass(tmp_path: Path) -> None:
    good = review(pod(container("c", {NV: "1"})))
    bad: list[tuple[bytes | dict[str, Any], int]] = [
        (b"", 400), (b"not json", 400), (b"[]", 400), (b'{"kind": "AdmissionReview"}', 400),
        ({**good, "apiVersion": "admission.k8s.io/v1beta1"}, 400),
        ({**good, "kind": "Status"}, 400),
        ({k: v for k, v in good.items() if k != "request"}, 400),
        ({**good, "request": {**good["request"], "uid": ""}}, 400),
        ({**good, "request": {**good["request"], "object": {"spec": {"containers": "x"}}}}, 400),
        ({**good, "request": {**good["request"], "object": None}}, 400),
        # The object is not the resource the review names (another kind, another version).
        ({**good, "request": {**good["request"], "object": {
            "apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}}}}, 400),
        ({**good, "request": {**good["request"], "object": {
            **good["request"]["object"], "apiVersion": "apps/v1"}}}, 400),
        ({**good, "request": {**good["request"], "operation": "UPDATE", "object": {
            "apiVersion": "v1", "kind": "ConfigMap"}}}, 400),
        (b"{" + b" " * (4 * 1024 * 1024) + b"}", 413),
    ]  # fmt: skip
    async with webhooks(tmp_path, groups=False) as hooks:
        for path in (MUTATE_PATH, VALIDATE_PATH):
            for body, status in bad:
                got, text = await hooks.post(path, body)
                assert got == status, (path, body if isinstance(body, dict) else body[:40], text)
            async with hooks.session.get(hooks.url + path, ssl=False) as r:
                assert r.status == 405
            for other in (
                review({"kind": "Deployment", "spec": {}}, kind="Deployment"),
                review(pod(container("c", {f"{NV}.sliced": "5"})), operation="UPDATE"),
                {**good, "request": {**good["request"], "subResource": "status"}},
            ):
                status, answer = await hooks.post(path, other)
                uid = other["request"]["uid"]
                assert (status, answer["response"]) == (200, {"uid": uid, "allowed": True})


async def test_with_a_cluster_the_configurations_carry_the_ca_that_verifies_the_worker(
    tmp_path: Path,
) -> None:
    """The worker makes its CA Secret, serves a certificate from it for the Service's names and
    applies both configurations with that CA; a second worker reuses the CA, not a new one."""
    hooks_settings = WebhookSettings(service="gpustack-operator-worker", namespace="ns", port=31443)
    async with nats_server(tmp_path) as server, fake_api() as (fake, api_url):
        settings = running.WorkerSettings(
            concurrency=16,
            bus=settings_for(server), kube=KubeSettings.for_tests(api_url, backoff_s=0.01),
            https=HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
            webhooks=hooks_settings,
        )  # fmt: skip
        bundles = []
        for _ in range(2):
            async with anyio.create_task_group() as tg:
                worker: running.Worker = await tg.start(running.run, settings)
                configs = [
                    fake.get(f"apis/admissionregistration.k8s.io/v1/{kind}", name)
                    for kind, name in (
                        ("mutatingwebhookconfigurations", "gpustack-worker-mutation"),
                        ("validatingwebhookconfigurations", "gpustack-worker-validation"),
                    )
                ]
                (bundle,) = {c["webhooks"][0]["clientConfig"]["caBundle"] for c in configs}
                bundles.append(bundle)
                for config, path in zip(configs, (MUTATE_PATH, VALIDATE_PATH), strict=True):
                    (hook,) = config["webhooks"]
                    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
                    assert hook["clientConfig"]["service"] == {
                        "namespace": "ns", "name": "gpustack-operator-worker", "path": path,
                        "port": 31443,
                    }  # fmt: skip
                # The API server dials the Service by name and verifies against the bundle.
                context = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
                port = worker.url.rsplit(":", 1)[1]
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(
                        f"https://127.0.0.1:{port}{VALIDATE_PATH}",
                        data=json.dumps(review(pod(container("c", {NV: "1"})))).encode(),
                        ssl=context,
                        server_hostname="gpustack-operator-worker.ns.svc",
                    ) as r,
                ):
                    assert r.status == 200 and (await r.json())["response"]["allowed"] is True
                tg.cancel_scope.cancel()
        assert bundles[0] == bundles[1]
        secret = fake.get("api/v1/secrets", "gpustack-operator-worker-webhook-ca", "ns")
        assert base64.b64decode(secret["data"]["tls.crt"]) == base64.b64decode(bundles[0])
