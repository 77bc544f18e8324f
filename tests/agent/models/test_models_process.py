"""The whole process: artifacts from the bus KV, models on the bus, HTTPS endpoints."""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import anyio
import msgspec
import pytest
from models_harness import FILES, call, code_of, manager_settings, manifest_of, publish_request

from agent.models import running
from agent.models.policy import MemoryPolicy
from agent.models.settings import ModelManagerSettings, settings_from
from bus import accessreviews, codec, connection, embedded, events, kv, state, testing
from bus.records import ArtifactRecord, HuggingFaceSource, StoreSpecRecord
from bus.settings import BusSettings
from gpustack_operator.main import options_for
from hub import testing as hub_testing
from kit import serving
from kit.access import Decision
from kit.options import SettingsError
from proto.csi import v1 as csi

pytestmark = pytest.mark.anyio


async def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.get(url, ssl=context, headers=headers) as r:
        return r.status, await r.read()


async def test_serve_reads_artifacts_from_kv_and_publishes_models(tmp_path: Path) -> None:
    hub = hub_testing.FakeHub(tmp_path / "hub")
    commit = hub.add("org/model", FILES)
    digest = manifest_of(FILES).digest
    async with testing.nats_server(tmp_path / "nats") as nats, hub_testing.serving(hub) as ep:
        bus_settings = testing.settings_for(nats)
        settings = manager_settings(
            tmp_path,
            ep.hub,
            https=serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
            bus=bus_settings,
        )
        async with connection.connect(bus_settings, retry=False) as conn:
            # The worker's job: the agent creates neither the bucket nor the streams.
            await state.ensure_streams(conn, bus_settings)
            bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
            record = ArtifactRecord(
                namespace="team-a",
                name="llm",
                uid="u-1",
                source=HuggingFaceSource(repository="org/model"),
                manifest_digest=digest,
                revision=commit,
            )
            await bucket.put_record(kv.artifact_key("team-a", "llm"), record)
            await bucket.put_record(
                kv.nms_key("node-1"),
                StoreSpecRecord(node="node-1", spec={"download": {"concurrency": 4}}),
            )
            policy = MemoryPolicy()
            ask = record
            target = settings.pods_dir / "p" / "volumes" / "kubernetes.io~csi" / "m" / "mount"
            target.parent.mkdir(parents=True)
            async with anyio.create_task_group() as tg:
                tg.start_soon(running.serve, settings, policy)

                async def synced() -> bool:
                    return policy.synced() and settings.socket_path.exists()

                await testing.eventually(synced)
                code, message = await code_of(settings.socket_path, publish_request(ask, target))

                async def ready_on_bus() -> bool:
                    raw = await state.snapshot(conn, bus_settings, node="node-1", kind="models")
                    decoded = [
                        codec.decode(data, kind="models", node="node-1", max_bytes=1 << 20)
                        for _, data in raw
                    ]
                    return any(
                        isinstance(e, events.ModelsEvent)
                        and [(m.model, m.state) for m in e.models] == [(digest, "ready")]
                        for e in decoded
                    )

                await testing.eventually(ready_on_bus)
                tg.cancel_scope.cancel()

    assert code.name == "ABORTED", message
    assert "still downloading" in message
    assert policy.spec() is not None and policy.spec().download.concurrency == 4  # type: ignore[union-attr]


async def test_serves_csi_and_https_while_nats_is_down_and_publishes_once_it_is_up(
    tmp_path: Path,
) -> None:
    port = embedded.free_port()
    bus_settings = BusSettings.for_tests(f"nats://127.0.0.1:{port}")  # nothing listens yet
    https = serving.HttpsSettings(bind_address="127.0.0.1", port=embedded.free_port())
    async with hub_testing.serving(hub_testing.FakeHub(tmp_path / "hub")) as ep:
        settings = manager_settings(tmp_path, ep.hub, https=https, bus=bus_settings)
        policy = MemoryPolicy()
        async with anyio.create_task_group() as tg:
            tg.start_soon(running.serve, settings, policy)
            livez = f"https://127.0.0.1:{https.port}/livez"
            await testing.eventually(_answers(livez))
            assert not policy.synced()
            assert await _probe(settings.socket_path) is False  # no policy from the bus yet
            async with (
                embedded.embedded_server(tmp_path / "nats", port=port),
                connection.connect(bus_settings, retry=False) as conn,
            ):
                # The worker's job: the agent creates neither the streams nor the bucket.
                await state.ensure_streams(conn, bus_settings)
                await kv.open_bucket(conn, kv.AGENTS_BUCKET)

                async def models_on_bus() -> bool:
                    raw = await state.snapshot(conn, bus_settings, node="node-1", kind="models")
                    return len(raw) == 1

                await testing.eventually(models_on_bus, timeout_s=20)
                await testing.eventually(_synced(policy))
                assert await _probe(settings.socket_path) is True
            tg.cancel_scope.cancel()


def _answers(url: str, token: str | None = None) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            return (await _get(url, token))[0] == 200
        except aiohttp.ClientError:
            return False

    return check


class _Reviewer:
    """Stands in for the worker on the bus: the token ``scraper`` may read everything."""

    async def allowed(self, token: str | None, path: str) -> Decision:
        return Decision("allowed") if token == "scraper" else Decision("forbidden", "no")


async def test_https_is_reviewed_over_the_bus_and_closed_without_it(tmp_path: Path) -> None:
    port = embedded.free_port()
    bus_settings = BusSettings.for_tests(f"nats://127.0.0.1:{port}")  # nothing listens yet
    https = serving.HttpsSettings(bind_address="127.0.0.1", port=embedded.free_port())
    assert https.auth == "review"  # the default
    base = f"https://127.0.0.1:{https.port}"
    async with hub_testing.serving(hub_testing.FakeHub(tmp_path / "hub")) as ep:
        settings = manager_settings(tmp_path, ep.hub, https=https, bus=bus_settings)
        async with anyio.create_task_group() as tg:
            tg.start_soon(running.serve, settings, MemoryPolicy())
            await testing.eventually(_answers(f"{base}/livez"))
            assert (await _get(f"{base}/model/downloads", "scraper"))[0] == 503
            async with (
                embedded.embedded_server(tmp_path / "nats", port=port),
                connection.connect(bus_settings, retry=False) as conn,
                accessreviews.serve_reviews(conn, _Reviewer()),
            ):
                await testing.eventually(_answers(f"{base}/model/downloads", "scraper"))
                assert (await _get(f"{base}/metrics", "scraper"))[0] == 200
                assert (await _get(f"{base}/metrics", "someone"))[0] == 403
                assert (await _get(f"{base}/metrics"))[0] == 401
            tg.cancel_scope.cancel()


def _synced(policy: MemoryPolicy) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return policy.synced()

    return check


async def _probe(socket: Path) -> bool | None:
    reply = await call(
        socket, "/csi.v1.Identity/Probe", csi.ProbeRequest(), csi.ProbeResponse.FromString
    )
    return reply.ready


async def test_https_endpoints(tmp_path: Path) -> None:
    hub = hub_testing.FakeHub(tmp_path / "hub")
    hub.gate = anyio.Event()
    commit = hub.add("org/model", FILES)
    digest = manifest_of(FILES).digest
    async with hub_testing.serving(hub) as ep:
        settings = manager_settings(
            tmp_path,
            ep.hub,
            https=serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
        )
        ask = ArtifactRecord(
            namespace="team-a",
            name="llm",
            uid="u-1",
            source=HuggingFaceSource(repository="org/model"),
            manifest_digest=digest,
            revision=commit,
        )
        policy = MemoryPolicy([ask])
        target = settings.pods_dir / "p" / "volumes" / "kubernetes.io~csi" / "m" / "mount"
        target.parent.mkdir(parents=True)
        async with running.plugin(settings, policy=policy) as plugin:
            await code_of(plugin.socket, publish_request(ask, target))
            async with serving.https_server(
                settings.https,
                registry=plugin.metrics.registry,
                ready=lambda: True,
                routes={"/model/downloads": lambda: _downloads(plugin)},
            ) as server:
                status, body = await _get(server.url + "/model/downloads")
                mstatus, metrics = await _get(server.url + "/metrics")
            hub.gate.set()

    assert status == 200
    (download,) = json.loads(body)
    assert (download["digest"], download["downloadedBytes"], download["source"]) == (
        digest,
        0,
        "Hub",
    )
    assert download["sizeBytes"] in (0, manifest_of(FILES).size)  # 0 while listing
    assert mstatus == 200
    assert b'gpustack_model_manager_mounts_total{result="pending"} 1.0' in metrics
    assert b"gpustack_model_manager_capacity_bytes" in metrics


async def _downloads(plugin: running.Plugin) -> serving.Response:
    from agent.models import reporting

    return serving.Response(
        body=reporting.downloads_json(plugin.materializer.jobs), content_type="application/json"
    )


def test_settings_from_flags() -> None:
    def built(*argv: str, **env: str) -> ModelManagerSettings:
        return settings_from(options_for(("model-manager",), argv, env))

    s = built("--node-name=n1", "--kubelet-dir=/k", "--cache-root=/c",
              HF_TOKEN="t", HF_ENDPOINT="http://mirror")  # fmt: skip
    assert s.socket_path == Path("/k/plugins/model.csi.gpustack.ai/csi.sock")
    assert (s.hub_token, s.hub_endpoint, s.bus) == ("t", "http://mirror", None)
    assert msgspec.structs.asdict(s.https)["port"] == 32444
    assert s.https.auth == "review"
    assert built("--metrics-auth=none").https.auth == "none"
    with pytest.raises(SettingsError, match="absolute"):
        built("--cache-root=rel")
    with pytest.raises(SettingsError, match="HF_ENDPOINT"):
        built(HF_ENDPOINT="not a url")
    assert built(KUBERNETES_NODE_NAME="from-env").node_name == "from-env"
    assert built("--node-name=flag", KUBERNETES_NODE_NAME="from-env").node_name == "flag"
    assert built("--nats-url=nats://bus:4222").bus is not None
    # Peer delivery: off without --peer-port; the address from the flag, else $POD_IP.
    assert built().peers.port is None
    peers = built("--peer-port=32445", POD_IP="10.0.0.7").peers
    assert (peers.port, peers.address) == (32445, "10.0.0.7")
    assert built(
        "--peer-port=32445", "--peer-address=10.0.0.8", POD_IP="10.0.0.7"
    ).peers.address == ("10.0.0.8")
    with pytest.raises(SettingsError, match="needs --peer-address"):
        built("--peer-port=32445")
    with pytest.raises(SettingsError, match="not an IP address"):
        built("--peer-port=32445", "--peer-address=node-a")
    with pytest.raises(SettingsError, match="--peer-address needs --peer-port"):
        built("--peer-address=10.0.0.8")  # would be ignored: peer delivery is off
