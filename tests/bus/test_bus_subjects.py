"""Subject grammar: node names become exactly one token, reversibly."""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import subjects
from bus.errors import InvalidNodeName, InvalidSubject

_FORBIDDEN_IN_TOKEN = set(".*> \t\r\n")


def _valid_name(name: str) -> bool:
    return (
        0 < len(name) <= subjects.MAX_NODE_CHARS
        and not any(c in "*>" or c.isspace() or c == "\x00" for c in name)
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in name)
    )


node_names = st.text(
    alphabet=st.one_of(st.sampled_from(".%-_abc"), st.characters()), min_size=1, max_size=60
).filter(_valid_name)


@pytest.mark.parametrize(
    ("node", "token"),
    [
        ("worker-1", "worker-1"),
        ("ip-10-0-0-1.ec2.internal", "ip-10-0-0-1%2Eec2%2Einternal"),
        ("50%", "50%25"),
        ("nœud", "n%C5%93ud"),
    ],
)
def test_known_encodings(node: str, token: str) -> None:
    assert subjects.encode_node(node) == token
    assert subjects.decode_node(token) == node


@pytest.mark.parametrize("bad", ["", "a*b", "a>", "a b", "tab\there", "new\nline", "x" * 254])
def test_names_that_would_break_routing_are_refused(bad: str) -> None:
    with pytest.raises(InvalidNodeName):
        subjects.encode_node(bad)


@given(node_names)
def test_round_trip_is_one_token(node: str) -> None:
    token = subjects.encode_node(node)
    assert not _FORBIDDEN_IN_TOKEN.intersection(token)
    assert token.isascii()
    assert subjects.decode_node(token) == node
    assert subjects.parse(subjects.subject(node, "health")) == (node, "health")


@given(node_names, node_names)
def test_distinct_nodes_get_distinct_tokens(a: str, b: str) -> None:
    assert (subjects.encode_node(a) == subjects.encode_node(b)) == (a == b)


@pytest.mark.parametrize("token", ["a%2eb", "%ZZ", "%C3", "a%2", "%20x", "%41"])
def test_non_canonical_or_broken_tokens_are_refused(token: str) -> None:
    with pytest.raises(InvalidSubject):
        subjects.decode_node(token)


@pytest.mark.parametrize(
    "subj",
    [
        "gpustack.v1.node.n1",
        "gpustack.v2.node.n1.devices",
        "gpustack.v1.node.n1.gossip",
        "gpustack.v1.node.a.b.devices",
        "other.n1.devices",
    ],
)
def test_parse_refuses_foreign_subjects(subj: str) -> None:
    with pytest.raises(InvalidSubject):
        subjects.parse(subj)


def test_filters() -> None:
    assert subjects.filter_for() == "gpustack.v1.node.*.*"
    assert subjects.filter_for("a.b", "samples") == "gpustack.v1.node.a%2Eb.samples"
    assert subjects.filter_for(kind="agent") == "gpustack.v1.node.*.agent"


_PIECES = ["%2E", "%2e", "%25", "%C5%93", ".", "*", ">", "%", "a", "-", "~", "!", " "]


@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=90).map("".join))
def test_a_token_decodes_only_when_canonical(token: str) -> None:
    """The fast path (plain ASCII and ``%2E``) accepts exactly the canonical tokens: a token is
    refused only when its percent-decoding is not a valid name that encodes back to it."""
    try:
        node = subjects.decode_node(token)
    except InvalidSubject:
        candidate = urllib.parse.unquote(token)
        assert not (_valid_name(candidate) and subjects.encode_node(candidate) == token)
        return
    assert subjects.encode_node(node) == token


def test_the_longest_dotted_name_decodes_and_one_more_is_refused() -> None:
    longest = ("a." * 127)[:253]
    assert subjects.decode_node(subjects.encode_node(longest)) == longest
    with pytest.raises(InvalidSubject):
        subjects.decode_node(subjects.encode_node(longest[:-1]) + "%2Ea")
