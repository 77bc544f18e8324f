"""Peer delivery: real model agents (``running.serve``) on one real nats-server with the auth
callout on, so the server itself enforces who may offer what (bus/peers.py), exchanging a
digest over their peer endpoints; the fake Hub's request log says what reached the Hub."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import anyio
import msgspec
import pytest
from models_harness import (
    FILES,
    TUNING,
    code_of,
    manager_settings,
    manifest_of,
    publish_request,
    unpublish,
)

from agent.models import peerclient, peering, running
from agent.models.peering import PeerSettings
from agent.models.policy import MemoryPolicy
from agent.models.settings import ModelManagerSettings
from bus import callout, codec, connection, events, jwt, kv, peers, state, testing
from bus.identity import Identity
from bus.records import ArtifactRecord, HuggingFaceSource, StoreSpecRecord
from hub import http
from hub import testing as hub_testing
from hub.errors import AccessDenied
from kit import serving
from proto.csi import v1 as csi

pytestmark = pytest.mark.anyio

NODES = ("node-a", "node-b", "node-c")
TOKENS = {f"tok-{n}": Identity(role="model-manager", node=n) for n in NODES}
BIG = "model-00001.safetensors"


@dataclass
class Cluster:
    bus: testing.CalloutBus
    hub: hub_testing.FakeHub
    endpoint: str
    conn: connection.Connection
    """The worker's connection (streams, the agents' bucket, the retained state)."""
    tmp: Path
    record: ArtifactRecord | None = None
    asked: list[tuple[Path, str, Path]] = field(default_factory=list)
    """(CSI socket, volume id, target) of every publish asked: unpublished when agents stop."""

    async def ask(self, node: str, request: csi.NodePublishVolumeRequest) -> tuple[str, str]:
        """NodePublishVolume on ``node``'s agent: (code name, message)."""
        socket = self.settings(node).socket_path
        self.asked.append((socket, request.volume_id, Path(request.target_path)))
        code, message = await code_of(socket, request)
        return code.name, message

    def settings(self, node: str) -> ModelManagerSettings:
        base = manager_settings(
            self.tmp / node,
            self.endpoint,
            https=serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
            bus=self.bus.settings_as(TOKENS[f"tok-{node}"], f"tok-{node}"),
            peers=PeerSettings(port=0, bind_address="127.0.0.1", address="127.0.0.1"),
        )
        quick = msgspec.structs.replace(TUNING, backoff_first_s=0.2, backoff_max_s=0.5)
        return msgspec.structs.replace(base, node_name=node, tuning=quick)

    def file_requests(self) -> list[str]:
        return [s.path for s in self.hub.seen if "/resolve/" in s.path]

    async def publish(self, node: str) -> None:
        """Ask ``node``'s agent to mount the artifact (this starts its download) until its
        tree is published."""
        assert self.record is not None
        settings = self.settings(node)
        target = settings.pods_dir / "p" / "volumes" / "kubernetes.io~csi" / "m" / "mount"
        target.parent.mkdir(parents=True, exist_ok=True)
        hex_ = manifest_of(FILES).digest.removeprefix("sha256:")

        async def published() -> bool:
            return (settings.cache_root / "published" / hex_ / "marker").is_file()

        await self.ask(node, publish_request(self.record, target))
        await testing.eventually(published, timeout_s=30)

    async def source_on_bus(self, node: str) -> str | None:
        raw = await state.snapshot(self.conn, self.bus.worker, node=node, kind="models")
        for _, data in raw:
            event = codec.decode(data, kind="models", node=node, max_bytes=1 << 20)
            if isinstance(event, events.ModelsEvent):
                for m in event.models:
                    if m.state == "ready":
                        return m.source
        return None


@asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    hub = hub_testing.FakeHub(tmp_path / "hub")
    commit = hub.add("org/model", FILES)
    async with (
        testing.callout_server(tmp_path, callout.token_table(TOKENS)) as bus,
        hub_testing.serving(hub) as ep,
        connection.connect(bus.worker, retry=False) as conn,
    ):
        await state.ensure_streams(conn, bus.worker)
        bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
        record = ArtifactRecord(
            namespace="team-a",
            name="llm",
            uid="u-1",
            source=HuggingFaceSource(repository="org/model"),
            manifest_digest=manifest_of(FILES).digest,
            revision=commit,
        )
        await bucket.put_record(kv.artifact_key("team-a", "llm"), record)
        yield Cluster(bus, hub, ep.hub, conn, tmp_path, record)


@asynccontextmanager
async def agents(c: Cluster, *nodes: str) -> AsyncIterator[None]:
    """``nodes``' model agents, each the whole ``model-manager`` process body."""
    async with anyio.create_task_group() as tg:
        for node in nodes:
            settings = c.settings(node)
            policy = MemoryPolicy()
            tg.start_soon(running.serve, settings, policy)

            async def synced(p: MemoryPolicy = policy, s: ModelManagerSettings = settings) -> bool:
                return p.synced() and s.socket_path.exists()

            await testing.eventually(synced)
        try:
            yield
        finally:
            for socket, volume_id, target in c.asked:  # a volume that mounted leaves no mount
                if socket.exists():
                    await unpublish(socket, volume_id, target)
            tg.cancel_scope.cancel()


@asynccontextmanager
async def listener(c: Cluster, node: str = "node-c") -> AsyncIterator[dict[str, peers.PeerOffer]]:
    """The offers ``node``'s model-manager identity reads (it may read every peer's)."""
    offers: dict[str, peers.PeerOffer] = {}

    def keep(subject: str, payload: bytes) -> None:
        offer = peers.decode_offer(subject, payload)
        if offer is not None:
            offers[offer.node] = offer

    settings = c.bus.settings_as(TOKENS[f"tok-{node}"], f"tok-{node}")
    async with connection.connect(settings, retry=False) as conn, conn.subscribe(peers.ALL, keep):
        await conn.flush()  # the server has the subscription: no offer sent from now is missed
        yield offers


async def offered(offers: dict[str, peers.PeerOffer], node: str, hex_: str) -> peers.PeerOffer:
    async def seen() -> bool:
        return node in offers and hex_ in offers[node].digests

    await testing.eventually(seen, timeout_s=30)
    return offers[node]


async def test_a_second_node_pulls_from_its_peer_without_touching_the_hub(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as c, agents(c, "node-a", "node-b"):
        async with listener(c) as offers:  # before the publish: its offer is not missed
            await c.publish("node-a")
            await offered(offers, "node-a", manifest_of(FILES).digest[7:])
        hub_files = len(c.file_requests())
        assert hub_files >= len(FILES) - 1  # node-a fetched every (non-empty) file from the Hub
        await c.publish("node-b")
        assert len(c.file_requests()) == hub_files  # not one file request more
        tree = c.settings("node-b").cache_root / "published" / manifest_of(FILES).digest[7:]
        for path, data in FILES.items():
            assert (tree / "tree" / path).read_bytes() == data

        async def sources() -> bool:
            return (await c.source_on_bus("node-a"), await c.source_on_bus("node-b")) == (
                "Hub",
                "Peer",
            )

        await testing.eventually(sources)


async def test_a_lying_peer_costs_a_retry_and_the_tree_is_verified(
    tmp_path: Path,
) -> None:
    hex_ = manifest_of(FILES).digest[7:]
    async with cluster(tmp_path) as c, agents(c, "node-a", "node-b"):
        # the listener subscribes before node-a publishes: node-a announces its new digest
        # once (the next announcement is a period away), and a late listener misses it
        async with listener(c) as offers:
            await c.publish("node-a")
            await offered(offers, "node-a", hex_)
        # node-a's published copy of the big file gets one byte flipped (root writes a 0444 file)
        big = c.settings("node-a").cache_root / "published" / hex_ / "tree" / BIG
        with big.open("r+b") as f:
            f.seek(FILES[BIG].__len__() // 2)
            f.write(bytes([FILES[BIG][len(FILES[BIG]) // 2] ^ 0xFF]))
        before = c.file_requests()
        await c.publish("node-b")
        again = c.file_requests()[len(before) :]
        # only the file the peer lied about came from the Hub, every other byte from the peer
        assert again and {p.rsplit("/", 1)[-1] for p in again} == {BIG}
        tree = c.settings("node-b").cache_root / "published" / hex_ / "tree"
        assert (tree / BIG).read_bytes() == FILES[BIG]


async def test_a_lying_peer_costs_a_retry_against_another_peer_not_the_hub(
    tmp_path: Path,
) -> None:
    hex_ = manifest_of(FILES).digest[7:]
    async with cluster(tmp_path) as c, agents(c, "node-a", "node-b", "node-c"):
        async with listener(c, "node-b") as offers:
            await c.publish("node-a")
            await offered(offers, "node-a", hex_)
            await c.publish("node-c")  # from node-a or the Hub: either way, published
            await offered(offers, "node-c", hex_)
            # the peer node-b tries first lies about one byte of the big file
            directory = peering.Directory("node-b")
            for offer in offers.values():
                directory.on_message(peers.subject(offer.node), peers.encode_offer(offer))
            liar = directory.holders(hex_)[0].node
        big = c.settings(liar).cache_root / "published" / hex_ / "tree" / BIG
        with big.open("r+b") as f:
            f.seek(7)
            f.write(bytes([FILES[BIG][7] ^ 1]))
        before = len(c.file_requests())
        await c.publish("node-b")
        assert len(c.file_requests()) == before  # the other peer gave what the liar did not
        tree = c.settings("node-b").cache_root / "published" / hex_ / "tree"
        assert all((tree / p).read_bytes() == d for p, d in FILES.items())

        async def from_peers() -> bool:
            return await c.source_on_bus("node-b") == "Peer"

        await testing.eventually(from_peers)


async def test_a_node_whose_store_spec_turns_peer_sync_off_pulls_from_the_hub(
    tmp_path: Path,
) -> None:
    hex_ = manifest_of(FILES).digest[7:]
    async with cluster(tmp_path) as c:
        bucket = await kv.open_bucket(c.conn, kv.AGENTS_BUCKET)
        off = StoreSpecRecord(node="node-b", spec={"download": {"peerSync": False}})
        await bucket.put_record(kv.nms_key("node-b"), off)
        async with agents(c, "node-a", "node-b"):
            async with listener(c) as offers:
                await c.publish("node-a")
                await offered(offers, "node-a", hex_)
            before = len(c.file_requests())
            await c.publish("node-b")
            assert len(c.file_requests()) > before  # from the Hub, though node-a offers it

            async def sources() -> bool:
                return await c.source_on_bus("node-b") == "Hub"

            await testing.eventually(sources)


async def _get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        return r.status, await r.read()


async def test_the_peer_endpoint_admits_only_signed_requests_of_an_offering_node(
    tmp_path: Path,
) -> None:
    hex_ = manifest_of(FILES).digest[7:]
    key_c, stranger = jwt.NKey.generate("user"), jwt.NKey.generate("user")
    async with cluster(tmp_path) as c, agents(c, "node-a"), listener(c) as offers:
        await c.publish("node-a")
        a = await offered(offers, "node-a", hex_)
        path = f"/peer/v1/trees/{hex_}"

        def signed(key: jwt.NKey, client: str = "node-c", server: str = "node-a") -> dict[str, str]:
            return {
                "Authorization": peers.authorization(key, server, client, int(time.time()), path)
            }

        assert (await _get(a.url + path, {}))[0] == 401  # anonymous
        assert (await _get(a.url + path, signed(key_c)))[0] == 401  # node-c offers no key yet
        settings_c = c.bus.settings_as(TOKENS["tok-node-c"], "tok-node-c")
        offer_c = peers.PeerOffer(node="node-c", url="http://127.0.0.1:1", key=key_c.public_key)
        async with connection.connect(settings_c, retry=False) as conn_c:
            # node-c may not speak for node-a: the server refuses the subject, so node-a
            # never takes the stranger's key as node-a's
            lie = peers.PeerOffer(node="node-a", url="http://127.0.0.1:1", key=stranger.public_key)
            await conn_c.publish(peers.subject("node-a"), peers.encode_offer(lie))
            await conn_c.publish(peers.subject("node-c"), peers.encode_offer(offer_c))
            await conn_c.flush()

            async def admitted() -> bool:
                return (await _get(a.url + path, signed(key_c)))[0] == 200

            await testing.eventually(admitted)
        status, body = await _get(a.url + path, signed(key_c))
        assert status == 200 and body.decode() == manifest_of(FILES).text()
        refused = [
            signed(stranger),  # a key node-c never offered
            signed(stranger, client="node-a"),  # the lie node-c tried to tell
            signed(key_c, server="node-b"),  # node-c's signature for another server
        ]
        for headers in refused:
            assert (await _get(a.url + path, headers))[0] == 401, headers
        late = {"Authorization": peers.authorization(key_c, "node-a", "node-c", 1, path)}
        assert (await _get(a.url + path, late))[0] == 401  # outside the allowed skew


async def test_ranges_from_curl_and_no_unlisted_path_or_partial_tree(
    tmp_path: Path,
) -> None:
    hex_ = manifest_of(FILES).digest[7:]
    key_c = jwt.NKey.generate("user")
    async with cluster(tmp_path) as c, agents(c, "node-a"), listener(c) as offers:
        await c.publish("node-a")
        a = await offered(offers, "node-a", hex_)
        settings_c = c.bus.settings_as(TOKENS["tok-node-c"], "tok-node-c")
        offer_c = peers.PeerOffer(node="node-c", url="http://127.0.0.1:1", key=key_c.public_key)
        async with connection.connect(settings_c, retry=False) as conn_c:
            await conn_c.publish(peers.subject("node-c"), peers.encode_offer(offer_c))
            await conn_c.flush()

        async def curl(path: str, *extra: str) -> tuple[int, bytes]:
            return await anyio.to_thread.run_sync(run_curl, path, *extra)

        def run_curl(path: str, *extra: str) -> tuple[int, bytes]:
            auth = peers.authorization(key_c, "node-a", "node-c", int(time.time()), path)
            out = subprocess.run(
                ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "-H", f"Authorization: {auth}",
                 *extra, a.url + path],
                capture_output=True, check=True, timeout=30,
            )  # fmt: skip
            body, _, code = out.stdout.rpartition(b"\n")
            return int(code), body

        big = f"/peer/v1/trees/{hex_}/files/{BIG}"

        async def admitted() -> bool:
            return (await curl(big, "-r", "0-0"))[0] == 206

        await testing.eventually(admitted)
        data = FILES[BIG]
        assert await curl(big, "-r", "1000-1999") == (206, data[1000:2000])
        assert await curl(big, "-r", f"{len(data) - 10}-") == (206, data[-10:])
        assert await curl(big, "-r", "-7") == (206, data[-7:])
        assert await curl(big) == (200, data)
        assert (await curl(big, "-r", f"{len(data)}-"))[0] == 416
        # Only what the manifest lists: not the marker, not a path out of the tree, not a link
        tree = c.settings("node-a").cache_root / "published" / hex_ / "tree"
        os.chmod(tree, 0o755)
        (tree / "link.txt").symlink_to(tree / "config.json")
        for path in ("marker", "../marker", "%2E%2E/marker", "link.txt", "tokenizer"):
            code, _ = await curl(f"/peer/v1/trees/{hex_}/files/{path}", "--path-as-is")
            assert code == 404, path
        # the manifest's own file replaced by a link is refused, not followed
        (tree / "config.json").unlink()
        (tree / "config.json").symlink_to(tree / "tokenizer" / "vocab.txt")
        assert (await curl(f"/peer/v1/trees/{hex_}/files/config.json"))[0] == 404
        # a digest that is not published (only a partial attempt) is never served
        other = "0" * 64
        (c.settings("node-a").cache_root / "partial" / other / "1" / "tree").mkdir(parents=True)
        assert (await curl(f"/peer/v1/trees/{other}"))[0] == 404


async def test_an_artifact_pinned_to_its_expected_digest_is_filled_from_peers_only(
    tmp_path: Path,
) -> None:
    hex_ = manifest_of(FILES).digest[7:]
    async with cluster(tmp_path) as c, agents(c, "node-a", "node-b"):
        assert c.record is not None
        anchored = msgspec.structs.replace(
            c.record, name="anchored", uid="u-2", revision=None, digest_source="Expected"
        )
        bucket = await kv.open_bucket(c.conn, kv.AGENTS_BUCKET)
        await bucket.put_record(kv.artifact_key("team-a", "anchored"), anchored)
        settings_b = c.settings("node-b")
        target = settings_b.pods_dir / "q" / "volumes" / "kubernetes.io~csi" / "m" / "mount"
        target.parent.mkdir(parents=True)
        request = publish_request(anchored, target, volume_id="csi-anchored")

        async def refused() -> bool:
            code, message = await c.ask("node-b", request)
            return code == "UNAVAILABLE" and "no peer holds it" in message

        # node-b asks while no peer holds it: a failure that says so, and no Hub request
        await testing.eventually(refused, timeout_s=30)
        assert c.hub.seen == []
        async with listener(c) as offers:
            await c.publish("node-a")  # node-a fetches it from the Hub for its own artifact
            await offered(offers, "node-a", hex_)
        hub_requests = len(c.hub.seen)
        published = settings_b.cache_root / "published" / hex_ / "marker"

        async def filled() -> bool:
            await c.ask("node-b", request)  # asks again once the backoff ends
            return published.is_file()

        await testing.eventually(filled, timeout_s=30)
        assert len(c.hub.seen) == hub_requests  # every byte from node-a
        tree = published.parent / "tree"
        assert all((tree / p).read_bytes() == d for p, d in FILES.items())


async def test_a_peer_that_missed_the_askers_offer_admits_it_once_it_announces_again(
    tmp_path: Path,
) -> None:
    """node-b's one offer went out before node-a subscribed, and node-b does not announce
    again on its own (its tick is an hour): node-a refuses it as an ``unknown-node``, and
    node-b's client answers that by announcing at once and asking again."""
    hex_ = manifest_of(FILES).digest[7:]
    key_b = jwt.NKey.generate("user")
    directory_b = peering.Directory("node-b")
    offer_b = peers.PeerOffer(node="node-b", url="http://127.0.0.1:1", key=key_b.public_key)

    async def own() -> peers.PeerOffer:
        return offer_b

    async with (
        cluster(tmp_path) as c,
        connection.connect(c.bus.settings_as(TOKENS["tok-node-b"], "tok-node-b")) as conn_b,
        anyio.create_task_group() as tg,
    ):
        async with listener(c) as offers:
            tg.start_soon(
                lambda: peering.follow(conn_b, directory_b, own, every_s=3600, tick_s=3600)
            )

            async def out() -> bool:  # node-b's offer went out before node-a exists
                return "node-b" in offers

            await testing.eventually(out)
        async with agents(c, "node-a"):
            await c.publish("node-a")

            async def held() -> bool:
                return bool(directory_b.holders(hex_))

            await testing.eventually(held, timeout_s=30)
            offer_a = directory_b.holders(hex_)[0]
            transport = http.Client(connect_s=10, stall_s=30, max_connections=4)
            try:  # without the retry, node-a refuses node-b: it never heard node-b's offer
                bare = peerclient.PeerClient(transport, node="node-b", key=key_b)
                with pytest.raises(AccessDenied, match="HTTP 401"):
                    await bare.manifest(offer_a, hex_)
            finally:
                await transport.aclose()
            async with peerclient.pull(directory_b, node="node-b", key=key_b) as pull:
                manifest = await pull.manifest(offer_a, hex_)
                assert manifest.digest == "sha256:" + hex_
        tg.cancel_scope.cancel()
