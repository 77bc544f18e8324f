"""``worker.gpustack.ai/v1`` served by a running worker: against the stateful fake API (the
worker's informers read it) with the real ``kubectl``, kubernetes-asyncio's client and plain
HTTPS, and without a cluster (``--kubeconfig=none``) from the bus ledger.

What GPUStack's server and gateway do is done here as they do it: the readiness GET of the
APIService, a ``limit=500&resourceVersion=0`` list, then a watch from the list's version with
``allowWatchBookmarks``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from controlplane_fakeapi import fake_api, node
from test_controlplane_extension_api import Cluster, auth_configmap, client_context
from test_controlplane_nms_e2e import publish, settings

from bus import events
from bus.devices import DeviceGroup
from bus.testing import eventually, nats_server, settings_for
from controlplane.admission.certificates import new_authority
from controlplane.admission.webhooks import WebhookSettings
from controlplane.worker import running

pytestmark = pytest.mark.anyio
HERE = Path(__file__).parents[1]
V1 = "/apis/worker.gpustack.ai/v1"
STORED = "apis/worker.gpustack.ai/v1alpha1"
GROUP = "worker.gpustack.ai"
DIGEST = "sha256:" + "ab" * 32
TOKEN = {"Authorization": "Bearer dana-token"}


def view(once: int, remaining: int, capacity: int) -> dict[str, int]:
    return {"onceMaxRequest": once, "remaining": remaining, "capacity": capacity}


def instance_type(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1", "kind": "InstanceType", "metadata": {"name": name},
        "spec": {"acceleratorGroup": "nvidia-h200", "os": "linux", "arch": "amd64",
                 "unit": 1600000, "product": "NVIDIA H200"},
        "status": {"accelerator": view(8, 6, 8), "acceleratorShared": view(8, 70, 80),
                   "acceleratorSliced": view(100, 650, 800),
                   "acceleratorPartitioned": view(0, 0, 0), "entrance": "gpustack-fnv64-1"},
    }  # fmt: skip


def grants(who: str = "team-d") -> set[Any]:
    resources = ("devices", "nodemodelstores", "modelartifacts", "instancetypes",
                 "instancetypeflavors", "modelartifacts/progress", "settings")  # fmt: skip
    verbs = ("get", "list", "watch", "delete")
    return {(who, verb, g, r) for verb in verbs for r in resources for g in (GROUP, "gpustack.ai")}


@asynccontextmanager
async def cluster(
    tmp_path: Path, hold: str | None = None, **overrides: Any
) -> AsyncIterator[tuple[Cluster, Any]]:
    """A worker on the fake API and a real nats-server; ``hold``: a path prefix whose first GET
    waits until the test releases it (the Hold is yielded)."""
    ca = new_authority()
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        fake.put_object("api/v1/configmaps", auth_configmap(ca[0]))
        fake.put_object("api/v1/nodes", node("n1"))
        fake.user_token("dana-token", {"username": "dana", "groups": ["team-d"]})
        fake.resource_grants |= grants()
        held = fake.hold("GET", hold) if hold else None
        bus = settings_for(server)
        conf = msgspec.structs.replace(settings(bus, url), namespace="ns", **overrides)
        worker = await tg.start(running.run, conf)
        yield Cluster(fake, worker.url, bus, worker, ca), held
        tg.cancel_scope.cancel()


async def served(http: aiohttp.ClientSession, c: Cluster, tmp_path: Path) -> None:
    async def up() -> bool:
        r = await http.get(c.url + V1, ssl=client_context(tmp_path, None), headers=TOKEN)
        return r.status == 200

    await eventually(up, timeout_s=40)


def kubeconfig(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "w",
        "clusters": [{"name": "w", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "dana", "user": {"token": "dana-token"}}],
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "dana"}}],
    }))  # fmt: skip
    return config


def kubectl(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
    return subprocess.run(
        [binary, "--kubeconfig", str(config), "--cache-dir", str(config.parent / "cache"), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def h200() -> tuple[DeviceGroup, ...]:
    return msgspec.json.decode(
        (HERE / "controlplane_detect_h200x8.json").read_bytes(), type=tuple[DeviceGroup, ...]
    )


def pairs(status: dict[str, Any], a: str, b: str) -> str:
    views = ("accelerator", "acceleratorShared", "acceleratorSliced", "acceleratorPartitioned")
    return " ".join(f"{status[v].get(a, 0)}/{status[v].get(b, 0)}" for v in views)


async def test_kubectl_gets_devs_and_instancetypes_wide_from_the_informers(tmp_path: Path) -> None:
    """The real kubectl discovers the group (short name ``devs``) and prints the v1 columns of
    what the worker itself wrote from a node's report; every read is served from the
    informers: no GET of a stored object, no list beyond the informers' own reaches the API."""
    async with cluster(tmp_path) as (c, _), aiohttp.ClientSession() as http:
        await publish(c.bus, events.DevicesEvent(node="n1", ts=datetime.now(UTC), groups=h200()))
        await served(http, c, tmp_path)
        config = kubeconfig(tmp_path, c.url)
        ctx = client_context(tmp_path, None)

        async def listed() -> bool:
            r = await http.get(c.url + V1 + "/instancetypes", ssl=ctx, headers=TOKEN)
            items = (await r.json())["items"]
            d = await http.get(c.url + V1 + "/devices/n1", ssl=ctx, headers=TOKEN)
            return d.status == 200 and any("accelerator" in i.get("status", {}) for i in items)

        await eventually(listed, timeout_s=40)
        reads_before = sum(v for k, v in c.fake.reads.items() if k[0].startswith(STORED))
        devs = await anyio.to_thread.run_sync(kubectl, config, "get", "devs")
        wide = await anyio.to_thread.run_sync(kubectl, config, "get", "instancetypes", "-o", "wide")
        one = await anyio.to_thread.run_sync(kubectl, config, "get", "devs", "n1", "-o", "json")
        reads_after = sum(v for k, v in c.fake.reads.items() if k[0].startswith(STORED))
        stored = {k[2]: o for k, o in c.fake.objects.items() if k[0] == f"{STORED}/instancetypes"}
    assert devs.returncode == 0, devs.stderr
    header, row = devs.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "PRODUCT", "ACCELERATORS", "MEMORY", "UNHEALTHY",
                              "ALLOCATED", "AGE"]  # fmt: skip
    assert row.startswith("n1 ") and h200()[0].name in row
    assert wide.returncode == 0, wide.stderr
    lines = {ln.split()[0]: ln for ln in wide.stdout.splitlines()}
    assert lines["NAME"].split() == ["NAME", "ACCELERATOR(EX/SH/SL/PT)", "ENTRANCE",
                                     "CAPACITY", "PRODUCT", "INACTIVE", "AGE"]  # fmt: skip
    accelerated = {n: o for n, o in stored.items() if "accelerator" in o.get("status", {})}
    assert accelerated
    for name, obj in accelerated.items():  # the four views, as onceMaxRequest/remaining
        cells = lines[name].split()
        assert " ".join(cells[1:5]) == pairs(obj["status"], "onceMaxRequest", "remaining")
        assert cells[5] == obj["status"]["entrance"]
        assert cells[6] == str(obj["status"]["accelerator"]["capacity"])
    body = json.loads(one.stdout)
    assert body["apiVersion"] == "worker.gpustack.ai/v1" and body["kind"] == "Devices"
    assert reads_after == reads_before  # kubectl's reads went to the informers, not the API


def labelled(event: dict[str, Any]) -> bool:
    meta = event["object"].get("metadata") or {}
    return meta.get("name") == "t1" and (meta.get("labels") or {}).get("seen") == "yes"


async def test_a_paged_list_at_rv0_then_a_bookmark_watch_as_gpustack_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controlplane.extension.core.server import ApiServer

    defaults = ApiServer.__init__.__kwdefaults__
    assert defaults is not None
    monkeypatch.setitem(defaults, "bookmark_s", 0.2)  # kube-apiserver's is about a minute
    async with cluster(tmp_path) as (c, _), aiohttp.ClientSession() as http:
        for i in range(3):
            c.fake.put_object(f"{STORED}/instancetypes", instance_type(f"t{i}"))
        await served(http, c, tmp_path)
        ctx = client_context(tmp_path, None)
        url = c.url + V1 + "/instancetypes"

        async def three() -> bool:
            r = await http.get(url, ssl=ctx, headers=TOKEN)
            return len((await r.json())["items"]) >= 3

        await eventually(three, timeout_s=40)
        full = await (
            await http.get(url + "?limit=500&resourceVersion=0", ssl=ctx, headers=TOKEN)
        ).json()
        pages = [await (await http.get(url + "?limit=2", ssl=ctx, headers=TOKEN)).json()]
        while token := pages[-1]["metadata"].get("continue"):
            pages.append(await (await http.get(url, params={"limit": "2", "continue": token},
                                               ssl=ctx, headers=TOKEN)).json())  # fmt: skip
        at = pages[0]["metadata"]["resourceVersion"]  # every page is the state at the first's
        exact = await (await http.get(url, params={"resourceVersion": at,
                                                   "resourceVersionMatch": "Exact"},
                                      ssl=ctx, headers=TOKEN)).json()  # fmt: skip
        rv = full["metadata"]["resourceVersion"]
        seen: list[dict[str, Any]] = []
        watch = await http.get(
            url, params={"watch": "true", "allowWatchBookmarks": "true", "resourceVersion": rv,
                         "timeoutSeconds": "10"}, ssl=ctx, headers=TOKEN,
        )  # fmt: skip
        changed = dict(c.fake.get(f"{STORED}/instancetypes", "t1"))
        changed["metadata"] = {**changed["metadata"], "labels": {"seen": "yes"}}
        c.fake.put_object(f"{STORED}/instancetypes", changed)
        async for line in watch.content:
            seen.append(json.loads(line))
            if any(labelled(e) for e in seen) and seen[-1]["type"] == "BOOKMARK":
                break
        watch.close()
        old = await http.get(url, params={"watch": "1", "resourceVersion": "1"}, ssl=ctx,
                             headers=TOKEN)  # fmt: skip
        gone = json.loads(await old.content.readline())
        old.close()
    assert full["kind"] == "InstanceTypeList" and full["apiVersion"] == "worker.gpustack.ai/v1"
    names = [i["metadata"]["name"] for i in full["items"]]
    assert {"t0", "t1", "t2"} <= set(names) and "continue" not in full["metadata"]
    paged = [i["metadata"]["name"] for p in pages for i in p["items"]]
    assert len(pages) >= 2 and all(len(p["items"]) <= 2 for p in pages)
    assert paged == [i["metadata"]["name"] for i in exact["items"]]
    assert {"t0", "t1", "t2"} <= set(paged)
    modified = next(e for e in seen if labelled(e))
    assert modified["type"] == "MODIFIED"
    assert int(modified["object"]["metadata"]["resourceVersion"]) > int(rv)
    bookmark = seen[-1]["object"]
    assert bookmark["kind"] == "InstanceType" and int(
        bookmark["metadata"]["resourceVersion"]
    ) >= int(modified["object"]["metadata"]["resourceVersion"])
    assert gone["type"] == "ERROR" and gone["object"]["code"] == 410


async def test_kubernetes_asyncio_lists_and_watches(tmp_path: Path) -> None:
    """kubernetes-asyncio's own client: a watch from a version older than the kept history is
    its ApiException 410; it lists (limit, resourceVersion 0) and its Watch with bookmarks
    resumed from the list's version sees the change."""
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio import watch as k8s_watch

    async with cluster(tmp_path) as (c, _), aiohttp.ClientSession() as http:
        c.fake.put_object(f"{STORED}/instancetypes", instance_type("it-1"))
        await served(http, c, tmp_path)
        conf = k8s.Configuration(host=c.url, api_key={"BearerToken": "dana-token"},
                                 api_key_prefix={"BearerToken": "Bearer"})  # fmt: skip
        conf.verify_ssl = False
        async with k8s.ApiClient(conf) as api_client:
            api = k8s.CustomObjectsApi(api_client)

            async def listed() -> dict[str, Any]:
                return await api.list_cluster_custom_object(  # type: ignore[no-any-return]
                    GROUP, "v1", "instancetypes", limit=500, resource_version="0"
                )

            async def has_one() -> bool:
                return "it-1" in [i["metadata"]["name"] for i in (await listed())["items"]]

            await eventually(has_one, timeout_s=40)
            gone = k8s.ApiException()
            try:
                async with k8s_watch.Watch().stream(
                    api.list_cluster_custom_object, GROUP, "v1", "instancetypes",
                    resource_version="1", timeout_seconds=5,
                ) as stream:  # fmt: skip
                    async for _ in stream:
                        pass
            except k8s.ApiException as e:
                gone = e
            first = await listed()  # list again, then resume from the list's version
            c.fake.put_object(f"{STORED}/instancetypes", instance_type("it-2"))
            got = []
            w = k8s_watch.Watch()
            async with w.stream(
                api.list_cluster_custom_object, GROUP, "v1", "instancetypes",
                resource_version=first["metadata"]["resourceVersion"],
                allow_watch_bookmarks=True, timeout_seconds=10,
            ) as stream:  # fmt: skip
                async for event in stream:
                    got.append((event["type"], event["object"]["metadata"]["name"]))
                    if event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "it-2":
                        break
    assert gone.status == 410  # the forced 410: too old a version, the client lists again
    assert "it-1" in [i["metadata"]["name"] for i in first["items"]]
    assert first["kind"] == "InstanceTypeList"
    assert got[-1] == ("ADDED", "it-2")


async def test_discovery_answers_503_until_the_informers_listed(tmp_path: Path) -> None:
    """The APIService is Available only when the group serves: kube-apiserver's availability
    check GETs /apis/worker.gpustack.ai/v1, which waits for every informer's first list."""
    hooks = WebhookSettings(service="gpustack-operator-worker", namespace="ns", port=31443)
    prefix = f"/{STORED}/instancetypeflavors"
    async with (
        cluster(tmp_path, hold=prefix, webhooks=hooks) as (c, held),
        aiohttp.ClientSession() as http,
    ):
        ctx = client_context(tmp_path, None)
        await held.reached.wait()
        before = await http.get(c.url + V1, ssl=ctx, headers=TOKEN)
        listed_before = await http.get(c.url + V1 + "/instancetypeflavors", ssl=ctx,
                                       headers=TOKEN)  # fmt: skip
        held.release.set()
        await served(http, c, tmp_path)
        service = c.fake.get("apis/apiregistration.k8s.io/v1/apiservices", "v1.worker.gpustack.ai")
        group_list = await (await http.get(c.url + "/apis", ssl=ctx, headers=TOKEN)).json()
    assert before.status == 503 and listed_before.status == 503
    assert service["spec"]["group"] == GROUP and service["spec"]["caBundle"]
    assert [g["name"] for g in group_list["groups"]] == ["gpustack.ai", GROUP]


async def test_progress_is_computed_from_the_nodes_download_state(tmp_path: Path) -> None:
    artifact = {
        "apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact",
        "metadata": {"name": "qwen", "namespace": "team"},
        "spec": {"source": {"huggingFace": {"repository": "Qwen/Qwen3-8B"}}},
        "status": {"resolved": {"manifestDigest": DIGEST, "sizeBytes": 8192}},
    }  # fmt: skip
    state = events.ModelState(model=DIGEST, digest=DIGEST, state="downloading",
                              bytes_done=4096, bytes_total=8192)  # fmt: skip
    event = events.ModelsEvent(node="n1", ts=datetime.now(UTC), models=(state,))
    async with cluster(tmp_path) as (c, _), aiohttp.ClientSession() as http:
        c.fake.put_object(f"{STORED}/modelartifacts", artifact)
        await served(http, c, tmp_path)
        await publish(c.bus, event)
        ctx = client_context(tmp_path, None)
        url = c.url + V1 + "/namespaces/team/modelartifacts/qwen/progress"

        async def downloading() -> bool:
            r = await http.get(url, ssl=ctx, headers=TOKEN)
            return r.status == 200 and (await r.json())["downloading"] == 1

        await eventually(downloading, timeout_s=40)
        got = await (await http.get(url, ssl=ctx, headers=TOKEN)).json()
        missing = await http.get(c.url + V1 + "/namespaces/team/modelartifacts/nope/progress",
                                 ssl=ctx, headers=TOKEN)  # fmt: skip
    assert got["kind"] == "ModelArtifactProgress" and got["manifestDigest"] == DIGEST
    assert (got["ready"], got["downloading"], got["failed"]) == (0, 1, 0)
    assert (got["downloadingBytes"], got["downloadingPercent"], got["live"]) == (4096, 50, 1)
    assert missing.status == 404 and (await missing.json())["reason"] == "NotFound"


async def test_delete_of_a_nodemodelstore_goes_to_the_api_and_others_are_refused(
    tmp_path: Path,
) -> None:
    nms = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "NodeModelStore",
           "metadata": {"name": "gone-node"}, "spec": {}}  # fmt: skip
    async with cluster(tmp_path) as (c, _), aiohttp.ClientSession() as http:
        c.fake.put_object(f"{STORED}/nodemodelstores", nms)
        c.fake.put_object(f"{STORED}/instancetypes", instance_type("keep"))
        await served(http, c, tmp_path)
        ctx = client_context(tmp_path, None)

        async def present() -> bool:
            r = await http.get(c.url + V1 + "/nodemodelstores/gone-node", ssl=ctx, headers=TOKEN)
            return r.status == 200

        await eventually(present, timeout_s=40)
        deleted = await http.delete(
            c.url + V1 + "/nodemodelstores/gone-node", ssl=ctx, headers=TOKEN
        )
        refused = await http.delete(c.url + V1 + "/instancetypes/keep", ssl=ctx, headers=TOKEN)
        bad = await http.get(
            c.url + V1 + "/devices?labelSelector=a%20in%20(", ssl=ctx, headers=TOKEN
        )
    assert deleted.status == 200 and (await deleted.json())["status"] == "Success"
    assert (f"{STORED}/nodemodelstores", None, "gone-node") not in c.fake.objects
    assert refused.status == 405
    assert bad.status == 400 and (await bad.json())["kind"] == "Status"


async def test_standalone_serves_the_ledger_instancetypes(tmp_path: Path) -> None:
    """No cluster: devices reported on the bus become Devices, InstanceTypes and flavors."""
    groups = msgspec.json.decode(
        (HERE / "controlplane_detect_h200x8.json").read_bytes(), type=tuple[DeviceGroup, ...]
    )
    async with nats_server(tmp_path) as server, anyio.create_task_group() as tg:
        bus = settings_for(server)
        conf = msgspec.structs.replace(settings(bus, "http://unused"), kube=None, disable_auths=True,
                                       https=msgspec.structs.replace(settings(bus, "x").https,
                                                                     bind_address="127.0.0.1"))  # fmt: skip
        worker = await tg.start(running.run, conf)
        await publish(bus, events.DevicesEvent(node="s1", ts=datetime.now(UTC), groups=groups))
        ctx = client_context(tmp_path, None)
        async with aiohttp.ClientSession() as http:

            async def typed() -> bool:
                r = await http.get(worker.url + V1 + "/instancetypes", ssl=ctx)
                return r.status == 200 and bool((await r.json())["items"])

            await eventually(typed, timeout_s=40)
            types = await (await http.get(worker.url + V1 + "/instancetypes", ssl=ctx)).json()
            devs = await (await http.get(worker.url + V1 + "/devices/s1", ssl=ctx)).json()
            flavors = await (
                await http.get(worker.url + V1 + "/instancetypeflavors", ssl=ctx)
            ).json()
        tg.cancel_scope.cancel()
    accelerated = [t for t in types["items"] if "accelerator" in t.get("status", {})]
    assert accelerated and accelerated[0]["status"]["accelerator"]["capacity"] == 8
    assert int(types["metadata"]["resourceVersion"]) > 0
    assert devs["kind"] == "Devices" and devs["spec"]["groups"][0]["manufacturer"] == "nvidia"
    assert flavors["items"]


async def test_modelartifacts_of_one_name_in_two_namespaces_are_both_served(tmp_path: Path) -> None:
    """The informer keys a namespaced resource by namespace and name: two artifacts named
    alike are two objects, each in its own namespace (keyed by name alone, one hid the other)."""

    def artifact(namespace: str, repo: str) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact",
                "metadata": {"name": "m", "namespace": namespace},
                "spec": {"source": {"huggingFace": {"repository": repo}}}}  # fmt: skip

    async with cluster(tmp_path) as (c, _), aiohttp.ClientSession() as http:
        c.fake.put_object(f"{STORED}/modelartifacts", artifact("a", "org/one"))
        c.fake.put_object(f"{STORED}/modelartifacts", artifact("b", "org/two"))
        await served(http, c, tmp_path)
        ctx = client_context(tmp_path, None)

        async def both() -> bool:
            r = await http.get(c.url + V1 + "/modelartifacts", ssl=ctx, headers=TOKEN)
            return len((await r.json())["items"]) == 2

        await eventually(both, timeout_s=40)
        in_b = await (
            await http.get(c.url + V1 + "/namespaces/b/modelartifacts/m", ssl=ctx, headers=TOKEN)
        ).json()
        stored_b = f"{STORED}/modelartifacts"
        served_rv = in_b["metadata"]["resourceVersion"]
        stored_rv = c.fake.get(stored_b, "m", "b")["metadata"]["resourceVersion"]
        config = kubeconfig(tmp_path, c.url)
        explain = await anyio.to_thread.run_sync(kubectl, config, "explain", "instancetypes.spec")
    assert in_b["spec"]["source"]["huggingFace"]["repository"] == "org/two"
    assert in_b["apiVersion"] == "worker.gpustack.ai/v1"
    # the API server's versions (the fake counts from 1; an event may take the newest version
    # of its sync, so it is not always the object's own), not the core's own count, which
    # starts at the microsecond clock (about 1.8e15)
    assert 0 < int(stored_rv) < 10**6 and 0 < int(served_rv) < 10**6
    assert explain.returncode == 0, explain.stderr
    assert (
        "acceleratorGroup" in explain.stdout and "GROUP:      worker.gpustack.ai" in explain.stdout
    )


async def test_kubectl_selects_pages_and_deletes_in_the_group(tmp_path: Path) -> None:
    """``kubectl get mart -A -l``, ``--chunk-size`` over several pages, ``--field-selector``,
    and ``kubectl delete nms`` reaching the stored NodeModelStore."""

    def artifact(namespace: str, name: str, team: str) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact",
                "metadata": {"name": name, "namespace": namespace, "labels": {"team": team}},
                "spec": {"source": {"huggingFace": {"repository": f"org/{name}"}}}}  # fmt: skip

    state = events.ModelState(model=DIGEST, digest=DIGEST, state="ready", bytes_total=1)
    async with cluster(tmp_path) as (c, _), aiohttp.ClientSession() as http:
        for i in range(5):
            c.fake.put_object(f"{STORED}/modelartifacts",
                              artifact("a" if i % 2 else "b", f"m{i}", "x" if i < 2 else "y"))  # fmt: skip
        await publish(c.bus, events.ModelsEvent(node="n1", ts=datetime.now(UTC), models=(state,)))
        await served(http, c, tmp_path)
        ctx = client_context(tmp_path, None)

        async def ready() -> bool:
            arts = await http.get(c.url + V1 + "/modelartifacts", ssl=ctx, headers=TOKEN)
            nms = await http.get(c.url + V1 + "/nodemodelstores/n1", ssl=ctx, headers=TOKEN)
            return len((await arts.json())["items"]) == 5 and nms.status == 200

        await eventually(ready, timeout_s=40)
        config = kubeconfig(tmp_path, c.url)
        names = ("get", "mart", "-A", "-o", "custom-columns=N:.metadata.name", "--no-headers")
        labelled = await anyio.to_thread.run_sync(kubectl, config, *names, "-l", "team=x")
        chunked = await anyio.to_thread.run_sync(kubectl, config, *names, "--chunk-size=2")
        fields = await anyio.to_thread.run_sync(
            kubectl, config, *names, "--field-selector", "metadata.namespace=a"
        )
        deletes = c.fake.writes["delete"]
        deleted = await anyio.to_thread.run_sync(kubectl, config, "delete", "nms", "n1")
    assert labelled.returncode == 0, labelled.stderr
    assert sorted(labelled.stdout.split()) == ["m0", "m1"]
    assert sorted(chunked.stdout.split()) == [f"m{i}" for i in range(5)]
    assert sorted(fields.stdout.split()) == ["m1", "m3"]
    assert deleted.returncode == 0, deleted.stderr
    assert 'nodemodelstore.worker.gpustack.ai "n1" deleted' in deleted.stdout
    assert c.fake.writes["delete"] == deletes + 1
