"""List and watch options, and the decisions on them: pure.

:func:`parse_options` reads ``metav1.ListOptions`` from a query string (400 on anything
malformed, never ignored); :func:`list_page` picks one page of a list from an
:class:`~controlplane.extension.core.store.ObjectCache`; :func:`watch_start` says where a watch
begins; :func:`visible` filters one watch event through the selectors.

resourceVersion semantics (as kube-apiserver's, over the cache's kept history):

- list, no ``resourceVersion``: the latest state; ``"0"``: any state (the latest here);
  ``N`` (or ``resourceVersionMatch=NotOlderThan``): the latest, if it is at least ``N``, else
  504 "Too large resource version"; ``resourceVersionMatch=Exact``: the state at ``N`` (410
  when no longer kept);
- ``limit``/``continue``: items in key order; the token (opaque, base64 JSON) carries the
  version of the first page and the last key, and every later page is cut from the state at
  that version, so a paged list is consistent; a token older than the kept history is 410, an
  unreadable one 400 (as kube-apiserver's etcd store answers);
- watch: ``N`` replays the events after ``N`` (410 as an ERROR event when too old); unset or
  ``"0"``: the current objects as ADDED first; ``sendInitialEvents=true`` (with
  ``resourceVersionMatch=NotOlderThan`` and ``allowWatchBookmarks``, as Kubernetes requires)
  sends them, then a BOOKMARK annotated ``k8s.io/initial-events-end``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from controlplane.extension.core.failures import bad_request, expired
from controlplane.extension.core.selectors import (
    FieldRequirement,
    FieldSelector,
    LabelSelector,
    parse_fields,
    parse_labels,
)
from controlplane.extension.core.store import Event, ObjectCache, key_of

__all__ = [
    "MAX_WATCH_S",
    "ListOptions",
    "Page",
    "WatchStart",
    "list_page",
    "parse_options",
    "visible",
    "watch_start",
    "with_field",
]

MAX_WATCH_S: Final = 1800.0
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"


class ListOptions(msgspec.Struct, frozen=True, kw_only=True):
    labels: LabelSelector = LabelSelector()
    fields: FieldSelector = FieldSelector()
    limit: int = 0
    continue_token: str = ""
    resource_version: str = ""
    match: str = ""
    watch: bool = False
    bookmarks: bool = False
    timeout_s: float = MAX_WATCH_S
    initial_events: bool | None = None
    namespace: str = ""
    """The URL's namespace (not a selector: it does not hide ``remainingItemCount``)."""

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels") or {}) and self.fields.matches(obj)


def _bool(query: Mapping[str, str], name: str) -> bool | None:
    text = query.get(name)
    if text is None:
        return None
    if text in ("", "1", "true", "True"):
        return True
    if text in ("0", "false", "False"):
        return False
    raise bad_request(f"{name}={text!r}: expected true or false")


def _number(query: Mapping[str, str], name: str) -> int | None:
    text = query.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise bad_request(f"{name}={text!r}: expected an integer") from None
    if value < 0:
        raise bad_request(f"{name}={text!r}: must not be negative")
    return value


def parse_options(query: Mapping[str, str], fields: Callable[[str], bool]) -> ListOptions:
    """The options of a list or watch request. :raises ApiFailure: 400."""
    rv, match = query.get("resourceVersion", ""), query.get("resourceVersionMatch", "")
    if rv and rv != "0" and not rv.isdigit():
        raise bad_request(f"resourceVersion={rv!r}: not a resource version of this server")
    if match and match not in ("Exact", "NotOlderThan"):
        raise bad_request(f"resourceVersionMatch={match!r}: Exact or NotOlderThan")
    if match and not rv and query.get("sendInitialEvents") is None:  # client-go's watch-list
        raise bad_request("resourceVersionMatch is forbidden unless resourceVersion is provided")
    if match == "Exact" and rv == "0":
        raise bad_request('resourceVersionMatch "Exact" is forbidden for resourceVersion "0"')
    token = query.get("continue", "")
    if token and rv:
        raise bad_request("specifying resource version is not allowed when using continue")
    watch = query.get("watch", "") not in ("", "0", "false")
    timeout = _number(query, "timeoutSeconds")
    initial = _bool(query, "sendInitialEvents")
    bookmarks = bool(_bool(query, "allowWatchBookmarks"))
    if initial is not None and not watch:
        raise bad_request("sendInitialEvents is forbidden for list")
    if initial and (match != "NotOlderThan" or not bookmarks):
        raise bad_request("sendInitialEvents requires resourceVersionMatch=NotOlderThan "
                          "and allowWatchBookmarks=true")  # fmt: skip
    if watch and match == "Exact":
        raise bad_request('resourceVersionMatch "Exact" is forbidden for watch')
    return ListOptions(
        labels=parse_labels(query.get("labelSelector", "")),
        fields=parse_fields(query.get("fieldSelector", ""), fields),
        limit=_number(query, "limit") or 0, continue_token=token, resource_version=rv,
        match=match, watch=watch, bookmarks=bookmarks,
        timeout_s=min(float(timeout), MAX_WATCH_S) if timeout else MAX_WATCH_S,  # 0: none
        initial_events=initial,
    )  # fmt: skip


def with_field(options: ListOptions, path: str, value: str) -> ListOptions:
    """``options`` also requiring ``path`` = ``value`` (the URL's namespace, a watched name)."""
    extra = FieldRequirement(path, value, True)
    return msgspec.structs.replace(
        options, fields=FieldSelector((*options.fields.requirements, extra))
    )


class Page(msgspec.Struct, frozen=True):
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str = ""
    remaining: int | None = None


def _encode(rv: int, start: str) -> str:
    doc = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).encode()
    return base64.urlsafe_b64encode(doc).decode().rstrip("=")


def _decode(token: str) -> tuple[int, str]:
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
        rv, start = doc["rv"], doc["start"]
        if (
            doc.get("v") != "meta.k8s.io/v1"
            or not isinstance(rv, int)
            or not isinstance(start, str)
        ):
            raise ValueError("not a continue token of this server")
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise bad_request(f"invalid continue token: {e}") from None
    return rv, start


def list_page(cache: ObjectCache, options: ListOptions) -> Page:
    """One page of the list ``options`` ask for. :raises ApiFailure: 400, 410 or 504."""
    start = ""
    if options.continue_token:
        rv, start = _decode(options.continue_token)
        if rv < cache.oldest:
            raise expired("The provided continue parameter is too old to display a consistent "
                          "list result. Start a new list without the continue parameter.")  # fmt: skip
        state = cache.state_at(rv)
    elif options.match == "Exact":
        rv = int(options.resource_version)
        state = cache.state_at(rv)
    else:
        wanted = int(options.resource_version or "0")
        cache.state_at(max(wanted, cache.rv))  # 504 when a client saw more than this cache
        rv, state = cache.rv, cache.items()
    selected = [o for o in state if (not start or key_of(o) > start) and options.matches(o)]
    if not options.limit or len(selected) <= options.limit:
        return Page(selected, str(rv))
    page = selected[: options.limit]
    remaining = None
    if not options.labels.requirements and not options.fields.requirements:
        remaining = len(selected) - len(page)
    return Page(page, str(rv), _encode(rv, key_of(page[-1])), remaining)


class WatchStart(msgspec.Struct, frozen=True):
    initial: list[dict[str, Any]]
    """Objects to send as ADDED first."""
    replay: list[Event]
    """Events after the asked version, to send next."""
    rv: int
    """The version the watch stands at after both."""
    end_bookmark: bool = False
    """Send the ``k8s.io/initial-events-end`` BOOKMARK after ``initial``."""


def watch_start(cache: ObjectCache, options: ListOptions) -> WatchStart:
    """Where a watch starts. :raises ApiFailure: 410 (too old) or 504 (newer than the cache)."""
    rv = options.resource_version
    if options.initial_events:
        if rv not in ("", "0"):
            cache.state_at(max(int(rv), cache.rv))
        return WatchStart(cache.items(), [], cache.rv, end_bookmark=True)
    if rv in ("", "0"):
        initial = [] if options.initial_events is False else cache.items()
        return WatchStart(initial, [], cache.rv)
    return WatchStart([], cache.events_after(int(rv)), cache.rv)


def visible(event: Event, options: ListOptions) -> tuple[str, dict[str, Any]] | None:
    """What a filtered watch sees of ``event``: an object leaving the selection is DELETED, one
    entering it ADDED (as kube-apiserver's watch cache filters); None: nothing."""
    now = options.matches(event.obj)
    before = event.prev is not None and options.matches(event.prev)
    if event.type == "DELETED":
        return ("DELETED", event.obj) if now else None
    if event.type == "ADDED" or not before:
        return ("ADDED", event.obj) if now else None
    return ("MODIFIED", event.obj) if now else ("DELETED", event.obj)


def initial_events_end(kind: str, api_version: str, rv: int) -> dict[str, Any]:
    return bookmark(kind, api_version, rv, {INITIAL_EVENTS_END: "true"})


def bookmark(
    kind: str, api_version: str, rv: int, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if annotations:
        meta["annotations"] = annotations
    return {"kind": kind, "apiVersion": api_version, "metadata": meta}
