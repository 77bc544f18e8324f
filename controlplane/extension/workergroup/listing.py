"""List and watch options of a request, and the pure decisions on them.

- **Selectors**: ``labelSelector`` in the Kubernetes grammar (``k=v``, ``k==v``, ``k!=v``,
  ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``; requirements joined by ``,``) and
  ``fieldSelector`` on ``metadata.name`` and ``metadata.namespace`` (``=``, ``==``, ``!=``). A
  selector that does not parse, or a field no resource here supports, is a 400.
- **Pages**: ``limit`` cuts the sorted list; ``continue`` is an opaque token holding the
  resourceVersion of the first page and the last key served. The rest of a list is served from
  the current state; objects that changed meanwhile are changes after the token's version,
  which a watch from the list's version replays, so nothing is missed. A token older than the
  history (see :meth:`Mirror.since`) is 410 Gone, as kube-apiserver answers an expired one.
- **resourceVersion** of a list: unset or ``0`` (any: the memory state), or a version with
  ``resourceVersionMatch`` ``NotOlderThan`` (the default) or ``Exact``; the state here is always
  the newest, so ``NotOlderThan`` is served once the mirror reached it and ``Exact`` only when it
  is the current version (else 410: kube-apiserver would read etcd's past, which is not kept).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from controlplane.extension.workergroup.mirror import Key

__all__ = ["Invalid", "ListOptions", "Requirement", "match", "options", "page"]

MAX_LIMIT: Final = 10_000
FIELDS: Final = ("metadata.name", "metadata.namespace")


class Invalid(Exception):
    """A request option that cannot be served: ``code`` is the HTTP status (400 or 410)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = code, reason


class Requirement(msgspec.Struct, frozen=True):
    key: str
    op: str
    """``=``, ``!=``, ``in``, ``notin``, ``exists``, ``!``."""
    values: tuple[str, ...] = ()


class ListOptions(msgspec.Struct, frozen=True, kw_only=True):
    labels: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()
    limit: int = 0
    after: Key | None = None
    """The last key the previous page served (``continue``)."""
    version: int | None = None
    """The resourceVersion asked for (None: unset or 0)."""
    exact: bool = False
    continued_at: int | None = None
    """The first page's resourceVersion (with ``continue``)."""


_LABEL: Final = re.compile(
    r"^(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE: Final = re.compile(r"^(?:[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_SET: Final = re.compile(
    r"^\s*(!?)\s*([^\s!=,()]+)\s*(?:(==|=|!=)\s*([^\s,()]*)|\s+(in|notin)\s*\(([^()]*)\))?\s*$"
)


def _split(text: str) -> list[str]:
    """``text`` cut at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _requirement(part: str, *, fields: bool) -> Requirement:
    found = _SET.match(part)
    if found is None:
        raise Invalid(400, "BadRequest", f"unable to parse requirement: {part.strip()!r}")
    bang, key, op, value, set_op, values = found.groups()
    if fields:
        if bang or set_op or not op:
            raise Invalid(400, "BadRequest", f"field selector {part.strip()!r}: only =, ==, !=")
        if key not in FIELDS:
            raise Invalid(400, "BadRequest", f'field label not supported: "{key}"')
        return Requirement(key, "!=" if op == "!=" else "=", (value,))
    if not _LABEL.match(key):
        raise Invalid(400, "BadRequest", f"invalid label key {key!r}")
    if bang:
        if op or set_op:
            raise Invalid(400, "BadRequest", f"unable to parse requirement: {part.strip()!r}")
        return Requirement(key, "!")
    if set_op:
        vals = tuple(v.strip() for v in values.split(","))
        if not all(_VALUE.match(v) for v in vals):
            raise Invalid(400, "BadRequest", f"invalid label value in {part.strip()!r}")
        return Requirement(key, set_op, vals)
    if op:
        if not _VALUE.match(value):
            raise Invalid(400, "BadRequest", f"invalid label value {value!r}")
        return Requirement(key, "!=" if op == "!=" else "=", (value,))
    return Requirement(key, "exists")


def _selector(text: str, *, fields: bool) -> tuple[Requirement, ...]:
    return tuple(_requirement(p, fields=fields) for p in _split(text))


def _holds(req: Requirement, value: str | None) -> bool:
    if req.op == "exists":
        return value is not None
    if req.op == "!":
        return value is None
    if req.op in ("=", "in"):
        return value is not None and value in req.values
    return value is None or value not in req.values  # != and notin


def match(opts: ListOptions, body: Mapping[str, Any]) -> bool:
    """Whether ``body`` passes the label and field selectors."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    if not all(_holds(r, labels.get(r.key)) for r in opts.labels):
        return False
    values = {
        "metadata.name": meta.get("name") or "",
        "metadata.namespace": meta.get("namespace") or "",
    }
    return all(_holds(r, values[r.key]) for r in opts.fields)


def _number(query: Mapping[str, str], name: str) -> int:
    text = query.get(name) or "0"
    if not text.isdigit():
        raise Invalid(400, "BadRequest", f"{name} {text!r} is not a non-negative integer")
    return int(text)


def token(version: int, last: Key) -> str:
    state = json.dumps({"rv": version, "after": list(last)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(state.encode()).decode()


def _continue(text: str) -> tuple[int, Key]:
    try:
        state = json.loads(base64.urlsafe_b64decode(text.encode()))
        ns, name = state["after"]
        return int(state["rv"]), (str(ns), str(name))
    except (ValueError, KeyError, TypeError) as e:
        raise Invalid(400, "BadRequest", f"continue key is not valid: {e}") from None


def options(query: Mapping[str, str]) -> ListOptions:
    """The list options of ``query``. :raises Invalid: 400 on anything malformed."""
    version_text = query.get("resourceVersion", "")
    if version_text and not version_text.isdigit():
        raise Invalid(400, "BadRequest", f"resourceVersion {version_text!r} is not a number")
    match_ = query.get("resourceVersionMatch", "")
    if match_ not in ("", "NotOlderThan", "Exact"):
        raise Invalid(400, "BadRequest", f"resourceVersionMatch {match_!r} is not supported")
    version = int(version_text) if version_text and version_text != "0" else None
    if match_ and version_text == "":
        raise Invalid(400, "BadRequest", "resourceVersionMatch needs a resourceVersion")
    opts = ListOptions(
        labels=_selector(query.get("labelSelector", ""), fields=False),
        fields=_selector(query.get("fieldSelector", ""), fields=True),
        limit=min(_number(query, "limit"), MAX_LIMIT), version=version,
        exact=match_ == "Exact",
    )  # fmt: skip
    if query.get("continue"):
        if version is not None:
            raise Invalid(
                400, "BadRequest", "specifying resource version is not allowed when using continue"
            )
        at, after = _continue(query["continue"])
        opts = msgspec.structs.replace(opts, after=after, continued_at=at)
    return opts


def page(
    objects: Mapping[Key, dict[str, Any]], opts: ListOptions, version: int
) -> tuple[list[dict[str, Any]], str | None]:
    """The items of one page in key order, and the continue token of the next (None: last)."""
    chosen: list[tuple[Key, dict[str, Any]]] = []
    for key in sorted(k for k in objects if opts.after is None or k > opts.after):
        body = objects[key]
        if not match(opts, body):
            continue
        if opts.limit and len(chosen) == opts.limit:  # one more matches: there is a next page
            return [b for _, b in chosen], token(version, chosen[-1][0])
        chosen.append((key, body))
    return [b for _, b in chosen], None
