"""The Hugging Face environment conventions: token sources, offline mode, proxies.

Proxies are proven against real servers: a second fake Hub stands in for an HTTP proxy (an
HTTP proxy receives ``GET http://host/path`` and answers it), the Hub's own name does not
resolve, so only a request that went through the proxy can succeed.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import hub
from hub import client as hub_client
from hub import endpoints, testing
from hub.errors import SourceUnavailable

pytestmark = pytest.mark.anyio

FILES = {"config.json": b'{"a": 1}', "weights.bin": b"\x02" * 4096}


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[testing.FakeHub, testing.Endpoints]]:
    fake = testing.FakeHub(tmp_path / "hub")
    async with testing.serving(fake) as ep:
        yield fake, ep


def test_hf_token_wins_over_the_legacy_variable_and_the_login_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    env = {"HF_HOME": str(tmp_path), "HUGGING_FACE_HUB_TOKEN": "legacy", "HF_TOKEN": "new"}
    assert endpoints.token_from(env) == "new"
    del env["HF_TOKEN"]
    assert endpoints.token_from(env) == "legacy"
    del env["HUGGING_FACE_HUB_TOKEN"]
    assert endpoints.token_from(env) == "from-file"


def test_the_token_file_comes_from_hf_token_path_else_hf_home_else_the_cache(
    tmp_path: Path,
) -> None:
    (tmp_path / "elsewhere").write_text("path-token")
    (tmp_path / "home" / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / "home" / ".cache" / "huggingface" / "token").write_text("cache-token\n")
    home = {"HOME": str(tmp_path / "home")}
    assert endpoints.token_from({**home, "HF_TOKEN_PATH": str(tmp_path / "elsewhere")}) == (
        "path-token"
    )
    assert endpoints.token_from(home) == "cache-token"
    assert endpoints.token_from({**home, "HF_HOME": str(tmp_path / "empty")}) is None
    (tmp_path / "blank").write_text("\n")
    assert endpoints.token_from({"HF_TOKEN_PATH": str(tmp_path / "blank")}) is None


def test_offline_and_proxies_are_read_in_either_case() -> None:
    env = endpoints.environment(
        {
            "HF_HUB_OFFLINE": "1",
            "https_proxy": "http://proxy:3128",
            "HTTP_PROXY": "http://plain:3128",
            "NO_PROXY": "internal.example, .corp ,10.0.0.0/8,",
        }
    )
    assert env.offline
    assert (env.https_proxy, env.http_proxy) == ("http://proxy:3128", "http://plain:3128")
    assert env.no_proxy == ("internal.example", ".corp", "10.0.0.0/8")
    assert not endpoints.environment({"HF_HUB_OFFLINE": "0"}).offline
    assert "secret" not in repr(endpoints.environment({"HF_TOKEN": "secret"}))


@pytest.mark.parametrize(
    ("host", "port", "exempt"),
    [
        ("huggingface.co", 443, False),
        ("internal.example", 443, True),
        ("hub.internal.example", 443, True),
        ("notinternal.example", 443, False),
        ("mirror.corp", 443, True),
        ("10.1.2.3", 443, True),
        ("11.1.2.3", 443, False),
        ("mirror.local", 8080, True),
        ("mirror.local", 443, False),
    ],
)
def test_no_proxy_matches_names_subdomains_ports_and_networks(
    host: str, port: int, exempt: bool
) -> None:
    entries = ("internal.example", ".corp", "10.0.0.0/8", "mirror.local:8080")
    assert endpoints.bypasses(entries, host, port) is exempt
    assert endpoints.bypasses(("*",), host, port)


async def test_offline_makes_no_request(fake: tuple[testing.FakeHub, testing.Endpoints]) -> None:
    server, ep = fake
    server.add("org/m", FILES)
    settings = hub_client.HubSettings(endpoint=ep.hub, offline=True)
    async with hub_client.client(settings) as client:
        with pytest.raises(SourceUnavailable, match="HF_HUB_OFFLINE"):
            await hub.resolve("org/m", hub=client)
    assert server.seen == []


async def test_http_proxy_carries_the_requests(
    fake: tuple[testing.FakeHub, testing.Endpoints],
) -> None:
    proxy, ep = fake
    commit = proxy.add("org/m", FILES)
    env = endpoints.environment({"HTTP_PROXY": ep.hub})
    unreachable = "http://hub.invalid"
    async with hub_client.client(hub_client.HubSettings.of(unreachable, env)) as client:
        manifest = await hub.resolve("org/m", hub=client)
    assert manifest.commit == commit
    assert {s.host for s in proxy.seen} == {"hub.invalid"}


async def test_no_proxy_goes_direct_and_only_then(
    fake: tuple[testing.FakeHub, testing.Endpoints],
) -> None:
    server, ep = fake
    server.add("org/m", FILES)
    with socket.socket() as s:  # a port nobody listens on: the "proxy" refuses
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    direct = endpoints.environment({"HTTP_PROXY": dead, "NO_PROXY": "127.0.0.1"})
    async with hub_client.client(hub_client.HubSettings.of(ep.hub, direct)) as client:
        await hub.resolve("org/m", hub=client)
    proxied = endpoints.environment({"HTTP_PROXY": dead})
    async with hub_client.client(hub_client.HubSettings.of(ep.hub, proxied)) as client:
        with pytest.raises(SourceUnavailable):
            await hub.resolve("org/m", hub=client)
