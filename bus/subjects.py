"""The one place that knows the subject grammar: ``gpustack.v1.node.<node>.<kind>``.

A subject token may not contain ``.``, ``*``, ``>`` or whitespace, but Kubernetes node names may
contain dots (``ip-10-0-0-1.ec2.internal``). A node name is therefore put into exactly one token
by percent-escaping: ``%`` and ``.`` and every non-ASCII or control character become ``%XX`` per
UTF-8 byte (uppercase hex). The escaping is reversible and canonical: ``decode_node`` accepts only
what ``encode_node`` produces, so one node has one subject. Names containing ``*``, ``>`` or
whitespace are refused rather than escaped: they are not valid Kubernetes names and a mistake in
them should be loud.

Everything here is pure and synchronous.
"""

from __future__ import annotations

import functools
import re
from typing import Final, Literal, get_args

from bus.errors import InvalidNodeName, InvalidSubject

__all__ = [
    "ALL",
    "KINDS",
    "PREFIX",
    "Kind",
    "decode_node",
    "encode_node",
    "filter_for",
    "matches",
    "parse",
    "parse_kind",
    "subject",
]

Kind = Literal["devices", "samples", "health", "allocations", "models", "agent"]
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)
PREFIX: Final = "gpustack.v1.node"
ALL: Final = f"{PREFIX}.>"
REVIEW: Final = "gpustack.v1.review"
"""Where node agents ask the worker to review a bearer token (request/reply; bus.accessreviews)."""
MAX_NODE_CHARS: Final = 253
"""The longest Kubernetes object name (a DNS subdomain)."""

_KIND_BY_NAME: Final[dict[str, Kind]] = {k: k for k in KINDS}
_REFUSED = frozenset("*>")
# Printable ASCII other than the escape char and the token separator passes through unchanged.
_PLAIN = frozenset(chr(c) for c in range(0x21, 0x7F)) - {"%", "."}
_ESCAPE = re.compile(r"%([0-9A-F]{2})")
# The canonical token of a name of printable ASCII other than ``%``, ``*`` and ``>`` (dots
# escaped): every Kubernetes node name. Such a token decodes by replacing ``%2E``.
_SIMPLE = re.compile(r"(?:[\x21-\x24\x26-\x29\x2B-\x2D\x2F-\x3D\x3F-\x7E]|%2E)+")


def encode_node(node: str) -> str:
    """Return ``node`` as one subject token.

    :raises InvalidNodeName: empty, longer than 253 characters, containing ``*``, ``>`` or
        whitespace, or not encodable as UTF-8 (a lone surrogate).
    """
    _check_node(node)
    if all(ch in _PLAIN for ch in node):  # the common case: nothing to escape
        return node
    out: list[str] = []
    for ch in node:
        if ch in _PLAIN:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode_node(token: str) -> str:
    """Invert :func:`encode_node`.

    :raises InvalidSubject: ``token`` is not the canonical encoding of any valid node name.
    """
    if _SIMPLE.fullmatch(token):  # the common case, without a round trip
        node = token.replace("%2E", ".")
        if len(node) <= MAX_NODE_CHARS:
            return node
    try:
        raw = bytearray()
        pos = 0
        for m in _ESCAPE.finditer(token):
            raw += token[pos : m.start()].encode("ascii")
            raw.append(int(m.group(1), 16))
            pos = m.end()
        raw += token[pos:].encode("ascii")
        node = raw.decode("utf-8")
    except (UnicodeError, ValueError) as e:
        raise InvalidSubject(f"bad node token {token!r}") from e
    try:
        canonical = encode_node(node)
    except InvalidNodeName as e:
        raise InvalidSubject(f"bad node token {token!r}") from e
    if canonical != token:
        raise InvalidSubject(f"non-canonical node token {token!r}")
    return node


def subject(node: str, kind: Kind) -> str:
    """Return the subject a node publishes ``kind`` events on."""
    return f"{PREFIX}.{encode_node(node)}.{kind}"


def filter_for(node: str | None = None, kind: Kind | None = None) -> str:
    """Return a subscription filter: one node or every node (``*``), one kind or all of them."""
    token = "*" if node is None else encode_node(node)
    return f"{PREFIX}.{token}.{kind or '*'}"


@functools.lru_cache(maxsize=1 << 16)
def parse(subj: str) -> tuple[str, Kind]:
    """Split a concrete subject into ``(node, kind)``.

    Cached (pure function, bounded): a subscriber sees the same subjects over and over, and
    parsing them was the largest cost per message. The bound holds 10,000 nodes' six kinds
    (about 300 bytes each): a bound below the subjects in use is never hit when nodes publish
    in turn (the least recently used is evicted just before it comes round again), so beyond
    it every message pays :func:`decode_node`'s fast path (about 2 µs).

    :raises InvalidSubject: wrong prefix, wrong number of tokens, unknown kind or bad node token.
    """
    head, sep, rest = subj.rpartition(".")
    prefix, sep2, token = head.rpartition(".")
    if not sep or not sep2 or prefix != PREFIX:
        raise InvalidSubject(f"not a node subject: {subj!r}")
    return decode_node(token), parse_kind(rest)


def parse_kind(token: str) -> Kind:
    """Return ``token`` as a :data:`Kind`.

    :raises InvalidSubject: not one of :data:`KINDS`.
    """
    kind = _KIND_BY_NAME.get(token)
    if kind is None:
        raise InvalidSubject(f"unknown kind {token!r}")
    return kind


def _check_node(node: str) -> None:
    if not node:
        raise InvalidNodeName("empty node name")
    if len(node) > MAX_NODE_CHARS:
        raise InvalidNodeName(f"node name longer than {MAX_NODE_CHARS} characters")
    for ch in node:
        if ch in _REFUSED or ch.isspace() or ch == "\x00":
            raise InvalidNodeName(f"node name {node!r} contains {ch!r}")
        if 0xD800 <= ord(ch) <= 0xDFFF:
            raise InvalidNodeName(f"node name {node!r} contains a lone surrogate")


def matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` is one token, a trailing ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)
