"""The peer server alone (agent/models/peerserver.py) over a real socket: its stream limit,
and a slow reader, against aiohttp's client; the Range parser against what RFC 9110 says."""

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

from agent.models import layout, peering, peerserver
from bus import jwt, peers
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


@asynccontextmanager
async def server(root: Path, **settings: float) -> AsyncIterator[str]:
    directory = peering.Directory("srv")
    offer = peers.PeerOffer(node="cli", url="http://127.0.0.1:1", key=KEY.public_key)
    directory.on_message(peers.subject("cli"), peers.encode_offer(offer))
    s = peering.PeerSettings(port=0, bind_address="127.0.0.1", address="127.0.0.1", **settings)  # type: ignore[arg-type]
    served = peerserver.PeerServer("srv", layout.Cache.open(root), directory, s)
    async with peerserver.serve(served) as endpoint:
        yield endpoint.url


def signed(path: str) -> dict[str, str]:
    return {"Authorization": peers.authorization(KEY, "srv", "cli", int(time.time()), path)}


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
