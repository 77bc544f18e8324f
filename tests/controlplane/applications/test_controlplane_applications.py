"""The applications the worker installs: pinned manifests served over real HTTP on loopback (or
read from a mirror directory), verified, configured, applied to the stateful fake API with
server-side apply under their own field managers, upgraded and pruned."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import yaml
from aiohttp import web
from controlplane_fakeapi import FakeApi, fake_api
from test_controlplane_extension_api import auth_configmap
from test_controlplane_nms_e2e import settings, until

from bus.testing import nats_server, settings_for
from controlplane import applications
from controlplane.admission.certificates import new_authority
from controlplane.applications import agents, installing, pins, planning
from controlplane.applications.installing import Outcome
from controlplane.applications.pins import Pin
from controlplane.chain import kueueconfig
from controlplane.k8s.client import KubeSettings, open_client
from controlplane.worker import running
from kit.version import package_version

pytestmark = pytest.mark.anyio

NS = "gpustack-system"
CM = "api/v1/configmaps"
DEPLOYMENTS = "apis/apps/v1/deployments"
CRDS = "apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def _doc(kind: str, name: str, namespace: str | None = None, **rest: Any) -> dict[str, Any]:
    api = {"Deployment": "apps/v1", "CustomResourceDefinition": "apiextensions.k8s.io/v1"}
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": api.get(kind, "v1"), "kind": kind, "metadata": meta, **rest}


def kueue_manifest(version: str, *, extra: bool = True) -> bytes:
    docs = [
        _doc("Namespace", "kueue-system"),
        _doc("CustomResourceDefinition", "clusterqueues.kueue.x-k8s.io", spec={"group": "k"}),
        _doc("ConfigMap", "kueue-manager-config", "kueue-system",
             data={kueueconfig.CONFIG_KEY: "apiVersion: config.kueue.x-k8s.io/v1beta2\n"}),
        _doc("Deployment", "kueue-controller-manager", "kueue-system",
             spec={"template": {"metadata": {"labels": {"v": version}}}}),
    ]  # fmt: skip
    if extra:
        docs.append(_doc("ServiceAccount", "kueue-old", "kueue-system"))
    return yaml.safe_dump_all(docs).encode()


def nfd_manifest() -> bytes:
    conf = "#core:\n#  sleepInterval: 60s\n"  # upstream ships it all commented out
    docs = [
        _doc("Namespace", "node-feature-discovery"),
        _doc("ConfigMap", "nfd-worker-conf", "node-feature-discovery",
             data={"nfd-worker.conf": conf}),
        _doc("Deployment", "nfd-master", "node-feature-discovery"),
    ]  # fmt: skip
    return "---\n".join(yaml.safe_dump(d) for d in docs).encode() + b"---\n"


def pin(name: str, version: str, data: bytes, base: str = "") -> Pin:
    url = f"{base}/{name}/{version}/manifests.yaml" if base else None
    return Pin(name=name, version=version, url=url, sha256=hashlib.sha256(data).hexdigest())


@asynccontextmanager
async def manifest_server(files: dict[str, bytes]) -> AsyncIterator[str]:
    """A real HTTP server on a free loopback port serving ``files`` by path (404 otherwise)."""

    async def serve(request: web.Request) -> web.Response:
        data = files.get(request.path)
        return web.Response(status=404) if data is None else web.Response(body=data)

    app = web.Application()
    app.router.add_get("/{tail:.*}", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


IMAGE = "registry.example/gpustack-operator:9.9.9"
"""The worker's own image in these tests: the agents it installs must run it."""


async def install(
    url: str,
    enabled: set[str],
    table: dict[str, Pin],
    mirror: str | None = None,
    manufacturers: tuple[str, ...] = (),
) -> dict[str, Outcome]:
    catalog = installing.Catalog(
        namespace=NS, pins=table, own=applications.own(IMAGE, manufacturers), mirror=mirror
    )
    async with open_client(KubeSettings.for_tests(url)) as api:
        return await installing.install(api, frozenset(enabled), catalog)


def status(fake: FakeApi) -> dict[str, Any]:
    return json.loads(fake.get(CM, "gpustack-applications", NS)["data"]["status.json"])  # type: ignore[no-any-return]


async def test_pinned_manifests_are_fetched_configured_and_applied_under_their_managers() -> None:
    kueue, nfd = kueue_manifest("v1"), nfd_manifest()
    files = {"/kueue/v1/manifests.yaml": kueue, "/node-feature-discovery/v9/manifests.yaml": nfd}
    async with manifest_server(files) as base, fake_api() as (fake, url):
        table = {"kueue": pin("kueue", "v1", kueue, base),
                 "node-feature-discovery": pin("node-feature-discovery", "v9", nfd, base)}  # fmt: skip
        outcomes = await install(url, {"kueue", "node-feature-discovery", "model-manager"}, table)
        deploy = fake.get(DEPLOYMENTS, "kueue-controller-manager", "kueue-system")
        managers = fake.field_managers[(DEPLOYMENTS, "kueue-system", "kueue-controller-manager")]
        kconf = fake.get(CM, "kueue-manager-config", "kueue-system")["data"]
        nconf = fake.get(CM, "nfd-worker-conf", "node-feature-discovery")["data"]
        driver = fake.get("apis/storage.k8s.io/v1/csidrivers", applications.DRIVER)
        recorded = status(fake)
    assert {a: o.state for a, o in outcomes.items()} == dict.fromkeys(
        ("kueue", "node-feature-discovery", "model-manager"), "installed"
    )
    assert managers == {"gpustack-operator-kueue"}
    assert deploy["metadata"]["labels"]["applications.gpustack.ai/name"] == "kueue"
    assert yaml.safe_load(kconf[kueueconfig.CONFIG_KEY]) == kueueconfig.configuration()
    worker_conf = yaml.safe_load(nconf["nfd-worker.conf"])
    assert worker_conf["sources"]["pci"]["deviceLabelFields"] == ["vendor"]
    assert driver["metadata"]["labels"]["applications.gpustack.ai/name"] == "model-manager"
    assert recorded["kueue"] == {"state": "installed", "version": "v1", "message": ""}


async def test_a_manifest_with_the_wrong_checksum_is_refused_and_nothing_is_applied() -> None:
    kueue = kueue_manifest("v1")
    async with manifest_server({"/kueue/v1/manifests.yaml": kueue}) as base, fake_api() as (
        fake, url
    ):  # fmt: skip
        good = pin("kueue", "v1", kueue, base)
        bad = msgspec.structs.replace(good, sha256=hashlib.sha256(b"other").hexdigest())
        outcomes = await install(url, {"kueue"}, {"kueue": bad})
        applied = [k for k in fake.objects if k[0] != CM or k[2] != "gpustack-applications"]
        recorded = status(fake)
    assert outcomes["kueue"].state == "checksum-mismatch"
    assert applied == []
    assert recorded["kueue"]["state"] == "checksum-mismatch"
    assert "is not the pinned" in recorded["kueue"]["message"]


async def test_a_new_pin_upgrades_and_prunes_what_the_new_release_dropped() -> None:
    v1, v2 = kueue_manifest("v1"), kueue_manifest("v2", extra=False)
    files = {"/kueue/v1/manifests.yaml": v1, "/kueue/v2/manifests.yaml": v2}
    async with manifest_server(files) as base, fake_api() as (fake, url):
        await install(url, {"kueue"}, {"kueue": pin("kueue", "v1", v1, base)})
        had_old = fake.get("api/v1/serviceaccounts", "kueue-old", "kueue-system") is not None
        outcomes = await install(url, {"kueue"}, {"kueue": pin("kueue", "v2", v2, base)})
        deploy = fake.get(DEPLOYMENTS, "kueue-controller-manager", "kueue-system")
        old_gone = ("api/v1/serviceaccounts", "kueue-system", "kueue-old") not in fake.objects
    assert had_old and old_gone
    assert outcomes["kueue"].version == "v2"
    assert deploy["spec"]["template"]["metadata"]["labels"]["v"] == "v2"
    assert deploy["metadata"]["annotations"]["applications.gpustack.ai/version"] == "v2"


async def test_disabling_an_application_prunes_only_objects_still_carrying_its_label() -> None:
    kueue = kueue_manifest("v1")
    async with manifest_server({"/kueue/v1/manifests.yaml": kueue}) as base, fake_api() as (
        fake, url
    ):  # fmt: skip
        table = {"kueue": pin("kueue", "v1", kueue, base)}
        await install(url, {"kueue", "model-manager"}, table)
        # Someone took the CRD over (relabelled it): pruning must leave it alone.
        crd = fake.get(CRDS, "clusterqueues.kueue.x-k8s.io")
        crd["metadata"]["labels"] = {"owner": "someone"}
        outcomes = await install(url, {"model-manager"}, table)
        left = {k for k in fake.objects if k[1] == "kueue-system" or k[2] == "kueue-system"}
        crd_kept = (CRDS, None, "clusterqueues.kueue.x-k8s.io") in fake.objects
        driver_kept = any(k[0].endswith("csidrivers") for k in fake.objects)
        inventory = json.loads(fake.get(CM, "gpustack-applications", NS)["data"]["inventory.json"])
    assert outcomes["kueue"].state == "pruned"
    assert left == set() and crd_kept and driver_kept
    assert set(inventory) == {"model-manager"}


async def test_a_mirror_directory_serves_air_gapped_clusters_and_is_checked_too(
    tmp_path: Path,
) -> None:
    kueue = kueue_manifest("v1")
    (tmp_path / "kueue" / "v1").mkdir(parents=True)
    (tmp_path / "kueue" / "v1" / "manifests.yaml").write_bytes(kueue)
    # No URL at all: only the mirror can serve it.
    table = {"kueue": msgspec.structs.replace(pin("kueue", "v1", kueue), url=None)}
    async with fake_api() as (fake, url):
        outcomes = await install(url, {"kueue"}, table, mirror=str(tmp_path))
        installed = (DEPLOYMENTS, "kueue-system", "kueue-controller-manager") in fake.objects
        (tmp_path / "kueue" / "v1" / "manifests.yaml").write_bytes(kueue + b"# tampered\n")
        again = await install(url, {"kueue"}, table, mirror=str(tmp_path))
        still = (DEPLOYMENTS, "kueue-system", "kueue-controller-manager") in fake.objects
        without = await install(url, {"kueue"}, table)
    assert outcomes["kueue"].state == "installed" and installed
    # A tampered mirror is refused, and a refusal never uninstalls what was there.
    assert again["kueue"].state == "checksum-mismatch" and still
    assert without["kueue"].state == "no-source"
    assert "--applications-mirror as <mirror>/kueue/v1/manifests.yaml" in without["kueue"].message


async def test_the_shipped_table_refuses_what_it_cannot_verify() -> None:
    async with manifest_server({}) as base, fake_api() as (_, url):
        # Every upstream pin, served by a mirror that has nothing: refused with a reason.
        outcomes = await install(url, set(pins.PINS), pins.PINS, mirror=base)
    for name, p in pins.PINS.items():
        assert p.sha256 is None or len(p.sha256) == 64, name
        # Refused before anything is fetched when no checksum is pinned.
        assert outcomes[name].state == ("unpinned" if p.sha256 is None else "fetch-failed")
        if p.sha256 is None:  # the refusal says what to do: the source, the pin, the mirror
            said = outcomes[name].message
            assert (p.url or p.build) and (p.url or p.build) in said, said
            for needed in ("`sha256sum`", "controlplane/applications/pins.py",
                           f"<mirror>/{name}/{p.version}/{p.file}",
                           f"{name}_{p.version}_{p.file}", "--disable-applications"):  # fmt: skip
                assert needed in said, (name, needed)
    assert set(pins.PINS) | {"device-manager", "model-manager"} == set(applications.NAMES)


def test_the_plan_keeps_a_failed_application_and_orders_namespaces_and_crds() -> None:
    ns, crd = _doc("Namespace", "a"), _doc("CustomResourceDefinition", "x.y")
    dep = _doc("Deployment", "d", "a")
    old = planning.Entry(version="v0", objects=(planning.identity(dep),))
    p = planning.plan({"kueue": ("v1", [dep, crd, ns])}, {"nfd": old, "kueue": old},
                      failed={"nfd"})  # fmt: skip
    assert [o["kind"] for _, o in p.apply] == [
        "Namespace",
        "CustomResourceDefinition",
        "Deployment",
    ]
    assert p.prune == ()
    assert p.inventory["nfd"] == old
    gone = planning.plan({}, {"kueue": planning.Entry(version="v1", objects=tuple(
        planning.identity(o) for o in (ns, crd, dep)))})  # fmt: skip
    assert [i[1] for _, i in gone.prune] == ["Deployment", "CustomResourceDefinition", "Namespace"]
    assert gone.inventory == {}


def test_plural_names_follow_the_kubernetes_convention() -> None:
    plural = {k: installing.resource_of("v1", k, False).plural for k in (
        "NetworkPolicy", "Ingress", "Endpoints", "ServiceAccount", "PriorityClass", "Gateway"
    )}  # fmt: skip
    assert plural == {
        "NetworkPolicy": "networkpolicies", "Ingress": "ingresses", "Endpoints": "endpoints",
        "ServiceAccount": "serviceaccounts", "PriorityClass": "priorityclasses",
        "Gateway": "gateways",
    }  # fmt: skip


async def test_only_the_lease_holder_installs(tmp_path: Path) -> None:
    inventory = (CM, "ns", installing.INVENTORY)
    leases = "apis/coordination.k8s.io/v1/leases"
    held = {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"holderIdentity": "another-replica", "leaseDurationSeconds": 3600,
                 "renewTime": datetime.now(UTC).isoformat()},
    }  # fmt: skip
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        fake.put_object(CM, auth_configmap(new_authority()[0]))
        fake.put_object(leases, held)  # another replica leads
        conf = msgspec.structs.replace(
            settings(settings_for(server), url), namespace="ns",
            applications=frozenset({"model-manager"}),
        )  # fmt: skip
        worker = await tg.start(running.run, conf)
        await until(lambda: fake.reads[(leases, "w")] >= 3)  # it tried, and follows
        following = not worker.leading and inventory not in fake.objects
        fake.remove(leases, "w", "ns")  # the other replica is gone: this one takes over
        await until(lambda: inventory in fake.objects)
        driver = any(k[0].endswith("csidrivers") for k in fake.objects)
        tg.cancel_scope.cancel()
    assert following and driver


async def test_a_configmap_mirror_is_read_through_the_api_and_checked() -> None:
    kueue = kueue_manifest("v1")
    table = {"kueue": msgspec.structs.replace(pin("kueue", "v1", kueue), url=None)}
    mirror = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "mirror", "namespace": NS},
              "binaryData": {"kueue_v1_manifests.yaml": base64.b64encode(kueue).decode()}}  # fmt: skip
    async with fake_api() as (fake, url):
        fake.put_object(CM, mirror)
        outcomes = await install(url, {"kueue"}, table, mirror="configmap:mirror")
        installed = (DEPLOYMENTS, "kueue-system", "kueue-controller-manager") in fake.objects
        missing = await install(url, {"kueue"}, table, mirror="configmap:absent")
    assert outcomes["kueue"].state == "installed" and installed
    assert missing["kueue"].state == "fetch-failed"


async def test_a_failed_apply_is_reported_and_what_it_applied_is_still_pruned_later() -> None:
    kueue = kueue_manifest("v1")
    async with manifest_server({"/kueue/v1/manifests.yaml": kueue}) as base, fake_api() as (
        fake, url
    ):  # fmt: skip
        table = {"kueue": pin("kueue", "v1", kueue, base)}
        # The namespace and the CRD go in first; then the API refuses the ConfigMap.
        fake.fail_next("PATCH", "/api/v1/namespaces/kueue-system/configmaps", 422)
        failed = await install(url, {"kueue"}, table)
        half = {k for k in fake.objects if "kueue" in (k[1] or "") + k[2]}
        recorded = status(fake)["kueue"]
        pruned = await install(url, set(), table)
        left = {k for k in fake.objects if "kueue" in (k[1] or "") + k[2]}
    assert failed["kueue"].state == "apply-failed" and recorded["state"] == "apply-failed"
    assert (CRDS, None, "clusterqueues.kueue.x-k8s.io") in half
    assert pruned["kueue"].state == "pruned" and left == set()


DAEMONSETS = "apis/apps/v1/daemonsets"


async def test_the_agents_run_the_workers_image_and_follow_manufacturer_and_disable() -> None:
    async with fake_api() as (fake, url):
        everything = await install(url, {"device-manager", "model-manager"}, {})
        nvidia = fake.get(DAEMONSETS, "gpustack-operator-device-manager-nvidia", NS)
        managers = fake.field_managers[(DAEMONSETS, NS, "gpustack-operator-device-manager-nvidia")]
        all_sets = {k[2] for k in fake.objects if k[0] == DAEMONSETS}
        await install(url, {"device-manager", "model-manager"}, {}, manufacturers=("nvidia",))
        nvidia_only = {k[2] for k in fake.objects if k[0] == DAEMONSETS}
        pruned = await install(url, {"model-manager"}, {})
        left = {k[2] for k in fake.objects if k[0] == DAEMONSETS}
        driver = fake.get("apis/storage.k8s.io/v1/csidrivers", applications.DRIVER)
    assert {a: o.state for a, o in everything.items()} == {
        "device-manager": "installed",
        "model-manager": "installed",
    }
    assert nvidia["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert managers == {"gpustack-operator-device-manager"}
    assert len(all_sets) == 10  # nine manufacturers' agents and the model agent
    assert nvidia_only == {
        "gpustack-operator-device-manager-nvidia",
        "gpustack-operator-model-manager",
    }
    assert pruned["device-manager"].state == "pruned"
    assert left == {"gpustack-operator-model-manager"}
    assert driver["metadata"]["labels"]["applications.gpustack.ai/name"] == "model-manager"


async def test_the_agents_image_is_the_one_the_workers_pod_runs() -> None:
    pod = _doc("Pod", "worker-0", NS, spec={"containers": [
        {"name": "gateway", "image": "other:1"}, {"name": "worker", "image": IMAGE}]})  # fmt: skip
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        fake.put_object("api/v1/pods", pod)
        found = await agents.own_image(api, NS, "worker-0")
        unknown = await agents.own_image(api, NS, "gone")
        unnamed = await agents.own_image(api, NS, None)
    assert found == IMAGE
    assert unknown == unnamed == f"gpustack/gpustack-operator:{package_version()}"
