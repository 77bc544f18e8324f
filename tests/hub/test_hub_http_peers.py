"""hub.http (our own HTTP/1.1 client) against real peers it did not write: Debian's nginx
(keep-alive, chunked, ranges, conditional GETs, redirects, TLS with a CA of our own) and
tinyproxy (a forward proxy: absolute-form GETs, CONNECT for https, Basic authentication).

The oracle for connection reuse and for where the token went is nginx's own access log
(:mod:`peers`); bodies are compared with the files nginx served.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Iterator, Mapping

import pytest
from peers import PROXY_PASSWORD, PROXY_USER, Peers, running_peers

from hub import client as hub_client
from hub import http
from hub.errors import SourceUnavailable
from hub.urls import Url

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

BIG = 5 * 1024 * 1024 + 7
"""Over hub.framing.HIGH_WATER: reading pauses and resumes while it streams."""


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peers]:
    with running_peers(tmp_path_factory.mktemp("peers")) as running:
        files = running.www / "files"
        (files / "small.txt").write_bytes(b"hello from nginx\n" * 40)
        (files / "big.bin").write_bytes(os.urandom(BIG))
        (files / "text.txt").write_bytes(
            b"".join(b"line %d of a text file\n" % i for i in range(20000))
        )
        yield running


def _client(peers: Peers | None = None, **kw: object) -> http.Client:
    return http.Client(
        connect_s=10.0, stall_s=10.0, max_connections=4,
        ca_file=peers.ca_file if peers is not None else None, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


async def _get(
    client: http.Client,
    url: str,
    headers: Mapping[str, str] | None = None,
    proxy: str | None = None,
) -> tuple[int, Mapping[str, str], bytes]:
    response = await client.get(Url(url), {"User-Agent": "peers-test", **(headers or {})}, proxy)
    try:
        return response.status, response.headers, await response.read(64 << 20)
    finally:
        response.release()


@pytest.fixture
def tag() -> str:
    """Makes a test's request URIs its own in nginx's log (each test runs once per loop)."""
    return os.urandom(6).hex()


def _requests(peers: Peers, port: int, *uris: str) -> list[tuple[int, int]]:
    """(connection, request number on it) of each request to ``port`` with one of ``uris``,
    in the log's order."""
    return [(c, n) for p, u, c, n, _, _ in peers.logged(*uris) if p == str(port) and u in uris]


async def test_keep_alive_serves_many_requests_on_one_nginx_connection(
    peers: Peers, tag: str
) -> None:
    small = (peers.www / "files" / "small.txt").read_bytes()
    client = _client()
    try:
        for i in range(25):
            status, _, body = await _get(
                client, f"http://127.0.0.1:{peers.plain}/files/small.txt?{tag}={i}"
            )
            assert (status, body) == (200, small)
    finally:
        await client.aclose()
    logged = _requests(peers, peers.plain, *(f"/files/small.txt?{tag}={i}" for i in range(25)))
    assert len({c for c, _ in logged}) == 1  # one connection, as nginx counted it
    assert [n for _, n in logged] == list(range(1, 26))


async def test_a_connection_nginx_closes_after_its_last_request_is_not_reused(
    peers: Peers, tag: str
) -> None:
    """nginx answers the last request a connection may carry with ``Connection: close`` and
    closes it: the client opens a new one for the next request, with no failure."""
    small = (peers.www / "files" / "small.txt").read_bytes()
    client = _client()
    uris = [f"/files/small.txt?{tag}={i}" for i in range(7)]
    said = []
    try:
        for uri in uris:
            status, headers, body = await _get(client, f"http://127.0.0.1:{peers.short}{uri}")
            assert (status, body) == (200, small)
            said.append(headers["connection"])
    finally:
        await client.aclose()
    assert said == ["keep-alive", "keep-alive", "close"] * 2 + ["keep-alive"]
    logged = _requests(peers, peers.short, *uris)
    assert [n for _, n in logged] == [1, 2, 3, 1, 2, 3, 1]
    assert len({c for c, _ in logged}) == 3


async def test_a_body_over_the_high_water_mark_streams_whole(peers: Peers, tag: str) -> None:
    data = (peers.www / "files" / "big.bin").read_bytes()
    client = _client()
    try:
        response = await client.get(Url(f"http://127.0.0.1:{peers.plain}/files/big.bin?{tag}"), {})
        digest, size = hashlib.sha256(), 0
        try:
            assert response.content_length == BIG
            async for piece in response.pieces():
                digest.update(piece)
                size += len(piece)
        finally:
            response.release()
        assert size == BIG and digest.digest() == hashlib.sha256(data).digest()
        # and the connection served the next request
        after = f"http://127.0.0.1:{peers.plain}/files/small.txt?{tag}"
        assert (await _get(client, after))[0] == 200
    finally:
        await client.aclose()
    big, small = _requests(peers, peers.plain, f"/files/big.bin?{tag}", f"/files/small.txt?{tag}")
    assert big[0] == small[0]


async def test_nginx_s_chunked_gzip_answer_is_read_and_the_connection_kept(
    peers: Peers, tag: str
) -> None:
    text = (peers.www / "files" / "text.txt").read_bytes()
    client = _client()
    url = f"http://127.0.0.1:{peers.plain}/files/text.txt"
    try:
        status, headers, body = await _get(client, url + f"?gz{tag}", {"Accept-Encoding": "gzip"})
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        assert headers["content-encoding"] == "gzip" and "content-length" not in headers
        assert gzip.decompress(body) == text
        status, headers, body = await _get(
            client, url + f"?plain{tag}", {"Accept-Encoding": "identity"}
        )
        assert (status, body) == (200, text)
    finally:
        await client.aclose()
    first, second = _requests(
        peers, peers.plain, f"/files/text.txt?gz{tag}", f"/files/text.txt?plain{tag}"
    )
    assert first[0] == second[0] and second[1] == first[1] + 1


async def test_byte_ranges_from_nginx(peers: Peers) -> None:
    data = (peers.www / "files" / "big.bin").read_bytes()
    client = _client()
    url = f"http://127.0.0.1:{peers.plain}/files/big.bin"
    try:
        status, headers, body = await _get(client, url, {"Range": "bytes=100-199"})
        assert (status, body) == (206, data[100:200])
        assert headers["content-range"] == f"bytes 100-199/{BIG}"
        status, _, body = await _get(client, url, {"Range": f"bytes={BIG - 10}-"})
        assert (status, body) == (206, data[-10:])  # a resumed download's tail
        status, _, body = await _get(client, url, {"Range": "bytes=-5"})
        assert (status, body) == (206, data[-5:])
        status, headers, _ = await _get(client, url, {"Range": f"bytes={BIG + 1}-"})
        assert status == 416 and headers["content-range"] == f"bytes */{BIG}"
        status, _, body = await _get(client, url, {"Range": "bytes=0-3"})
        assert (status, body) == (206, data[:4])  # the connection survived the 416
    finally:
        await client.aclose()


async def test_a_conditional_get_answered_304_has_no_body_and_keeps_the_connection(
    peers: Peers, tag: str
) -> None:
    client = _client()
    url = f"http://127.0.0.1:{peers.plain}/files/small.txt"
    try:
        status, headers, _ = await _get(client, url + f"?first{tag}")
        status, _, body = await _get(
            client, url + f"?etag{tag}", {"If-None-Match": headers["etag"]}
        )
        assert (status, body) == (304, b"")
        status, _, body = await _get(client, url + f"?next{tag}")
        assert status == 200 and body
    finally:
        await client.aclose()
    rows = _requests(
        peers, peers.plain, *(f"/files/small.txt?{q}{tag}" for q in ("first", "etag", "next"))
    )
    assert len(rows) == 3 and len({c for c, _ in rows}) == 1


async def test_tls_with_the_ca_given_and_refused_without_it(peers: Peers) -> None:
    small = (peers.www / "files" / "small.txt").read_bytes()
    client = _client(peers)
    try:
        for host in ("127.0.0.1", "localhost"):
            status, _, body = await _get(client, f"https://{host}:{peers.tls}/files/small.txt?tls")
            assert (status, body) == (200, small)
        status, _, body = await _get(client, f"https://127.0.0.1:{peers.tls}/files/big.bin")
        assert status == 200 and len(body) == BIG
    finally:
        await client.aclose()
    stranger = _client()  # the system's CAs only: nginx's certificate is not theirs
    try:
        with pytest.raises(http.HttpError, match="certificate"):
            await _get(stranger, f"https://127.0.0.1:{peers.tls}/files/small.txt")
    finally:
        await stranger.aclose()


def _hub(peers: Peers, endpoint: str, **kw: object) -> hub_client.HubSettings:
    return hub_client.HubSettings(endpoint=endpoint, ca_file=peers.ca_file, **kw)  # type: ignore[arg-type]


async def test_redirects_are_followed_on_kept_connections_and_the_token_stays_home(
    peers: Peers, tag: str
) -> None:
    small = (peers.www / "files" / "small.txt").read_bytes()
    plain = f"http://127.0.0.1:{peers.plain}"
    async with (
        hub_client.client(_hub(peers, plain)) as hub,
        hub._get(Url(f"{plain}/moved-twice?{tag}"), "tok") as response,  # 301, then 302
    ):
        assert (response.status, await response.read(1 << 20)) == (200, small)
    uris = (f"/moved-twice?{tag}", f"/moved?{tag}", f"/files/small.txt?{tag}")
    rows = [r for r in peers.logged(*uris) if r[1] in uris]
    assert [(r[1], r[4]) for r in rows] == list(zip(uris, ("301", "302", "200"), strict=True))
    assert len({r[2] for r in rows}) == 1 and all(r[5] for r in rows)  # one connection, token sent

    tls = f"https://127.0.0.1:{peers.tls}"
    async with (
        hub_client.client(_hub(peers, tls)) as hub,
        hub._get(Url(f"{tls}/to-plain?{tag}x"), "tok") as response,
    ):
        assert (response.status, await response.read(1 << 20)) == (200, small)
    hop, landed = (r for r in peers.logged(f"/files/small.txt?{tag}x") if r[1].endswith(f"?{tag}x"))
    assert (hop[1], hop[5]) == (f"/to-plain?{tag}x", True)
    assert landed[0] == str(peers.plain) and landed[5] is False  # never downgraded to http


async def test_tinyproxy_forwards_plain_gets_with_the_proxy_s_basic_credentials(
    peers: Peers,
) -> None:
    small = (peers.www / "files" / "small.txt").read_bytes()
    client = _client()
    url = f"http://127.0.0.1:{peers.plain}/files/small.txt?via-proxy"
    try:
        proxy = f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{peers.proxy}"
        for _ in range(3):
            status, _, body = await _get(client, url, proxy=proxy)
            assert (status, body) == (200, small)
        status, _, _ = await _get(client, url, proxy=f"http://127.0.0.1:{peers.proxy}")
        assert status == 407  # tinyproxy wants the credentials
    finally:
        await client.aclose()


async def test_tinyproxy_tunnels_https_with_connect(peers: Peers) -> None:
    data = (peers.www / "files" / "big.bin").read_bytes()
    client = _client(peers)
    url = f"https://127.0.0.1:{peers.tls}/files/big.bin"
    try:
        proxy = f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{peers.proxy}"
        for _ in range(2):
            status, _, body = await _get(client, url, {"Range": "bytes=10-4000000"}, proxy)
            assert (status, body) == (206, data[10:4000001])
        with pytest.raises(http.HttpError, match="refused CONNECT .* 407"):
            await _get(client, url, proxy=f"http://127.0.0.1:{peers.proxy}")
    finally:
        await client.aclose()


async def test_aclose_returns_once_every_connection_is_gone_tls_tunnels_included(
    peers: Peers,
) -> None:
    """A TLS close is an exchange with the peer (here through tinyproxy): ``close()`` only starts
    it; ``aclose()`` waits for it, so a loop that ends next holds no transport (uvloop refuses
    to close with one open, which is how these tests found it)."""
    client = _client(peers)
    proxy = f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{peers.proxy}"
    await _get(client, f"https://127.0.0.1:{peers.tls}/files/small.txt?tunnel", proxy=proxy)
    await _get(client, f"https://127.0.0.1:{peers.tls}/files/small.txt?direct")
    await _get(client, f"http://127.0.0.1:{peers.plain}/files/small.txt?plain")
    streams = [conn.stream for conn in client._open]
    assert len(streams) == 3 and not any(s.closed for s in streams)
    await client.aclose()
    assert all(s.gone.is_set() and s.closed for s in streams)
    assert not client._open


async def test_the_hub_client_reports_a_refused_tunnel_in_one_line(peers: Peers) -> None:
    tls = f"https://127.0.0.1:{peers.tls}"
    settings = _hub(peers, tls, proxy=f"http://127.0.0.1:{peers.proxy}")
    async with hub_client.client(settings) as hub:
        with pytest.raises(SourceUnavailable, match="407") as refused:
            async with hub._get(Url(f"{tls}/files/small.txt"), None):
                pass
    assert "\n" not in str(refused.value)
