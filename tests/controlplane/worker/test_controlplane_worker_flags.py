"""Each worker flag that used to do nothing, shown doing what ``worker --help`` says.

``--audit-*`` (file, policy levels, webhook), ``--manufacturer``, ``--disable-applications``,
``--informer-cache-resync-period``, ``--gopool-worker-factor``; ``--cors-allowed-origins`` is
shown on the endpoint itself in ``tests/kit/test_kit_cors.py``. Against the stateful fake API, a
real nats-server and real HTTP servers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from aiohttp import web
from controlplane_fakeapi import fake_api, node
from test_controlplane_extension_api import (
    HEADERS,
    SETTINGS,
    alice,
    client_certificate,
    client_context,
    cluster,
)
from test_controlplane_nms_e2e import publish, until

from bus import events
from bus.devices import DeviceGroup
from controlplane import applications
from controlplane.errors import ServerError, SinkUnavailable
from controlplane.extension import audit
from controlplane.k8s.client import KubeSettings, open_client
from controlplane.resources import NODES, Ref
from controlplane.worker.settings import settings_from
from gpustack_operator.main import options_for

pytestmark = pytest.mark.anyio
HERE = Path(__file__).parents[1]
POLICY = """
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: None
    users: [bob]
  - level: Request
    verbs: [patch, update]
    resources: [{group: gpustack.ai, resources: [settings]}]
  - level: Metadata
"""


def _worker(argv: list[str]) -> Any:
    return settings_from(options_for(("worker",), argv))


async def test_audit_log_levels_follow_the_policy(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    log_path = tmp_path / "audit.log"
    conf = _worker([f"--audit-log-path={log_path}", f"--audit-policy-file={tmp_path}/policy.yaml"])
    async with cluster(tmp_path, audit=conf.audit) as c:
        c.fake.resource_grants |= alice()
        proxy = client_context(tmp_path, client_certificate(*c.ca, "front-proxy-client"))
        async with aiohttp.ClientSession() as http:
            await http.get(c.url + SETTINGS, ssl=proxy, headers=HEADERS)
            await http.get(c.url + SETTINGS, ssl=proxy, headers={"X-Remote-User": "bob"})
            await http.patch(
                f"{c.url}{SETTINGS}/node-management-manual", ssl=proxy, headers=HEADERS,
                json={"spec": {"value": "true"}},
            )  # fmt: skip
            await http.get(c.url + "/metrics", ssl=proxy)  # not an API: never audited
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [(e["verb"], e["user"]["username"], e["level"]) for e in lines] == [
        ("list", "alice", "Metadata"),
        ("patch", "alice", "Request"),
    ]
    listed, patched = lines
    assert "requestObject" not in listed
    assert listed["objectRef"] == {"resource": "settings", "apiGroup": "gpustack.ai",
                                   "apiVersion": "v1", "namespace": "ns"}  # fmt: skip
    assert listed["responseStatus"] == {"code": 200} and listed["apiVersion"] == "audit.k8s.io/v1"
    assert patched["requestObject"] == {"spec": {"value": "true"}}


async def test_audit_events_reach_the_webhook(tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []
    got = anyio.Event()

    async def sink(request: web.Request) -> web.Response:
        received.append(await request.json())
        got.set()
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/audit", sink)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kubeconfig = tmp_path / "audit-webhook.yaml"
    kubeconfig.write_text(
        f"apiVersion: v1\nkind: Config\nclusters:\n- name: audit\n  cluster:\n"
        f"    server: http://127.0.0.1:{port}/audit\n"
    )
    try:
        conf = _worker([f"--audit-webhook-config-file={kubeconfig}"])
        async with cluster(tmp_path, audit=conf.audit) as c:
            c.fake.resource_grants |= alice()
            proxy = client_context(tmp_path, client_certificate(*c.ca, "front-proxy-client"))
            async with aiohttp.ClientSession() as http:
                await http.get(c.url + SETTINGS, ssl=proxy, headers=HEADERS)
            await got.wait()
    finally:
        await runner.cleanup()
    assert received[0]["kind"] == "EventList"
    assert received[0]["items"][0]["user"]["username"] == "alice"
    assert received[0]["items"][0]["level"] == "Metadata"  # no policy file: Metadata


def test_audit_policy_rules_are_checked_at_the_edge(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: Loud\n")
    with pytest.raises(ValueError, match="Loud"):
        audit.policy_from(str(bad))
    discovery = {"user": {"username": "u"}, "verb": "get", "path": "/apis/gpustack.ai/v1"}
    rules = (audit.Rule(level="Request", non_resource_urls=("/apis/*",)),)
    assert audit.level_for(rules, discovery) == "Request"
    assert audit.level_for((), discovery) == "None"


def _groups(fixture: str) -> tuple[DeviceGroup, ...]:
    raw = (HERE / fixture).read_bytes()
    return msgspec.json.decode(raw, type=tuple[DeviceGroup, ...])


async def test_manufacturer_limits_the_groups_the_worker_manages(tmp_path: Path) -> None:
    nvidia, amd = (
        _groups("controlplane_detect_h200x8.json"),
        _groups("controlplane_detect_amd_x2.json"),
    )
    assert _worker(["--manufacturer=amd"]).manufacturers == ("amd",)
    async with cluster(tmp_path, manufacturers=("amd",)) as c:
        await publish(c.bus, events.DevicesEvent(node="n1", groups=nvidia + amd))
        await until(lambda: bool(c.fake.get("apis/worker.gpustack.ai/v1alpha1/devices", "n1")))
        spec = c.fake.get("apis/worker.gpustack.ai/v1alpha1/devices", "n1")["spec"]
        labels = c.fake.get("api/v1/nodes", "n1")["metadata"]["labels"]
    assert {g["manufacturer"] for g in spec["groups"]} == {"amd"}
    assert not any("nvidia" in key for key in labels)


async def test_disable_applications_decides_what_the_worker_ensures(tmp_path: Path) -> None:
    assert _worker([]).applications == frozenset(applications.NAMES)
    assert _worker(["--disable-applications=*"]).applications == frozenset()
    assert "model-manager" not in _worker(["--disable-applications=model-manager"]).applications
    driver = ("apis/storage.k8s.io/v1/csidrivers", None, applications.DRIVER)
    inventory = ("api/v1/configmaps", "ns", "gpustack-applications")
    async with cluster(tmp_path) as c:
        await until(lambda: inventory in c.fake.objects)
        ensured = driver in c.fake.objects
    async with cluster(tmp_path / "off", applications=frozenset({"kueue"})) as c:
        await until(lambda: inventory in c.fake.objects)
        skipped = driver not in c.fake.objects
    assert ensured and skipped


async def test_informer_resync_period_starts_watches_over_with_a_full_list() -> None:
    async def added_on_resume(relist_s: float) -> tuple[int, int]:
        async with fake_api() as (fake, url):
            fake.put_object("api/v1/nodes", node("n1"))
            settings = KubeSettings.for_tests(url, relist_s=relist_s)
            async with open_client(settings) as api:
                first = [e async for e in api.watch(NODES, timeout_s=1)]
                since = first[-1].object["metadata"]["resourceVersion"]
                again = [e async for e in api.watch(NODES, resource_version=since, timeout_s=1)]
                return len([e for e in again if e.type == "ADDED"]), api.relists

    assert await added_on_resume(3600.0) == (0, 0)  # resumed where it stopped
    assert await added_on_resume(1e-9) == (1, 1)  # the period passed: everything again
    assert await added_on_resume(0.0) == (0, 0)  # 0: never
    assert _worker(["--informer-cache-resync-period=10m"]).kube.relist_s == 600.0


def test_gopool_worker_factor_is_reconcile_concurrency_per_core() -> None:
    cores = len(os.sched_getaffinity(0))
    assert _worker(["--gopool-worker-factor=2"]).concurrency == min(1024, 2 * cores)
    assert _worker(["--gopool-worker-factor=10000"]).concurrency == 1024


def test_cors_origins_are_compiled_at_the_edge() -> None:
    conf = _worker(["--cors-allowed-origins=https://ui\\.example"])
    assert conf.https.cors_allowed_origins == ("https://ui\\.example",)
    assert _worker([]).https.cors_allowed_origins == (".*",)


def test_every_worker_flag_has_an_effect() -> None:
    from gpustack_operator.commands import COMMANDS

    worker = next(c for c in COMMANDS if c.path == ("worker",))
    assert [f.name for f in worker.flags if f.inert] == []


@pytest.mark.anyio
@pytest.mark.parametrize("bypassed", [False, True])
async def test_the_api_proxy_is_taken_from_the_environment_once(
    monkeypatch: pytest.MonkeyPatch, bypassed: bool
) -> None:
    """HTTP_PROXY/NO_PROXY are honoured as client-go honours them, decided when the client
    opens: the fake API plays the proxy for a host that does not resolve."""
    async with fake_api() as (fake, url):
        fake.put_object("api/v1/nodes", node("n1"))
        monkeypatch.setenv("HTTP_PROXY", url)
        monkeypatch.setenv("NO_PROXY", "kube.invalid" if bypassed else "elsewhere.invalid")
        settings = KubeSettings.for_tests("http://kube.invalid:6443", max_retries=0)
        async with open_client(settings) as api:
            monkeypatch.delenv("HTTP_PROXY")  # read once: a later change has no effect
            if bypassed:
                with pytest.raises(ServerError):  # straight to kube.invalid: no such host
                    await api.get(Ref(resource=NODES, name="n1"))
            else:
                assert (await api.get(Ref(resource=NODES, name="n1")))["metadata"]["name"] == "n1"


@pytest.mark.parametrize(
    "text",
    [
        "clusters: [\n",  # not YAML
        "- a list\n",  # YAML, not a mapping
        "apiVersion: v1\nclusters: []\ncontexts: []\ncurrent-context: x\n",  # no such context
        None,  # a directory
    ],
)
async def test_an_unusable_kubeconfig_is_one_clear_error(tmp_path: Path, text: str | None) -> None:
    path = tmp_path / "kubeconfig"
    if text is None:
        path.mkdir()
    else:
        path.write_text(text)
    with pytest.raises(SinkUnavailable, match="no usable Kubernetes configuration"):
        async with open_client(KubeSettings.for_tests(kubeconfig=str(path))):
            pass
