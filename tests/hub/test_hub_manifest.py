"""The canonical manifest text and digest: byte-for-byte, pure."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub import manifest
from hub.errors import InvalidManifest
from hub.manifest import Entry, Manifest

SHA = "a" * 64
GIT = "b" * 40


def test_text_is_header_then_lines_sorted_by_path_bytes() -> None:
    m = Manifest.of(
        [
            Entry("sha256", SHA, 10, "model.safetensors"),
            Entry("gitsha1", GIT, 2, "config.json"),
            Entry("gitsha1", GIT, 3, "Z.txt"),  # upper case sorts before lower case in bytes
            Entry("gitsha1", GIT, 4, "é.txt"),  # non-ASCII after ASCII
        ]
    )

    expected = (
        "gpustack-manifest v1\n"
        f"gitsha1:{GIT} 3 Z.txt\n"
        f"gitsha1:{GIT} 2 config.json\n"
        f"sha256:{SHA} 10 model.safetensors\n"
        f"gitsha1:{GIT} 4 é.txt\n"
    )
    assert m.text() == expected
    assert m.digest == "sha256:" + hashlib.sha256(expected.encode()).hexdigest()
    assert m.size == 19


def test_empty_manifest_is_the_header_alone() -> None:
    assert Manifest.of([]).text() == "gpustack-manifest v1\n"
    assert Manifest.of([]).digest == (
        "sha256:" + hashlib.sha256(b"gpustack-manifest v1\n").hexdigest()
    )


def test_commit_is_not_part_of_the_digest() -> None:
    entries = [Entry("gitsha1", GIT, 1, "a")]
    assert Manifest.of(entries, commit="1" * 40).digest == Manifest.of(entries).digest


@given(st.lists(st.sampled_from(["a", "b/c", "é.txt"]), unique=True))
def test_every_manifest_digest_is_one_the_bus_records_accept(paths: list[str]) -> None:
    """The node plugin refuses a volume whose manifestDigest fails ``is_digest``: the digests
    this module makes must all pass it."""
    m = Manifest.of(Entry("sha256", SHA, 1, p) for p in paths)

    assert manifest.is_digest(m.digest)
    assert not manifest.is_digest(m.digest.upper())


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../b",
        "a//b",
        "a/./b",
        "a/",
        ".",
        "a\nb",
        "a\tb",
        "a\x7fb",
        "\x00",
        "z\x1f",
    ],
)
def test_invalid_paths_are_refused(path: str) -> None:
    with pytest.raises(InvalidManifest):
        Entry("gitsha1", GIT, 1, path)


@pytest.mark.parametrize(
    ("algorithm", "oid", "size"),
    [("sha256", "a" * 63, 1), ("gitsha1", "a" * 64, 1), ("sha256", "A" * 64, 1), ("md5", GIT, 1)],
)
def test_bad_object_ids_and_algorithms_are_refused(algorithm: str, oid: str, size: int) -> None:
    with pytest.raises(InvalidManifest):
        Entry(algorithm, oid, size, "f")  # type: ignore[arg-type]


def test_negative_size_and_duplicates_are_refused() -> None:
    with pytest.raises(InvalidManifest):
        Entry("gitsha1", GIT, -1, "f")
    with pytest.raises(InvalidManifest, match="duplicate"):
        Manifest.of([Entry("gitsha1", GIT, 1, "f"), Entry("sha256", SHA, 1, "f")])


def test_patterns_filter_before_encoding_and_ignore_wins() -> None:
    entries = [
        Entry("gitsha1", GIT, 1, "config.json"),
        Entry("sha256", SHA, 1, "model.safetensors"),
        Entry("sha256", SHA, 1, "original/consolidated.pth"),
        Entry("gitsha1", GIT, 1, "README.md"),
    ]

    kept = manifest.filtered(
        entries, allow=["*.json", "*.safetensors", "original/"], ignore=["*.pth"]
    )

    assert [e.path for e in kept] == ["config.json", "model.safetensors"]
    assert manifest.filtered(entries) == entries


_segment = st.text(
    alphabet=st.characters(
        min_codepoint=0x20, blacklist_characters="/\x7f", blacklist_categories=("Cs",)
    ),
    min_size=1,
    max_size=8,
).filter(lambda s: s not in (".", ".."))
_entries = st.lists(
    st.tuples(
        st.lists(_segment, min_size=1, max_size=3).map("/".join),
        st.sampled_from(["sha256", "gitsha1"]),
        st.integers(min_value=0, max_value=2**40),
    ),
    unique_by=lambda t: t[0],
    max_size=20,
)


@given(_entries)
def test_parse_reads_back_exactly_what_text_wrote(raw: list[tuple[str, str, int]]) -> None:
    m = Manifest.of(Entry(a, (SHA if a == "sha256" else GIT), s, p) for p, a, s in raw)  # type: ignore[arg-type]

    again = manifest.parse(m.text())

    assert again.text() == m.text()
    assert again.digest == m.digest


@pytest.mark.parametrize(
    "text",
    [
        "",
        "gpustack-manifest v2\n",
        f"gpustack-manifest v1\ngitsha1:{GIT} 1 b\ngitsha1:{GIT} 1 a\n",  # not sorted
        f"gpustack-manifest v1\ngitsha1:{GIT} 1 a",  # no final newline
        f"gpustack-manifest v1\ngitsha1:{GIT} x a\n",
        f"gpustack-manifest v1\ngitsha1:{GIT} 1 ../a\n",
    ],
)
def test_parse_refuses_non_canonical_text(text: str) -> None:
    with pytest.raises(InvalidManifest):
        manifest.parse(text)
