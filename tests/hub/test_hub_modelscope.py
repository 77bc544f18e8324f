"""ModelScope as a hub: commit, listing (cut at 3,000 and re-listed), manifest, token check, env.

Against :mod:`hub.testing_modelscope`, a real HTTP server answering the shapes ModelScope's SDK
and its public clients read. Every digest here is also computed by the test itself, from the
bytes, with :mod:`hashlib` alone.
"""

from __future__ import annotations

import hashlib

import pytest

from hub import client as hub_client
from hub import modelscope, modelscope_env, resolving
from hub.endpoints import InvalidName
from hub.errors import AccessDenied, InvalidManifest, RevisionNotFound, SourceUnavailable
from hub.manifest import Entry, Manifest
from hub.testing_modelscope import FakeModelScope, serving

pytestmark = pytest.mark.anyio


def independent_digest(files: dict[str, bytes]) -> str:
    """The reference's manifest digest, written out here without the code under test."""
    text = "gpustack-manifest v1\n"
    for path in sorted(files, key=lambda p: p.encode()):
        data = files[path]
        text += f"sha256:{hashlib.sha256(data).hexdigest()} {len(data)} {path}\n"
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_public_vector() -> None:
    """A fixed listing and its digest, written out by hand: the bytes a ModelScope manifest
    must have (every file sha256, sorted by path bytes), so any change of encoding shows."""
    entries = [
        Entry("sha256", hashlib.sha256(b"{}").hexdigest(), 2, "configuration.json"),
        Entry("sha256", hashlib.sha256(b"").hexdigest(), 0, "README.md"),
    ]
    manifest = Manifest.of(entries)
    expected = (
        "gpustack-manifest v1\n"
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 0 README.md\n"
        "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a 2 "
        "configuration.json\n"
    )
    assert manifest.text() == expected
    assert manifest.digest == ("sha256:" + hashlib.sha256(expected.encode()).hexdigest())
    assert manifest.digest == independent_digest({"README.md": b"", "configuration.json": b"{}"})


async def resolve(
    endpoint: str,
    repository: str,
    revision: str = "master",
    *,
    token: str | None = None,
    cap: int = modelscope.LISTING_CAP,
) -> Manifest:
    settings = hub_client.HubSettings(endpoint=endpoint)
    async with hub_client.client(settings, kind=modelscope.ModelScopeClient) as hub:
        assert isinstance(hub, modelscope.ModelScopeClient)
        hub.listing_cap = cap
        return await resolving.resolve(repository, revision, hub=hub, token=token)


async def test_a_repository_resolves_to_the_independently_computed_digest() -> None:
    fake = FakeModelScope()
    files = {
        "configuration.json": b'{"framework": "pytorch"}',
        "model.safetensors": bytes(range(256)) * 64,
        "tokenizer/vocab.txt": "é\n".encode() * 10,
        ".gitattributes": b"*.safetensors filter=lfs\n",
    }
    commit = fake.add("qwen/Tiny", files)
    async with serving(fake) as url:
        manifest = await resolve(url, "qwen/Tiny")
    assert manifest.commit == commit
    assert manifest.digest == independent_digest(files)
    assert {e.algorithm for e in manifest.entries} == {"sha256"}
    # The commit came from the history API and was cross-checked with the git refs.
    paths = [s.path for s in fake.seen]
    assert "/api/v1/models/qwen/Tiny/commits" in paths
    assert "/qwen/Tiny.git/info/refs" in paths


async def test_a_listing_cut_at_the_cap_is_relisted_per_directory() -> None:
    """Three directories of 5 files: with a cap of 10 the recursive answer is cut, so the
    client lists the root's children and each directory; nothing is lost or doubled."""
    fake = FakeModelScope(cap=10)
    files = {f"d{d}/f{i}.bin": f"{d}-{i}".encode() for d in range(3) for i in range(5)}
    files["top.json"] = b"{}"
    fake.add("org/many", files)
    async with serving(fake) as url:
        manifest = await resolve(url, "org/many", cap=10)
    assert len(manifest.entries) == 16
    assert manifest.digest == independent_digest(files)
    roots = [s.query.get("Root") for s in fake.seen if s.path.endswith("/repo/files")]
    assert roots == [None, None, "d0", "d1", "d2"]


async def test_the_real_cap_of_3000_is_relisted() -> None:
    fake = FakeModelScope()  # the API's own 3,000
    files = {f"shard{d}/{i:04d}": b"x" for d in range(2) for i in range(1600)}
    fake.add("org/huge", files)
    async with serving(fake) as url:
        manifest = await resolve(url, "org/huge")
    assert len(manifest.entries) == 3200
    assert manifest.digest == independent_digest(files)


async def test_a_directory_with_the_cap_of_direct_entries_is_refused() -> None:
    fake = FakeModelScope(cap=10)
    fake.add("org/flat", {f"f{i:02d}": b"x" for i in range(12)})
    async with serving(fake) as url:
        with pytest.raises(SourceUnavailable, match="10 or more direct entries"):
            await resolve(url, "org/flat", cap=10)


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"Path": "a", "Type": "blob", "Size": 1, "Sha256": "0" * 64}, "duplicate path"),
        ({"Path": "b", "Type": "blob", "Size": 1}, "no Sha256"),
        ({"Path": "../escape", "Type": "blob", "Size": 1, "Sha256": "0" * 64}, "'..'"),
        ({"Path": "c", "Type": "blob", "Size": 1, "Sha256": "XYZ"}, "object id"),
    ],
)
async def test_hostile_listings_are_invalid_manifests(extra: dict[str, object], error: str) -> None:
    fake = FakeModelScope()
    fake.add("org/m", {"a": b"1"})
    fake.extra.append(extra)
    async with serving(fake) as url:
        with pytest.raises(InvalidManifest, match=error):
            await resolve(url, "org/m")


async def test_a_spurious_denial_mid_walk_is_asked_again_but_a_first_one_stands() -> None:
    fake = FakeModelScope(cap=10)
    files = {f"d{d}/f{i}.bin": f"{d}-{i}".encode() for d in range(3) for i in range(5)}
    fake.add("org/many", files)
    fake.deny_once.add("d1")
    async with serving(fake) as url:
        manifest = await resolve(url, "org/many", cap=10)
        assert manifest.digest == independent_digest(files)
        fake.deny_once.add("")
        with pytest.raises(AccessDenied):
            await resolve(url, "org/many", cap=10)


async def test_git_refs_that_disagree_refuse_the_commit() -> None:
    fake = FakeModelScope()
    fake.add("org/m", {"a": b"1"})
    fake.git_override["master"] = "f" * 40
    async with serving(fake) as url:
        with pytest.raises(SourceUnavailable, match="git refs say f{40}"):
            await resolve(url, "org/m")


async def test_an_annotated_tag_is_cross_checked_with_its_peeled_commit() -> None:
    """git advertises a tag object and, peeled (``^{}``), the commit: the commit is what the
    API's answer must equal (the tag object's id would be a false disagreement)."""
    fake = FakeModelScope()
    commit = fake.add("org/m", {"a": b"1"}, revision="v1.0")
    fake.tags.add("v1.0")
    async with serving(fake) as url:
        assert (await resolve(url, "org/m", "v1.0")).commit == commit
        fake.git_override["v1.0"] = "e" * 40
        with pytest.raises(SourceUnavailable, match="git refs say e{40}"):
            await resolve(url, "org/m", "v1.0")


async def test_unknown_revision_and_commit_pins() -> None:
    fake = FakeModelScope()
    commit = fake.add("org/m", {"a": b"1"}, revision="v1")
    async with serving(fake) as url:
        with pytest.raises(RevisionNotFound):
            await resolve(url, "org/m", "nope")
        assert (await resolve(url, "org/m", "v1")).commit == commit
        assert (await resolve(url, "org/m", commit)).commit == commit


async def test_private_repository_and_the_token_check() -> None:
    fake = FakeModelScope()
    fake.add("org/private", {"w.bin": b"secret"}, token="ms-good")
    async with serving(fake) as url:
        with pytest.raises(AccessDenied) as anonymous:
            await resolve(url, "org/private")
        assert "token itself" not in str(anonymous.value)
        with pytest.raises(AccessDenied, match="the token itself is refused.*InvalidAuth"):
            await resolve(url, "org/private", token="ms-bad")
        manifest = await resolve(url, "org/private", token="ms-good")
        settings = hub_client.HubSettings(endpoint=url)
        async with hub_client.client(settings, kind=modelscope.ModelScopeClient) as hub:
            assert isinstance(hub, modelscope.ModelScopeClient)
            assert (await hub.user("ms-good")).username == "someone"
            with pytest.raises(AccessDenied):
                await hub.user("ms-bad")
    assert manifest.digest == independent_digest({"w.bin": b"secret"})
    api = [s for s in fake.seen if s.path.startswith("/api/v1/") and s.cookie == "ms-good"]
    assert api and all(s.authorization == "Bearer ms-good" for s in api)


def test_pkt_line_refs_and_malformed_ones() -> None:
    body = b"001e# service=git-upload-pack\n0000"
    body += b"%04x" % (4 + 41 + 16 + 5) + b"a" * 40 + b" refs/heads/main\0caps\n"
    body += b"0000"
    assert modelscope.parse_refs(body) == {"refs/heads/main": "a" * 40}
    with pytest.raises(SourceUnavailable):
        modelscope.parse_refs(b"zzzz")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "https://www.modelscope.cn"),
        ({"MODELSCOPE_DOMAIN": "www.modelscope.ai"}, "https://www.modelscope.ai"),
        ({"MODELSCOPE_DOMAIN": "http://mirror.local:8080/"}, "http://mirror.local:8080"),
        (
            {"MODELSCOPE_ENDPOINT": "modelscope.ai", "MODELSCOPE_DOMAIN": "x.cn"},
            "https://modelscope.ai",
        ),
        ({"MODELSCOPE_ENDPOINT": "", "MODELSCOPE_DOMAIN": "x.cn"}, "https://x.cn"),
    ],
)
def test_endpoint_follows_the_sdk_variables(env: dict[str, str], expected: str) -> None:
    assert modelscope_env.endpoint_from(None, env) == expected
    assert modelscope_env.endpoint_from("https://flag.example", env) == "https://flag.example"


def test_environment_token_and_refusals() -> None:
    env = {"MODELSCOPE_API_TOKEN": " ms-1 ", "HF_TOKEN": "hf", "HF_HUB_OFFLINE": "1"}
    got = modelscope_env.environment(env)
    assert got.token == "ms-1" and not got.offline
    with pytest.raises(InvalidName):
        modelscope_env.endpoint_from("https://u:p@host", {})
    for bad in ("ftp://host", "http://[::1"):
        with pytest.raises(InvalidName):
            modelscope_env.endpoint_from(None, {"MODELSCOPE_ENDPOINT": bad})
    with pytest.raises(InvalidName):
        modelscope_env.repository("single")
    with pytest.raises(InvalidName):
        modelscope_env.repository("../x")
