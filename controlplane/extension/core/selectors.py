"""Label and field selectors, parsed once per request and matched against plain objects: pure.

Label selectors follow ``k8s.io/apimachinery/pkg/labels``: comma-separated requirements, each
``key``, ``!key``, ``key=v``, ``key==v``, ``key!=v``, ``key in (a,b)``, ``key notin (a,b)``,
``key>n``, ``key<n``; keys are qualified names (optional DNS-subdomain prefix and ``/``), values
label values (≤ 63 characters). A ``!=``/``notin`` requirement matches an object without the
label, as in Kubernetes.

Field selectors follow ``k8s.io/apimachinery/pkg/fields``: ``path=v``, ``path==v``,
``path!=v`` joined by commas, ``\\`` escaping ``,``, ``=`` and ``\\`` in values. Only the paths a
resource declares are allowed (``metadata.name`` and ``metadata.namespace`` always); any other
is a 400 naming it, as kube-apiserver refuses an unsupported field label.

Invariant: a parsed selector is immutable; :func:`parse_labels` and :func:`parse_fields` raise
:class:`~controlplane.extension.core.failures.ApiFailure` (400) on any malformed input.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from controlplane.extension.core.failures import ApiFailure, bad_request

__all__ = [
    "FieldRequirement",
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "field_value",
    "parse_fields",
    "parse_labels",
]

_NAME: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PREFIX: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_TOKEN: Final = re.compile(r"\s*(==|!=|=|!|\(|\)|,|<|>|[^\s=!(),<>]+)")
_OPS: Final = ("=", "==", "!=", "in", "notin", "<", ">")


class Requirement(msgspec.Struct, frozen=True):
    key: str
    op: str
    """``exists``, ``!``, ``=``, ``!=``, ``in``, ``notin``, ``<``, ``>``."""
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has, value = self.key in labels, labels.get(self.key, "")
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        try:
            number, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return has and (number < bound if self.op == "<" else number > bound)


class LabelSelector(msgspec.Struct, frozen=True):
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def _check_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        raise bad_request(f"invalid label key {key!r}: the prefix must be a DNS subdomain")
    if len(name) > 63 or not _NAME.fullmatch(name):
        raise bad_request(f"invalid label key {key!r}: a name of at most 63 characters, "
                          "alphanumeric at both ends, '-', '_' or '.' between")  # fmt: skip
    return key


def _check_value(value: str) -> str:
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        raise bad_request(f"invalid label value {value!r}: at most 63 characters, "
                          "alphanumeric at both ends, '-', '_' or '.' between")  # fmt: skip
    return value


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text):
        found = _TOKEN.match(text, at)
        if found is None:
            break  # only trailing blanks remain
        out.append(found.group(1))
        at = found.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.tokens, self.at = text, _tokens(text), 0

    def peek(self) -> str:
        return self.tokens[self.at] if self.at < len(self.tokens) else ""

    def take(self) -> str:
        token = self.peek()
        self.at += 1
        return token

    def fail(self, why: str) -> ApiFailure:
        return bad_request(f"unable to parse requirement in label selector {self.text!r}: {why}")

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.take()
            return Requirement(_check_key(self.identifier()), "!")
        key = _check_key(self.identifier())
        if self.peek() in ("", ","):
            return Requirement(key, "exists")
        op = self.take()
        if op not in _OPS:
            raise self.fail(f"{op!r} is not an operator (=, ==, !=, in, notin, <, >)")
        if op in ("in", "notin"):
            return Requirement(key, op, self.value_set())
        value = "" if self.peek() in ("", ",") else self.identifier()
        if op in ("<", ">") and not re.fullmatch(r"-?\d+", value):
            raise self.fail(f"{op} needs an integer, not {value!r}")
        return Requirement(key, "=" if op == "==" else op, (_check_value(value),))

    def identifier(self) -> str:
        token = self.take()
        if not token or token in ("=", "==", "!=", "!", "(", ")", ",", "<", ">"):
            raise self.fail(f"expected a key or value, found {token or 'the end'!r}")
        return token

    def value_set(self) -> tuple[str, ...]:
        if self.take() != "(":
            raise self.fail("a set must be in parentheses")
        values: list[str] = []
        while True:
            token = self.take()
            if token == ")" and not values:
                return ()
            values.append(_check_value("" if token in (",", ")") else token))
            if token not in (",", ")"):
                token = self.take()
            if token == ")":
                return tuple(values)
            if token != ",":
                raise self.fail("a set's values are separated by commas and closed by ')'")


def parse_labels(text: str) -> LabelSelector:
    """The selector of ``labelSelector`` (empty: everything). :raises ApiFailure: 400."""
    parser = _Parser(text)
    out: list[Requirement] = []
    while parser.peek():
        out.append(parser.requirement())
        token = parser.take()
        if token not in ("", ","):
            raise parser.fail(f"unexpected {token!r}")
        if token == "," and not parser.peek():
            raise parser.fail("a trailing comma")
    return LabelSelector(tuple(out))


class FieldRequirement(msgspec.Struct, frozen=True):
    path: str
    value: str
    equal: bool


class FieldSelector(msgspec.Struct, frozen=True):
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, r.path) == r.value) == r.equal for r in self.requirements)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The text of a dotted path in ``obj`` (``""`` when absent; booleans as ``true``/``false``)."""
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


def _split(text: str, separator: str) -> list[str]:
    """Split on ``separator`` not escaped by a backslash; escapes are kept for the next step."""
    out: list[str] = []
    part, escaped = "", False
    for char in text:
        if escaped:
            part, escaped = part + "\\" + char, False
        elif char == "\\":
            escaped = True
        elif char == separator:
            out, part = [*out, part], ""
        else:
            part += char
    if escaped:
        raise bad_request(f"field selector {text!r} ends with an unfinished escape")
    return [*out, part]


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _field(term: str, allowed: Callable[[str], bool]) -> FieldRequirement:
    found = re.fullmatch(r"([^=!\\]+)(==|!=|=)(.*)", term)
    if found is None:
        raise bad_request(f"invalid field selector {term!r}: expected path=value, path==value "
                          "or path!=value")  # fmt: skip
    path, op, value = found.groups()
    path = path.strip()
    if not allowed(path):
        raise bad_request(f'field label not supported: "{path}"')
    if re.search(r"(?<!\\)[=!]", value):
        raise bad_request(f"invalid field selector {term!r}: escape '=' in a value as '\\='")
    return FieldRequirement(path, _unescape(value), op != "!=")


def parse_fields(text: str, allowed: Callable[[str], bool]) -> FieldSelector:
    """The selector of ``fieldSelector``; ``allowed`` says which paths the resource supports.

    :raises ApiFailure: 400, malformed or naming an unsupported path.
    """
    if not text.strip():
        return FieldSelector()
    return FieldSelector(tuple(_field(t, allowed) for t in _split(text, ",")))
