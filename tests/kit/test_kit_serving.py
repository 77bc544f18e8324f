"""The shared HTTPS endpoint: TLS (self-signed or given), metrics, probes, extra routes, and the
authorization gate in front of every route but the probes."""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from test_kit_access import Table

from kit import listening, serving, testing, tls

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


def _client_context(pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=pem.decode())
    return context


async def _get(server: serving.Server, path: str) -> tuple[int, str, str]:
    context = _client_context(server.certificate_pem)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://localhost:{server.port}{path}", ssl=context) as response,
    ):
        return response.status, response.headers["Content-Type"], await response.text()


async def test_metrics_probes_and_routes_over_verified_tls() -> None:
    registry = CollectorRegistry()
    Counter("gpustack_test_events", "events", registry=registry).inc(3)
    state = {"ready": False}

    async def snapshot() -> serving.Response:
        return serving.Response(body=b'{"a": 1}', content_type="application/json")

    settings = serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="none")
    async with serving.https_server(
        settings, registry=registry, ready=lambda: state["ready"], routes={"/snap": snapshot}
    ) as server:
        assert server.port > 0
        status, _, text = await _get(server, "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert status == 200
        assert families["gpustack_test_events"].samples[0].value == 3.0
        assert (await _get(server, "/readyz"))[0] == 503
        state["ready"] = True
        assert (await _get(server, "/readyz"))[0] == 200
        assert (await _get(server, "/livez"))[0] == 200
        assert await _get(server, "/snap") == (200, "application/json", '{"a": 1}')
        assert (await _get(server, "/nope"))[0] == 404
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


async def test_certificate_from_cert_dir(tmp_path: Path) -> None:
    cert, key = tls.self_signed_certificate("node-7")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    settings = serving.HttpsSettings(bind_address="127.0.0.1", cert_dir=str(tmp_path), auth="none")
    async with serving.https_server(
        settings, registry=CollectorRegistry(), ready=lambda: True
    ) as s:
        assert s.certificate_pem == cert
        assert (await _get(s, "/livez"))[0] == 200


async def test_unusable_certificate_or_port_is_a_clear_error(tmp_path: Path) -> None:
    bad = serving.HttpsSettings(bind_address="127.0.0.1", cert_dir=str(tmp_path), auth="none")
    with pytest.raises(serving.ServingFailed, match="tls.crt"):
        async with serving.https_server(bad, registry=CollectorRegistry(), ready=lambda: True):
            pass
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = serving.HttpsSettings(bind_address="127.0.0.1", port=port, auth="none")
        with pytest.raises(serving.ServingFailed, match=f"127.0.0.1:{port}"):
            async with serving.https_server(busy, registry=CollectorRegistry(), ready=lambda: True):
                pass


async def _get_as(
    server: serving.Server, path: str, token: str | None = None
) -> aiohttp.ClientResponse:
    context = ssl.create_default_context(cadata=server.certificate_pem.decode())
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:
        url = f"https://localhost:{server.port}{path}"
        async with session.get(url, ssl=context, headers=headers) as response:
            await response.read()
            return response


async def _text(server: serving.Server, path: str, token: str | None = None) -> tuple[int, str]:
    response = await _get_as(server, path, token)
    return response.status, (await response.text()).strip()


async def test_every_route_but_the_probes_passes_the_authorizer() -> None:
    registry = CollectorRegistry()
    Counter("gpustack_test_scrapes", "scrapes", registry=registry).inc()
    table = Table()

    async def snapshot() -> serving.Response:
        return serving.Response(body=b"{}", content_type="application/json")

    settings = serving.HttpsSettings(bind_address="127.0.0.1", auth="review")
    async with serving.https_server(
        settings, registry=registry, ready=lambda: True, routes={"/snap": snapshot},
        authorizer=table,
    ) as server:  # fmt: skip
        assert await _text(server, "/livez") == (200, "ok")
        assert await _text(server, "/readyz") == (200, "ok")
        missing = await _get_as(server, "/metrics")
        assert (missing.status, missing.headers["WWW-Authenticate"]) == (401, "Bearer")
        assert await _text(server, "/metrics", "bad") == (401, "Unauthorized: invalid bearer token")
        assert await _text(server, "/snap", "other") == (
            403, "Forbidden (user=other, verb=get, path=/snap)",
        )  # fmt: skip
        status, text = await _text(server, "/metrics", "good")
        assert status == 200 and "gpustack_test_scrapes_total 1.0" in text
        assert await _text(server, "/snap", "good") == (200, "{}")
        for _ in range(3):
            assert (await _get_as(server, "/metrics", "good")).status == 200
        table.down = True
        assert await _text(server, "/snap", "fresh") == (
            503, "authorization unavailable: reviewer away",
        )  # fmt: skip
        assert (await _get_as(server, "/livez")).status == 200
    # Probes never reach the authorizer; each (token, route) was asked once: the rest was cached.
    assert table.asked == {
        ("bad", "/metrics"): 1, ("other", "/snap"): 1, ("good", "/metrics"): 1,
        ("good", "/snap"): 1, ("fresh", "/snap"): 1,
    }  # fmt: skip


async def test_review_without_an_authorizer_does_not_start() -> None:
    settings = serving.HttpsSettings(bind_address="127.0.0.1", auth="review")
    with pytest.raises(serving.ServingFailed, match="no authorizer"):
        async with serving.https_server(settings, registry=CollectorRegistry(), ready=lambda: True):
            pass


async def test_none_serves_everyone_and_asks_nobody() -> None:
    table = Table()
    settings = serving.HttpsSettings(bind_address="127.0.0.1", auth="none")
    async with serving.https_server(
        settings, registry=CollectorRegistry(), ready=lambda: True, authorizer=table
    ) as server:
        assert (await _get_as(server, "/metrics")).status == 200
    assert not table.asked


async def test_post_routes_get_the_body_and_refuse_one_past_the_bound() -> None:
    seen: list[bytes] = []

    async def echo(body: bytes) -> serving.Response:
        seen.append(body)
        return serving.Response(status=201, body=body[::-1], content_type="application/json")

    settings = serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="none")
    async with (
        serving.https_server(
            settings, registry=CollectorRegistry(), ready=lambda: True,
            posts={"/echo": echo}, max_body_bytes=1024,
        ) as server,
        aiohttp.ClientSession() as session,
    ):  # fmt: skip
        url, context = (
            f"https://localhost:{server.port}/echo",
            _client_context(server.certificate_pem),
        )
        async with session.post(url, data=b"abc", ssl=context) as response:
            assert (response.status, await response.read()) == (201, b"cba")
        async with session.post(url, data=b"x" * 4096, ssl=context) as response:
            assert response.status == 413

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: bounded all the same
            for _ in range(8):
                yield b"y" * 512

        async with session.post(url, data=chunks(), ssl=context) as response:
            assert response.status == 413
        async with session.get(url, ssl=context) as response:
            assert response.status == 405
    assert seen == [b"abc"]


@pytest.mark.parametrize("which", ["https", "metrics"])
async def test_a_start_cancelled_at_any_step_leaves_no_socket_bound(which: str) -> None:
    """asyncio's ``create_server``, cancelled at its last step, drops a server whose listening
    socket stays bound and registered with the loop; the start is shielded
    (:func:`listening.start_site`), so a cancellation at any loop turn of it leaves nothing."""
    registry = CollectorRegistry()
    settings = serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="none")

    def open_server() -> AbstractAsyncContextManager[object]:
        if which == "https":
            return serving.https_server(settings, registry=registry, ready=lambda: True)
        return serving.http_metrics_server("127.0.0.1", 0, registry)

    await testing.cancel_every_start(open_server)


def test_two_servers_starting_on_one_port_at_once_leave_one_serving_and_one_clear_error() -> None:
    """Two event loops (threads, each with uvloop) start on one port at the same moment: one
    serves, the other gets an ``OSError``. With the loop binding for aiohttp, the loser's failed
    ``listen`` came back as a server without a socket, an ``AttributeError`` (21 of 200 rounds
    on the machine that measured)."""
    import threading

    import uvloop
    from aiohttp import web

    outcomes: list[str] = []

    async def start(port: int, ready: threading.Barrier, done: threading.Barrier) -> None:
        runner = web.AppRunner(web.Application())
        await runner.setup()
        ready.wait()
        try:
            await listening.serve_tcp(runner, "127.0.0.1", port)
            outcomes.append("serving")
        except OSError:
            outcomes.append("OSError")
        except Exception as e:  # noqa: BLE001 - the failure this test is about
            outcomes.append(type(e).__name__)
        done.wait()  # the winner holds the port until the loser has tried
        await runner.cleanup()

    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        ready, done = threading.Barrier(2), threading.Barrier(2)
        threads = [
            threading.Thread(target=uvloop.run, args=(start(port, ready, done),)) for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert len(outcomes) == 200
    assert {o: outcomes.count(o) for o in set(outcomes)} == {"serving": 100, "OSError": 100}
