"""The canonical manifest of a model repository at one commit, and its digest.

A manifest names every file a model consists of by content: ``sha256:<oid>`` for Git LFS files
(the LFS object id is the SHA-256 of the content) and ``gitsha1:<oid>`` for regular files (the
Git blob id, SHA-1 of ``"blob <size>\\0" + content``). The canonical text is::

    gpustack-manifest v1\\n
    <algo>:<lowerhex> <size> <path>\\n      (one line per file, sorted by path UTF-8 bytes)

and the digest is ``"sha256:" + sha256(text)``. The control plane pins this digest in a
ModelArtifact's status and the node plugin refuses any content that does not hash to it, so the
encoding must stay byte-for-byte stable: changing it is a new header version, never an edit.

Everything here is pure: no I/O, no clock. What a digest looks like (:func:`is_digest`) is
written once, in :mod:`bus.records`, because the records on the bus carry it and the bus may not
import the hub; it is re-exported here beside the code that makes digests.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from bus.records import is_digest
from hub.errors import InvalidManifest

__all__ = [
    "HEADER",
    "Entry",
    "Manifest",
    "filtered",
    "is_digest",
    "parse",
    "validate_path",
]

HEADER: Final = "gpustack-manifest v1"
Algorithm = Literal["sha256", "gitsha1"]
_HEX_LENGTH: Final[dict[str, int]] = {"sha256": 64, "gitsha1": 40}
_HEX = re.compile(r"[0-9a-f]+")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
"""C0 controls and DEL (one regex scan: a tree of 10,000 paths is validated per listing)."""
MAX_PATH_BYTES: Final = 4096


def validate_path(path: str) -> None:
    """Refuse a repository path that could escape a tree or confuse the text encoding.

    :raises InvalidManifest: empty, absolute, a control character, or an empty/``.``/``..``
        segment.
    """
    if not path:
        raise InvalidManifest("a file has an empty path")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidManifest(f"path too long: {path[:64]!r}...")
    if _CONTROL.search(path):
        raise InvalidManifest(f"path has a control character: {path!r}")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidManifest(f"path is not valid UTF-8: {path!r}") from e
    if path.startswith("/"):
        raise InvalidManifest(f"path is absolute: {path!r}")
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidManifest(f"path has an empty, '.' or '..' segment: {path!r}")


@dataclass(frozen=True, slots=True)
class Entry:
    """One file: how its content is named, its size and its path in the repository."""

    algorithm: Algorithm
    oid: str
    """Lowercase hex: 64 digits for ``sha256``, 40 for ``gitsha1``."""
    size: int
    path: str

    def __post_init__(self) -> None:
        validate_path(self.path)
        if self.algorithm not in _HEX_LENGTH:
            raise InvalidManifest(f"{self.path}: unknown algorithm {self.algorithm!r}")
        if len(self.oid) != _HEX_LENGTH[self.algorithm] or not _HEX.fullmatch(self.oid):
            raise InvalidManifest(f"{self.path}: bad {self.algorithm} object id {self.oid!r}")
        if self.size < 0:
            raise InvalidManifest(f"{self.path}: negative size {self.size}")

    @property
    def line(self) -> str:
        return f"{self.algorithm}:{self.oid} {self.size} {self.path}\n"


def _sort_key(entry: Entry) -> bytes:
    return entry.path.encode("utf-8")


@dataclass(frozen=True, slots=True)
class Manifest:
    """A validated set of files, kept sorted by path bytes; immutable.

    ``commit`` is where it was listed (None when parsed from stored text, which does not carry
    it); it is not part of the text nor the digest: two commits with the same files share one.
    """

    entries: tuple[Entry, ...]
    commit: str | None = None

    @classmethod
    def of(cls, entries: Iterable[Entry], *, commit: str | None = None) -> Manifest:
        """Sort and check ``entries``. :raises InvalidManifest: on a duplicate path."""
        ordered = tuple(sorted(entries, key=_sort_key))
        for before, after in itertools.pairwise(ordered):
            if before.path == after.path:
                raise InvalidManifest(f"duplicate path {after.path!r}")
        return cls(ordered, commit)

    def text(self) -> str:
        """The canonical text the digest is taken of."""
        return HEADER + "\n" + "".join(e.line for e in self.entries)

    @property
    def digest(self) -> str:
        """``sha256:`` + the SHA-256 of :meth:`text`, lowercase hex."""
        return "sha256:" + hashlib.sha256(self.text().encode("utf-8")).hexdigest()

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)


def parse(text: str) -> Manifest:
    """Read canonical text back (a stored manifest). :raises InvalidManifest: if not canonical."""
    if not text.startswith(HEADER + "\n"):
        raise InvalidManifest(f"not a manifest: the first line is not {HEADER!r}")
    body = text[len(HEADER) + 1 :]
    if body and not body.endswith("\n"):
        raise InvalidManifest("the last line does not end in a newline")
    entries = []
    # split("\n"), not splitlines(): a path may hold U+0085 or U+2028, which are not line ends.
    for line in body.split("\n")[:-1]:
        algorithm, _, rest = line.partition(":")
        oid, _, rest = rest.partition(" ")
        size, _, path = rest.partition(" ")
        if algorithm not in _HEX_LENGTH or not size.isdigit():
            raise InvalidManifest(f"malformed manifest line {line[:120]!r}")
        entries.append(Entry(algorithm, oid, int(size), path))  # type: ignore[arg-type]
    manifest = Manifest.of(entries)
    if manifest.text() != text:
        raise InvalidManifest("the manifest is not in canonical order")
    return manifest


def _pattern(p: str) -> str:
    # A trailing "/" means the directory's contents, as in huggingface_hub's filters.
    return p + "*" if p.endswith("/") else p


def _matches(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, _pattern(p)) for p in patterns)


def filtered(
    entries: Iterable[Entry], *, allow: Sequence[str] = (), ignore: Sequence[str] = ()
) -> list[Entry]:
    """Keep the entries an artifact asks for: allowed (all when no allow pattern), not ignored.

    ``fnmatch.fnmatchcase`` semantics (``*`` crosses ``/``); ignore wins over allow.
    """
    return [
        e
        for e in entries
        if (not allow or _matches(e.path, allow)) and not _matches(e.path, ignore)
    ]
