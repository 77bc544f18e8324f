"""The fake ModelScope and our client checked against an oracle we did not write: ModelScope's
own SDK, ``modelscope_hub`` (pinned in the ``dev`` extra). The SDK lists, builds file URLs and
checks tokens against the fake; what it reads must be the repository the test committed, and
what our client pins must be what the SDK sees."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import requests
from modelscope_hub import _legacy_api
from modelscope_hub._openapi import OpenAPIClient
from modelscope_hub.config import HubConfig

from hub import client as hub_client
from hub import modelscope, resolving
from hub.testing_modelscope import FakeModelScope, serving

pytestmark = pytest.mark.anyio
FILES = {f"d{d}/f{i}.bin": f"{d}-{i}".encode() * (i + 1) for d in range(3) for i in range(5)}
FILES["configuration.json"] = b"{}"


@pytest.fixture(autouse=True)
def _sdk_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reads and repairs ``~/.modelscope``: give it a home of its own."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("MODELSCOPE_API_TOKEN", "MODELSCOPE_ENDPOINT", "MODELSCOPE_DOMAIN"):
        monkeypatch.delenv(name, raising=False)


def _sdk_files(url: str, token: str | None, repo: str, commit: str) -> dict[str, tuple[int, str]]:
    sdk = _legacy_api.LegacyClient(token, url)
    entries: list[dict[str, Any]] = sdk.list_repo_files(repo, "model", revision=commit)
    return {e["Path"]: (e["Size"], e["Sha256"]) for e in entries if e["Type"] != "tree"}


async def test_the_sdk_and_our_client_see_the_same_cut_repository(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both walk the tree past a cut answer (the SDK's own limit lowered to the fake's)."""
    monkeypatch.setattr(_legacy_api, "REPO_FILES_TRUNCATION_LIMIT", 10)
    fake = FakeModelScope(cap=10)
    commit = fake.add("org/many", FILES)
    expected = {p: (len(c), hashlib.sha256(c).hexdigest()) for p, c in FILES.items()}
    async with serving(fake) as url:
        seen = await anyio.to_thread.run_sync(_sdk_files, url, None, "org/many", commit)
        async with hub_client.client(
            hub_client.HubSettings(endpoint=url), kind=modelscope.ModelScopeClient
        ) as hub:
            assert isinstance(hub, modelscope.ModelScopeClient)
            hub.listing_cap = 10
            manifest = await resolving.listing(hub, "org/many", commit, token=None)
    assert seen == expected
    assert {e.path: (e.size, e.oid) for e in manifest.entries} == expected


async def test_file_urls_match_the_sdk_and_serve_the_bytes() -> None:
    fake = FakeModelScope()
    path = "d1/f3.bin"
    commit = fake.add("org/m", {path: b"weights", "a b+c.json": b"{}"})
    async with serving(fake) as url:
        sdk = _legacy_api.LegacyClient(None, url)
        async with hub_client.client(
            hub_client.HubSettings(endpoint=url), kind=modelscope.ModelScopeClient
        ) as hub:
            for name, content in ((path, b"weights"), ("a b+c.json", b"{}")):
                sdk_url = sdk.get_download_url("org/m", "model", name, revision=commit)
                assert str(hub.file_url("org/m", commit, name)) == sdk_url
                got = await anyio.to_thread.run_sync(
                    lambda u=sdk_url: requests.get(u, timeout=10).content
                )
                assert got == content


async def test_the_sdk_lists_a_private_repository_with_the_token_only() -> None:
    fake = FakeModelScope()
    commit = fake.add("org/private", {"w.bin": b"secret"}, token="ms-good")
    async with serving(fake) as url:
        seen = await anyio.to_thread.run_sync(_sdk_files, url, "ms-good", "org/private", commit)
        with pytest.raises(Exception, match="401|login|uthenticat|ermission"):
            await anyio.to_thread.run_sync(_sdk_files, url, None, "org/private", commit)
    assert seen == {"w.bin": (6, hashlib.sha256(b"secret").hexdigest())}


async def test_the_sdk_token_check_agrees_with_the_fake() -> None:
    fake = FakeModelScope()
    fake.users["ms-good"] = "alice"
    async with serving(fake) as url:

        def me(token: str) -> Any:
            return OpenAPIClient(HubConfig(endpoint=url, token=token)).get_current_user()

        user = await anyio.to_thread.run_sync(me, "ms-good")
        with pytest.raises(Exception, match="401|nvalid|uthenticat"):
            await anyio.to_thread.run_sync(me, "ms-bad")
    assert user["username"] == "alice"
