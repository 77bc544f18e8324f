"""``--cors-allowed-origins`` on the HTTPS endpoint: anchored patterns, preflights, no CORS for
the agents (``cors_allowed_origins=None``)."""

from __future__ import annotations

import ssl

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from kit import serving

pytestmark = pytest.mark.anyio


async def _ask(
    patterns: tuple[str, ...] | None, origin: str, method: str = "GET"
) -> tuple[int, dict[str, str]]:
    settings = serving.HttpsSettings(
        bind_address="127.0.0.1", port=0, auth="none", cors_allowed_origins=patterns
    )
    headers = {"Origin": origin}
    if method == "OPTIONS":
        headers["Access-Control-Request-Method"] = "GET"
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    async with (
        serving.https_server(settings, registry=CollectorRegistry(), ready=lambda: True) as server,
        aiohttp.ClientSession() as http,
        http.request(method, server.url + "/metrics", headers=headers, ssl=context) as answer,
    ):
        return answer.status, dict(answer.headers)


async def test_a_matching_origin_gets_the_headers() -> None:
    status, headers = await _ask((r"https://ui\.example\.com",), "https://ui.example.com")
    assert status == 200
    assert headers["Access-Control-Allow-Origin"] == "https://ui.example.com"
    assert headers["Vary"] == "Origin"


async def test_patterns_are_anchored() -> None:
    for origin in ("https://ui.example.com.evil.net", "evil://https://ui.example.com"):
        status, headers = await _ask((r"https://ui\.example\.com",), origin)
        assert status == 200 and "Access-Control-Allow-Origin" not in headers


async def test_preflight_is_answered_by_the_endpoint() -> None:
    allowed, headers = await _ask(
        (r"https://.*\.example\.com",), "https://a.example.com", "OPTIONS"
    )
    refused, _ = await _ask((r"https://.*\.example\.com",), "https://a.other.org", "OPTIONS")
    assert allowed == 204 and "PATCH" in headers["Access-Control-Allow-Methods"]
    assert refused == 403


async def test_no_cors_handling_without_patterns() -> None:
    status, headers = await _ask(None, "https://anything.example")
    assert status == 200 and "Access-Control-Allow-Origin" not in headers
