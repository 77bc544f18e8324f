"""The Hub client against a real HTTP server on loopback (hub.testing.FakeHub)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

import hub
from hub import client as hub_client
from hub import testing
from hub.errors import (
    AccessDenied,
    IntegrityMismatch,
    InvalidManifest,
    RevisionNotFound,
    SourceUnavailable,
)
from hub.manifest import Entry, Manifest

pytestmark = pytest.mark.anyio

FILES = {
    "config.json": b'{"a": 1}',
    "model.safetensors": bytes(range(256)) * 16,  # 4 KiB: LFS (threshold 1 KiB)
    "tokenizer/vocab.txt": b"hello\nworld\n",
    "tokenizer/merges.txt": b"h e\n",
    "weights/part-2.bin": b"\x01" * 2048,
}


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[testing.FakeHub, testing.Endpoints]]:
    fake = testing.FakeHub(tmp_path / "hub", page_size=2)
    async with testing.serving(fake) as endpoints:
        yield fake, endpoints


def _expected(files: dict[str, bytes]) -> Manifest:
    def entry(path: str, content: bytes) -> Entry:
        if len(content) >= 1024:
            return Entry("sha256", hashlib.sha256(content).hexdigest(), len(content), path)
        return Entry("gitsha1", testing.git_blob_sha1(content), len(content), path)

    return Manifest.of(entry(p, c) for p, c in files.items())


async def test_resolve_follows_pages_and_builds_the_canonical_manifest(
    fake: tuple[testing.FakeHub, testing.Endpoints],
) -> None:
    server, endpoints = fake
    commit = server.add("org/model", FILES)

    m = await hub.resolve("org/model", "main", endpoint=endpoints.hub, token=None)

    assert m.commit == commit
    assert m.text() == _expected(FILES).text()
    assert m.digest == _expected(FILES).digest
    pages = [s for s in server.seen if "/tree/" in s.path]
    assert len(pages) > 3  # 5 files + 3 directories, 2 per page


async def test_patterns_change_the_digest(fake: tuple[testing.FakeHub, testing.Endpoints]) -> None:
    server, endpoints = fake
    server.add("org/model", FILES)

    m = await hub.resolve(
        "org/model",
        endpoint=endpoints.hub,
        token=None,
        allow=["*.json", "tokenizer/"],
        ignore=["*merges*"],
    )

    assert [e.path for e in m.entries] == ["config.json", "tokenizer/vocab.txt"]
    assert (
        m.digest == _expected({p: FILES[p] for p in ("config.json", "tokenizer/vocab.txt")}).digest
    )


async def test_token_reaches_the_hub_but_never_the_cdn(
    fake: tuple[testing.FakeHub, testing.Endpoints],
) -> None:
    server, endpoints = fake
    commit = server.add("org/private", FILES, token="s3cret")

    async with (
        hub_client.client(hub_client.HubSettings(endpoint=endpoints.hub)) as c,
        c.download("org/private", commit, "model.safetensors", token="s3cret") as body,
    ):
        data = b"".join([chunk async for chunk in body.chunks(1000)])

    assert data == FILES["model.safetensors"]
    hub_hits = [s for s in server.seen if s.path.startswith("/org/private/resolve/")]
    cdn_hits = [s for s in server.seen if s.path.startswith("/blobs/")]
    assert [s.authorization for s in hub_hits] == ["Bearer s3cret"]
    assert len(cdn_hits) == 1
    assert cdn_hits[0].authorization is None


async def test_ranged_download_reports_start_and_total(
    fake: tuple[testing.FakeHub, testing.Endpoints],
) -> None:
    server, endpoints = fake
    commit = server.add("org/model", FILES)

    async with (
        hub_client.client(hub_client.HubSettings(endpoint=endpoints.hub)) as c,
        c.download(
            "org/model", commit, "model.safetensors", token=None, start=100, end=200
        ) as body,
    ):
        data = b"".join([chunk async for chunk in body.chunks(1 << 16)])

    assert (body.start, body.total) == (100, 4096)
    assert data == FILES["model.safetensors"][100:200]


@pytest.mark.parametrize(
    ("token", "revision", "error", "text"),
    [
        (None, "main", AccessDenied, "Invalid username or password"),  # 401
        ("wrong", "main", AccessDenied, "GatedRepo"),  # 403
        ("s3cret", "nope", RevisionNotFound, "Invalid rev id: nope"),  # 404 RevisionNotFound
    ],
)
async def test_refusals_map_to_reasons_with_the_hub_message(
    fake: tuple[testing.FakeHub, testing.Endpoints],
    token: str | None,
    revision: str,
    error: type[Exception],
    text: str,
) -> None:
    server, endpoints = fake
    server.add("org/private", FILES, token="s3cret")

    with pytest.raises(error, match=text):
        await hub.resolve("org/private", revision, endpoint=endpoints.hub, token=token)


async def test_unknown_repository_is_access_denied(
    fake: tuple[testing.FakeHub, testing.Endpoints],
) -> None:
    _, endpoints = fake
    with pytest.raises(AccessDenied, match="RepoNotFound"):
        await hub.resolve("org/none", endpoint=endpoints.hub)


async def test_unreachable_hub_is_source_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable):
        await hub.resolve("org/model", endpoint="http://127.0.0.1:9")


@pytest.mark.parametrize("evil", ["../../etc/passwd", "a/../../b", "/abs", "a//b", "x\ny"])
async def test_path_traversal_in_a_tree_listing_is_refused(
    fake: tuple[testing.FakeHub, testing.Endpoints], evil: str
) -> None:
    server, endpoints = fake
    server.add("org/model", FILES)
    server.repos["org/model"].extra_entries.append(
        {"type": "file", "path": evil, "size": 1, "oid": "c" * 40}
    )

    with pytest.raises(InvalidManifest):
        await hub.resolve("org/model", endpoint=endpoints.hub)


async def test_gated_lfs_oid_is_access_denied(
    fake: tuple[testing.FakeHub, testing.Endpoints],
) -> None:
    server, endpoints = fake
    server.add("org/model", FILES)
    server.repos["org/model"].extra_entries.append(
        {
            "type": "file",
            "path": "gated.bin",
            "size": 5,
            "oid": "c" * 40,
            "lfs": {"oid": "*" * 64, "size": 5},
        }
    )

    with pytest.raises(AccessDenied, match="gated"):
        await hub.resolve("org/model", endpoint=endpoints.hub)


_PAGE = "?recursive=true&expand=false&cursor="


@pytest.mark.parametrize(
    ("links", "error"),
    [
        # past the files, every page is an empty list, so no entry bound ever stops the loop
        (lambda cursor: "" if cursor else f"{_PAGE}100", "repeats"),  # an empty page's own URL
        (lambda cursor: f"{_PAGE}{201 - cursor if cursor else 100}", "repeats"),  # 100, 101, 100
        (lambda cursor: f"{_PAGE}{cursor + 1}", "over 2000 pages"),  # pages 1, 2, 3, ...
    ],
    ids=["itself", "cycle", "unbounded"],
)
async def test_tree_pages_that_never_end_fail_instead_of_looping(
    fake: tuple[testing.FakeHub, testing.Endpoints],
    links: Callable[[int], str],
    error: str,
) -> None:
    server, endpoints = fake
    server.add("org/model", FILES)
    server.next_link = links

    # the guard only turns today's endless loop into a failure; the bound ends it in ~2,000 pages
    with anyio.fail_after(30), pytest.raises(SourceUnavailable, match=error):
        await hub.resolve("org/model", endpoint=endpoints.hub)

    pages = [s for s in server.seen if "/tree/" in s.path]
    assert len(pages) <= hub_client.MAX_TREE_PAGES


async def test_whole_fetches_a_small_file_through_the_cdn_and_refuses_a_wrong_size(
    fake: tuple[testing.FakeHub, testing.Endpoints],
) -> None:
    server, endpoints = fake
    commit = server.add("org/model", FILES)
    name, data = "model.safetensors", FILES["model.safetensors"]
    settings = hub_client.HubSettings(endpoint=endpoints.hub)

    async with hub_client.client(settings) as c:
        pieces = await c.whole("org/model", commit, name, token=None, size=len(data))
        with pytest.raises(IntegrityMismatch, match="the server says 4096 bytes"):
            await c.whole("org/model", commit, name, token=None, size=len(data) + 1)
        server.break_once[name] = 1000
        with pytest.raises(SourceUnavailable):
            await c.whole("org/model", commit, name, token=None, size=len(data))
        again = await c.whole("org/model", commit, name, token=None, size=len(data))

    assert b"".join(pieces) == data == b"".join(again)
    assert any("/blobs/" in s.path for s in server.seen)  # the CDN redirect was followed


@pytest.mark.parametrize(
    ("start", "end", "header"),
    [(0, None, None), (5, None, "bytes=5-"), (0, 10, "bytes=0-9"), (3, 4, "bytes=3-3")],
)
def test_a_range_header_names_the_last_byte_inclusive_and_none_for_a_whole_file(
    start: int, end: int | None, header: str | None
) -> None:
    """One rule for the Hub's GETs and the peers' (:mod:`agent.models.peerclient`)."""
    got = hub_client.range_header(start, end)
    assert got == (None if header is None else {"Range": header})
