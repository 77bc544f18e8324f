"""The peer pieces alone: the server (agent/models/peerserver.py) over a real socket (its stream
limit, a slow reader, against aiohttp's client), the Range parser, the directory of offers, and
the materializer passing over peers that fail to the Hub."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import anyio
import msgspec
import pytest
from aiohttp import web
from models_harness import TUNING

from agent.models import downloading, layout, materializing, peerclient, peering, peerserver
from agent.models.errors import Materializing
from agent.models.metrics import ModelMetrics
from bus import embedded, jwt, peers, testing
from hub import client as hub_client
from hub import resolving
from hub import testing as hub_testing
from hub.manifest import Entry, Manifest

pytestmark = pytest.mark.anyio

BIG = bytes(range(256)) * (96 * 1024)  # 24 MiB: more than loopback's socket buffers hold
KEY = jwt.NKey.generate("user")


def publish(root: Path, files: dict[str, bytes]) -> str:
    """A published tree as the materializer leaves one (marker, manifest, tree/)."""
    cache = layout.Cache.open(root)
    manifest = Manifest.of(
        Entry("sha256", hashlib.sha256(d).hexdigest(), len(d), p) for p, d in files.items()
    )
    hex_ = manifest.digest[7:]
    base = cache.published / hex_
    for path, data in files.items():
        (base / "tree" / path).parent.mkdir(parents=True, exist_ok=True)
        (base / "tree" / path).write_bytes(data)
    (base / "manifest").write_text(manifest.text())
    marker = layout.Marker(digest=manifest.digest, attempt=1, size_bytes=manifest.size,
                           file_count=len(files), published_time=datetime.now(UTC))  # fmt: skip
    (base / "marker").write_bytes(msgspec.json.encode(marker))
    return hex_


def offer_of(node: str, key: jwt.NKey = KEY) -> tuple[str, bytes]:
    offer = peers.PeerOffer(node=node, url="http://127.0.0.1:1", key=key.public_key)
    return peers.subject(node), peers.encode_offer(offer)


@asynccontextmanager
async def server(
    root: Path, directory: peering.Directory | None = None, **settings: float
) -> AsyncIterator[str]:
    """``srv``'s peer server, over ``directory`` (default: one that knows ``cli``)."""
    if directory is None:
        directory = peering.Directory("srv")
        directory.on_message(*offer_of("cli"))
    s = peering.PeerSettings(port=0, bind_address="127.0.0.1", address="127.0.0.1", **settings)  # type: ignore[arg-type]
    served = peerserver.PeerServer("srv", layout.Cache.open(root), directory, s)
    async with peerserver.serve(served) as endpoint:
        yield endpoint.url


def signed(path: str, client: str = "cli", key: jwt.NKey = KEY) -> dict[str, str]:
    return {"Authorization": peers.authorization(key, "srv", client, int(time.time()), path)}


async def test_a_slow_reader_gets_the_whole_file_and_a_busy_server_says_503(tmp_path: Path) -> None:
    hex_ = publish(tmp_path, {"big.bin": BIG})
    path = f"/peer/v1/trees/{hex_}/files/big.bin"
    async with (
        server(tmp_path, serving_streams=1, queue_s=0.2) as url,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(url + path, headers=signed(path)) as slow:
            assert slow.status == 200
            first = await slow.content.read(1024 * 1024)
            # The one stream is taken by the slow reader: the next request waits queue_s, then 503
            async with s.get(url + path, headers=signed(path)) as busy:
                assert busy.status == 503
                assert (await busy.text()).strip() == "every serving stream is busy"
            await anyio.sleep(0.5)  # well past queue_s: the sending itself is never cut short
            rest = await slow.content.read()
        assert first + rest == BIG
        async with s.get(url + path, headers=signed(path)) as again:  # the slot came back
            assert again.status == 200 and await again.read() == BIG


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-0", (0, 1)),
        ("bytes=10-19", (10, 20)),
        ("bytes=10-", (10, 100)),
        ("bytes=90-500", (90, 100)),  # a last byte past the end is the end
        ("bytes=-7", (93, 100)),
        ("bytes=-500", (0, 100)),
        ("bytes=0-1,5-6", None),  # several ranges: answered whole
        ("items=0-1", None),  # another unit: ignored
        ("bytes=x-1", None),
    ],
)
def test_range_header(header: str | None, expected: tuple[int, int] | None) -> None:
    assert peerserver.parse_range(header, 100) == expected


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=150-160", "bytes=-0"])
def test_an_unsatisfiable_range_is_refused(header: str) -> None:
    with pytest.raises(ValueError):
        peerserver.parse_range(header, 100)


def test_the_directory_forgets_lapsed_offers_and_greets_newcomers() -> None:
    now = [0.0]
    d = peering.Directory("me", clock=lambda: now[0])
    mine = peers.PeerOffer(node="me", url="http://127.0.0.1:1", key=KEY.public_key)
    d.on_message(peers.subject("me"), peers.encode_offer(mine))
    assert d.keys() == {} and not d.newcomer  # our own offer echoed back is not a peer
    other = peers.PeerOffer(node="a", url="http://127.0.0.1:2", key=KEY.public_key,
                            digests=("cd" * 32,))  # fmt: skip
    d.on_message(peers.subject("a"), peers.encode_offer(other))
    assert d.newcomer and d.holders("cd" * 32) == [other] and d.holders("ef" * 32) == []
    d.newcomer = False
    now[0] = peers.OFFER_TTL_S - 1
    d.on_message(peers.subject("a"), peers.encode_offer(other))  # a renewal: no greeting
    assert not d.newcomer
    now[0] += peers.OFFER_TTL_S + 1
    assert d.keys() == {}  # lapsed
    d.on_message(peers.subject("a"), b"garbage")
    assert d.keys() == {} and not d.newcomer
    d.on_message(peers.subject("a"), peers.encode_offer(other))
    assert d.newcomer  # back after lapsing: greeted again


async def test_a_dead_peer_and_a_peer_with_another_manifest_cost_only_the_fallback_to_the_hub(
    tmp_path: Path,
) -> None:
    files = {"config.json": b"{}", "weights.bin": BIG[: 3 * 1024 * 1024]}
    fake = hub_testing.FakeHub(tmp_path / "hub")
    commit = fake.add("org/m", files)
    # a peer that answers with the manifest of other files (signed requests or not)
    other = Manifest.of([Entry("sha256", "ab" * 32, 1, "x")]).text()

    async def liar(_: web.Request) -> web.Response:
        return web.Response(text=other)

    app = web.Application()
    app.router.add_get("/peer/v1/trees/{hex}", liar)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    directory = peering.Directory("me")
    try:
        async with (
            hub_testing.serving(fake) as ep,
            hub_client.client(hub_client.HubSettings(endpoint=ep.hub)) as hub,
        ):
            manifest = await resolving.listing(hub, "org/m", commit, token=None)
            hex_ = manifest.digest[7:]
            for node, url in (("dead", f"http://127.0.0.1:{embedded.free_port()}"),
                              ("liar", f"http://127.0.0.1:{port}")):  # fmt: skip
                offer = peers.PeerOffer(node=node, url=url, key=KEY.public_key, digests=(hex_,))
                directory.on_message(peers.subject(node), peers.encode_offer(offer))
            assert len(directory.holders(hex_)) == 2
            cache = layout.Cache.open(tmp_path / "cache")
            async with peerclient.pull(directory, node="me", key=KEY) as pull:
                done = anyio.Event()
                m = materializing.Materializer(
                    cache, hub, downloading.Limits(8, 0), tuning=TUNING, metrics=ModelMetrics(),
                    changed=lambda: None if hex_ in m.jobs else done.set(), peers=pull,
                )  # fmt: skip

                async def reserve(_: str, __: int) -> None:
                    return None

                async with anyio.create_task_group() as tg:
                    await tg.start(m.run, reserve)
                    with pytest.raises(Materializing):
                        m.ensure(hex_, materializing.Source("org/m", commit, None))
                    with anyio.fail_after(30):
                        await done.wait()
                    tg.cancel_scope.cancel()
    finally:
        await runner.cleanup()
    marker = cache.marker(hex_)
    assert marker is not None and marker.source == "Hub"
    tree = cache.tree(hex_)
    assert all((tree / p).read_bytes() == d for p, d in files.items())
    assert any("/resolve/" in s.path for s in fake.seen)


async def test_paths_that_need_escaping_are_signed_as_sent(tmp_path: Path) -> None:
    files = {"dir/a b.txt": b"spaced", "\u00fc/\u6a21\u578b.json": b"{}", "p%20q#r?.bin": b"odd"}
    hex_ = publish(tmp_path, files)
    async with server(tmp_path) as url:
        offer = peers.PeerOffer(node="srv", url=url, key=KEY.public_key, digests=(hex_,))
        directory = peering.Directory("cli")
        directory.on_message(peers.subject("srv"), peers.encode_offer(offer))
        async with peerclient.pull(directory, node="cli", key=KEY) as pull:
            manifest = await pull.manifest(offer, hex_)
            source = pull.files(offer, hex_)
            for entry in manifest.entries:
                got = await source.whole("", "", entry.path, token=None, size=entry.size)
                assert b"".join(got) == files[entry.path]
                async with source.download("", "", entry.path, token=None, start=1) as body:
                    rest = b"".join([bytes(p) async for p in body.pieces()])
                assert (body.start, rest) == (1, files[entry.path][1:])


def test_an_offer_of_a_huge_cache_stays_one_valid_message() -> None:
    p = peering.Peering("me", peering.PeerSettings(port=0), url="http://10.0.0.1:32445")
    hexes = [f"{i:064x}" for i in range(peers.MAX_DIGESTS + 10)]
    offer = p.offer(hexes)
    assert offer is not None and len(offer.digests) == peers.MAX_DIGESTS
    payload = peers.encode_offer(offer)
    assert len(payload) < 1024 * 1024  # NATS's default max_payload
    assert peers.decode_offer(peers.subject("me"), payload) == offer
    assert peering.Peering("me", peering.PeerSettings(port=0)).offer(hexes) is None  # no URL yet


async def test_one_asking_node_gets_at_most_streams_per_source_and_others_still_get_theirs(
    tmp_path: Path,
) -> None:
    hex_ = publish(tmp_path, {"big.bin": BIG})
    path = f"/peer/v1/trees/{hex_}/files/big.bin"
    directory = peering.Directory("srv")
    other = jwt.NKey.generate("user")
    directory.on_message(*offer_of("cli"))
    directory.on_message(*offer_of("cli2", other))
    async with (
        server(tmp_path, directory, serving_streams=8, streams_per_source=1, queue_s=0.2) as url,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(url + path, headers=signed(path)) as slow:
            assert slow.status == 200
            first = await slow.content.read(1024 * 1024)
            # cli holds its one stream: its next request is refused, though 7 streams are free
            async with s.get(url + path, headers=signed(path)) as busy:
                assert busy.status == 503
                assert (await busy.text()).strip() == "node cli has every stream it may"
            # cli2's share is its own
            async with s.get(url + path, headers=signed(path, "cli2", other)) as theirs:
                assert theirs.status == 200 and await theirs.read() == BIG
            rest = await slow.content.read()
        assert first + rest == BIG
        async with s.get(url + path, headers=signed(path)) as again:  # cli's stream came back
            assert again.status == 200 and await again.read() == BIG


async def test_streams_per_source_queue_a_node_over_its_share_until_one_is_released() -> None:
    streams = peerserver.Streams(2)
    await streams.acquire("a")
    await streams.acquire("a")
    got: list[str] = []

    async def third(node: str) -> None:
        await streams.acquire(node)
        got.append(node)

    async with anyio.create_task_group() as tg:
        tg.start_soon(third, "a")
        tg.start_soon(third, "b")
        await anyio.wait_all_tasks_blocked()
        assert got == ["b"] and streams.held("a") == 2  # a waits; b has a share of its own
        streams.release("a")
        await anyio.wait_all_tasks_blocked()
        assert got == ["b", "a"] and streams.held("a") == 2
    for node in ("a", "a", "b"):
        streams.release(node)
    assert streams.held("a") == streams.held("b") == 0


async def test_a_request_whose_offer_is_on_its_way_waits_for_it_and_a_stranger_is_told_unknown(
    tmp_path: Path,
) -> None:
    hex_ = publish(tmp_path, {"a.txt": b"a"})
    path = f"/peer/v1/trees/{hex_}"
    late = jwt.NKey.generate("user")
    directory = peering.Directory("srv")
    async with server(tmp_path, directory, hello_wait_s=30) as url, aiohttp.ClientSession() as s:
        answers: list[int] = []

        async def ask() -> None:
            async with s.get(url + path, headers=signed(path, "late", late)) as r:
                answers.append(r.status)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)

            async def held() -> bool:  # the request waits at the server for the offer
                return directory.waiting == 1

            await testing.eventually(held)
            assert answers == []
            directory.on_message(*offer_of("late", late))  # its offer arrives
        assert answers == [200]
    async with server(tmp_path, directory, hello_wait_s=0.1) as url, aiohttp.ClientSession() as s:
        async with s.get(url + path, headers=signed(path, "stranger", late)) as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"] == 'GPUStack-Peer error="unknown-node"'
            assert peers.is_unknown_node(r.headers["WWW-Authenticate"])
        async with s.get(url + path, headers=signed(path, "late", KEY)) as r:  # a wrong key
            assert r.status == 401 and r.headers["WWW-Authenticate"] == "GPUStack-Peer"
            assert not peers.is_unknown_node(r.headers["WWW-Authenticate"])
