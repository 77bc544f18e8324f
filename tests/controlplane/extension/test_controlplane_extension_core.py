"""The API-serving core's pure decisions: selectors, versions and paging, patches, server-side
apply, tables, OpenAPI and discovery, routing, writes.

JSON patch is checked against ``jsonpatch`` (an RFC 6902 implementation we did not write) on
generated documents and patches; merge patch against RFC 7386's own examples.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.extension.core import (
    discovery,
    listing,
    openapi,
    patching,
    routing,
    selectors,
    ssa,
    tables,
    validation,
    writes,
)
from controlplane.extension.core.failures import ApiFailure
from controlplane.extension.core.store import ObjectCache
from controlplane.extension.objects import GROUP_VERSION_SPEC

GV = GROUP_VERSION_SPEC
SETTINGS = GV.resources[0]


def obj(name: str, labels: dict[str, str] | None = None, **rest: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "gpustack.ai/v1", "kind": "Setting", "metadata": meta, **rest}


# --- selectors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("", {}, True),
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),  # != matches an object without the label, as in Kubernetes
        ("a!=b", {"a": "b"}, False),
        ("a", {"a": ""}, True),
        ("!a", {"a": "x"}, False),
        ("a in (x, y),b", {"a": "y", "b": "1"}, True),
        ("a notin (x,y)", {"a": "z"}, True),
        ("a notin (x,y)", {}, True),
        ("a in ()", {"a": ""}, False),
        ("n>3,n<10", {"n": "5"}, True),
        ("n>3", {"n": "abc"}, False),
        ("example.com/tier=web", {"example.com/tier": "web"}, True),
        ("a=", {"a": ""}, True),
    ],
)
def test_label_selectors(text: str, labels: dict[str, str], expected: bool) -> None:
    assert selectors.parse_labels(text).matches(labels) is expected


@pytest.mark.parametrize(
    "text", ["a=b=c", "a in (x", "a,", "=b", "a in x", "n>x", "-a=b", "a=" + "x" * 64, "Bad_/x=y"]
)
def test_malformed_label_selectors_are_a_400(text: str) -> None:
    with pytest.raises(ApiFailure) as e:
        selectors.parse_labels(text)
    assert e.value.code == 400


def test_field_selectors() -> None:
    allowed = SETTINGS.allows_field
    o = {"metadata": {"name": "a,b", "namespace": "ns"}, "status": {"editable": False}}
    assert selectors.parse_fields(r"metadata.name=a\,b", allowed).matches(o)
    assert selectors.parse_fields("metadata.namespace!=x,status.editable==false", allowed).matches(
        o
    )
    assert not selectors.parse_fields("metadata.name==a", allowed).matches(o)
    for bad in ("spec.value=1", "metadata.name", "metadata.name=a=b", "metadata.name=x\\"):
        with pytest.raises(ApiFailure) as e:
            selectors.parse_fields(bad, allowed)
        assert e.value.code == 400


# --- the cache, versions and pages -------------------------------------------------------------


def cache_with(names: list[str], *, history: int = 1000) -> ObjectCache:
    cache = ObjectCache("test", start=100, history=history, now=lambda: "2026-01-02T03:04:05Z")
    cache.sync([obj(n) for n in names])
    return cache


def test_the_cache_versions_changes_and_rebuilds_past_states() -> None:
    cache = cache_with(["a", "b"])
    assert [o["metadata"]["resourceVersion"] for o in cache.items()] == ["100", "100"]
    events = cache.sync([obj("a", spec={"v": 1}), obj("c")])
    assert [(e.type, e.rv, e.obj["metadata"]["name"]) for e in events] == [
        ("DELETED", 101, "b"), ("MODIFIED", 102, "a"), ("ADDED", 103, "c")]  # fmt: skip
    assert cache.sync([obj("a", spec={"v": 1}), obj("c")]) == []  # nothing changed: no version
    assert [o["metadata"]["name"] for o in cache.state_at(100)] == ["a", "b"]
    at_102 = {o["metadata"]["name"]: o for o in cache.state_at(102)}
    assert set(at_102) == {"a"} and at_102["a"]["spec"] == {"v": 1}
    assert cache.get("a")["metadata"]["creationTimestamp"] == "2026-01-02T03:04:05Z"
    assert cache.get("a")["metadata"]["uid"] == cache.state_at(100)[0]["metadata"]["uid"]


def test_versions_older_than_the_history_are_gone_and_newer_ones_too_large() -> None:
    cache = cache_with(["a"], history=2)
    for v in range(3):
        cache.sync([obj("a", spec={"v": v})])
    assert cache.oldest == 101
    with pytest.raises(ApiFailure) as old:
        cache.events_after(100)
    with pytest.raises(ApiFailure) as new:
        cache.state_at(999)
    assert (old.value.code, old.value.reason) == (410, "Expired")
    assert new.value.code == 504 and new.value.details["causes"][0]["reason"] == (
        "ResourceVersionTooLarge"
    )
    assert [e.rv for e in cache.events_after(101)] == [102, 103]


def options(**query: str) -> listing.ListOptions:
    return listing.parse_options(query, SETTINGS.allows_field)


def test_pages_are_consistent_and_tokens_expire() -> None:
    cache = cache_with(["a", "b", "c", "d", "e"], history=3)
    first = listing.list_page(cache, options(limit="2"))
    assert [o["metadata"]["name"] for o in first.items] == ["a", "b"] and first.remaining == 3
    cache.sync([obj(n) for n in ("a", "b", "d", "e", "f")])  # c deleted, f added after page 1
    second = listing.list_page(cache, options(limit="2", **{"continue": first.continue_token}))
    assert [o["metadata"]["name"] for o in second.items] == ["c", "d"]  # the first page's state
    assert second.resource_version == first.resource_version
    for v in range(3):
        cache.sync([obj("a", spec={"v": v})])
    with pytest.raises(ApiFailure) as gone:
        listing.list_page(cache, options(limit="2", **{"continue": second.continue_token}))
    assert gone.value.code == 410


def test_resource_version_semantics_of_a_list() -> None:
    cache = cache_with(["a"])
    cache.sync([obj("a"), obj("b")])
    assert len(listing.list_page(cache, options(resourceVersion="100",
                                                resourceVersionMatch="Exact")).items) == 1  # fmt: skip
    assert len(listing.list_page(cache, options(resourceVersion="0")).items) == 2
    assert listing.list_page(cache, options(resourceVersion="100")).resource_version == "101"
    with pytest.raises(ApiFailure) as large:
        listing.list_page(cache, options(resourceVersion="500"))
    assert large.value.code == 504
    selected = listing.list_page(cache, options(limit="1", labelSelector="!x"))
    assert selected.continue_token and selected.remaining is None  # hidden with a selector


@pytest.mark.parametrize(
    "query",
    [
        {"resourceVersionMatch": "Exact"},
        {"resourceVersion": "0", "resourceVersionMatch": "Exact"},
        {"resourceVersion": "x"},
        {"resourceVersion": "5", "continue": "abc"},
        {"limit": "-1"},
        {"timeoutSeconds": "soon"},
        {"watch": "1", "sendInitialEvents": "true"},
        {
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "resourceVersion": "0",
        },
        {"allowWatchBookmarks": "maybe"},
    ],
)
def test_malformed_list_options_are_a_400(query: dict[str, str]) -> None:
    with pytest.raises(ApiFailure) as e:
        options(**query)
    assert e.value.code == 400


def test_watch_starts_and_filtering() -> None:
    cache = cache_with(["a"])
    cache.sync([obj("a", {"x": "1"})])
    fresh = listing.watch_start(cache, options(watch="1"))
    assert [o["metadata"]["name"] for o in fresh.initial] == ["a"] and fresh.replay == []
    resumed = listing.watch_start(cache, options(watch="1", resourceVersion="100"))
    assert [e.type for e in resumed.replay] == ["MODIFIED"] and resumed.initial == []
    initial = listing.watch_start(cache, options(
        watch="1", sendInitialEvents="true", resourceVersionMatch="NotOlderThan",
        resourceVersion="0", allowWatchBookmarks="true"))  # fmt: skip
    assert initial.end_bookmark and len(initial.initial) == 1
    watch_list = listing.watch_start(cache, options(  # as client-go's WatchList asks: no version
        watch="1", sendInitialEvents="true", resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true"))  # fmt: skip
    assert watch_list.end_bookmark and len(watch_list.initial) == 1
    leaving = cache.sync([obj("a", {"x": "2"})])[0]
    entering = cache.sync([obj("a", {"x": "1"})])[0]
    watching = options(watch="1", labelSelector="x=1")
    assert listing.visible(leaving, watching) == ("DELETED", leaving.obj)
    assert listing.visible(entering, watching) == ("ADDED", entering.obj)
    with pytest.raises(ApiFailure) as gone:
        listing.watch_start(cache, options(watch="1", resourceVersion="1"))
    assert gone.value.code == 410


# --- patches -----------------------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(["a", "b"]))
_docs = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c~", "d/e"]), inner, max_size=3),
    ),
    max_leaves=8,
)


def _paths(doc: Any, at: str = "") -> list[str]:
    out = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, f"{at}/{k.replace('~', '~0').replace('/', '~1')}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, f"{at}/{i}")
        out.append(f"{at}/-")
    return out


@st.composite
def _doc_and_patch(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = draw(st.dictionaries(st.sampled_from(["a", "b", "c~", "d/e"]), _docs, max_size=3))
    paths = _paths(doc) + ["/zz", "/a/0"]
    ops = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["add", "remove", "replace", "move", "copy", "test"]))
        op: dict[str, Any] = {"op": kind, "path": draw(st.sampled_from(paths))}
        if kind in ("add", "replace", "test"):
            op["value"] = draw(_docs)
        if kind in ("move", "copy"):
            op["from"] = draw(st.sampled_from(paths))
        ops.append(op)
    return doc, ops


@settings(max_examples=400, deadline=None)
@given(_doc_and_patch())
def test_json_patch_agrees_with_jsonpatch(case: tuple[dict[str, Any], list[Any]]) -> None:
    doc, ops = case
    before = copy.deepcopy(doc)
    try:
        expected: Any = jsonpatch.apply_patch(doc, ops)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError,
            IndexError, KeyError):  # fmt: skip
        expected = "fails"
    try:
        got: Any = patching.json_patch(doc, ops)
    except ApiFailure as e:
        assert e.code in (400, 422)
        got = "fails"
    assert doc == before  # never mutated
    assert got == expected


@pytest.mark.parametrize(
    ("target", "patch", "result"),  # RFC 7386, Appendix A
    [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_rfc7386_examples(target: Any, patch: Any, result: Any) -> None:
    assert patching.merge_patch(target, patch) == result


def test_strategic_merge_merges_map_lists_by_key() -> None:
    schema = {"properties": {"status": {"properties": {"conditions": {
        "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
        "items": {"type": "object"}}}}}}  # fmt: skip
    live = {"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B"}]}}
    patch = {"status": {"conditions": [{"type": "A", "status": "False"},
                                       {"type": "B", "$patch": "delete"}, {"type": "C"}]}}  # fmt: skip
    assert patching.strategic_merge_patch(live, patch, schema) == {"status": {"conditions": [
        {"type": "A", "status": "False"}, {"type": "C"}]}}  # fmt: skip
    assert patching.strategic_merge_patch({"l": [1, 2]}, {"l": [3]}, schema) == {"l": [3]}


# --- server-side apply -------------------------------------------------------------------------


def test_apply_owns_conflicts_and_forgets() -> None:
    schema = SETTINGS.schema
    live = obj("a", spec={"value": "1"})
    applied, managed = ssa.apply(live, obj("a", spec={"value": "2"}), manager="alice",
                                 force=False, schema=schema, api_version="v", now="t")  # fmt: skip
    assert applied["spec"] == {"value": "2"}
    assert managed[0]["fieldsV1"] == {"f:spec": {"f:value": {}}}
    live = {**applied, "metadata": {**applied["metadata"], "managedFields": managed}}
    with pytest.raises(ApiFailure) as e:
        ssa.apply(live, obj("a", spec={"value": "3"}), manager="bob", force=False,
                  schema=schema, api_version="v", now="t")  # fmt: skip
    assert e.value.code == 409 and e.value.details["causes"][0]["field"] == ".spec.value"
    _, both = ssa.apply(live, obj("a", spec={"value": "2"}), manager="bob", force=False,
                             schema=schema, api_version="v", now="t")  # fmt: skip
    assert sorted(m["manager"] for m in both) == ["alice", "bob"]  # equal values: shared
    taken, after = ssa.apply(live, obj("a", spec={"value": "3"}), manager="bob", force=True,
                             schema=schema, api_version="v", now="t")  # fmt: skip
    assert [m["manager"] for m in after] == ["bob"] and taken["spec"]["value"] == "3"
    # alice stops applying the labels she applied before: they go, unless someone else owns them
    live = obj("a", {"x": "1"}, spec={"value": "2"})
    _, mine = ssa.apply(live, obj("a", {"x": "1"}, spec={"value": "2"}), manager="alice",
                        force=False, schema=schema, api_version="v", now="t")  # fmt: skip
    live["metadata"]["managedFields"] = mine
    dropped, _ = ssa.apply(live, obj("a", spec={"value": "2"}), manager="alice", force=False,
                           schema=schema, api_version="v", now="t")  # fmt: skip
    assert "labels" not in dropped["metadata"] or not dropped["metadata"]["labels"]


def test_fields_v1_round_trips_and_updates_take_changed_fields() -> None:
    paths = frozenset({("f:spec", "f:value"), ("f:status", "f:c", 'k:{"type":"A"}'),
                       ("f:status", "f:c", 'k:{"type":"A"}', "f:s")})  # fmt: skip
    encoded = ssa.to_fields_v1(paths)
    assert encoded["f:status"]["f:c"]['k:{"type":"A"}'] == {".": {}, "f:s": {}}
    assert ssa.from_fields_v1(encoded) == paths
    old = obj("a", spec={"value": "1"})
    old["metadata"]["managedFields"] = [{"manager": "alice", "operation": "Apply",
                                         "fieldsV1": {"f:spec": {"f:value": {}}}}]  # fmt: skip
    managed = ssa.updated(old, obj("a", spec={"value": "2"}), manager="bob",
                          schema=SETTINGS.schema, api_version="v", now="t")  # fmt: skip
    assert [(m["manager"], m["operation"]) for m in managed] == [("bob", "Update")]


# --- writes ------------------------------------------------------------------------------------


def _write(live: dict[str, Any] | None, doc: Any, verb: str = "update",
           content_type: str = "application/json", **query: str) -> writes.Plan:  # fmt: skip
    return writes.planned(GV, SETTINGS, live, doc, writes.Write(
        verb=verb, content_type=content_type, name="a", namespace="ns", query=query,
        manager="m", now="t"))  # fmt: skip


def test_every_write_checks_the_version_and_the_identity() -> None:
    live = {**obj("a", spec={"value": "1"}), "metadata": {"name": "a", "namespace": "ns",
                                                          "resourceVersion": "7", "uid": "u"}}  # fmt: skip
    stale = {"metadata": {"resourceVersion": "6"}, "spec": {"value": "2"}}
    for verb, ctype, body in [
        ("update", "application/json", {**obj("a"), **stale}),
        ("patch", "application/merge-patch+json", stale),
        ("patch", "application/strategic-merge-patch+json", stale),
        ("patch", "application/json-patch+json",
         [{"op": "replace", "path": "/metadata/resourceVersion", "value": "6"}]),
        ("patch", "application/apply-patch+yaml", {**obj("a"), **stale}),
    ]:  # fmt: skip
        with pytest.raises(ApiFailure) as e:
            _write(live, body, verb, ctype, fieldManager="m")
        assert e.value.code == 409, (verb, ctype)
    for body in ({**obj("b")}, {**obj("a"), "kind": "Other"},
                 {"metadata": {"name": "a", "namespace": "elsewhere"}}):  # fmt: skip
        with pytest.raises(ApiFailure) as e:
            _write(live, body)
        assert e.value.code == 400
    ok = _write(live, {"metadata": {"resourceVersion": "7"}, "spec": {"value": "2"}})
    assert ok.obj["metadata"]["uid"] == "u" and ok.obj["spec"] == {"value": "2"}
    with pytest.raises(ApiFailure) as no_manager:
        _write(live, obj("a"), "patch", "application/apply-patch+yaml")
    assert no_manager.value.code == 400
    with pytest.raises(ApiFailure) as strict:
        _write(live, {**obj("a"), "spec": {"colour": 1}}, fieldValidation="Strict")
    assert strict.value.code == 400 and 'unknown field "spec.colour"' in str(strict.value)
    warned = _write(live, {**obj("a"), "spec": {"value": "1", "colour": 1}},
                    fieldValidation="Warn")  # fmt: skip
    assert warned.warnings == ['unknown field "spec.colour"']
    with pytest.raises(ApiFailure) as patched:
        _write(live, {"spec": {"colour": 1}}, "patch", "application/merge-patch+json",
               fieldValidation="Strict")  # fmt: skip
    assert patched.value.code == 400 and "spec.colour" in str(patched.value)


def test_unknown_fields_respect_open_schemas() -> None:
    schema = {"properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields":
                                      True}, "m": {"additionalProperties": {"type": "string"}}}}  # fmt: skip
    doc = {"spec": {"anything": 1}, "m": {"k": "v"}, "metadata": {"colour": 1}, "x": 1}
    assert validation.unknown_fields(doc, schema) == ["metadata.colour", "x"]


# --- tables, routing, discovery, OpenAPI --------------------------------------------------------


def test_tables_evaluate_printer_column_paths() -> None:
    o = {"metadata": {"name": "n", "creationTimestamp": "2026-01-01T00:00:00Z"},
         "status": {"conditions": [{"type": "A", "status": "False"},
                                   {"type": "Ready", "status": "True"}],
                    "n": 3, "ok": True}}  # fmt: skip
    assert tables.evaluate(o, '.status.conditions[?(@.type=="Ready")].status') == ["True"]
    assert tables.evaluate(o, ".status.conditions[*].type") == ["A", "Ready"]
    assert tables.evaluate(o, ".status.conditions[1].type") == ["Ready"]
    cols = [tables.Column(name="N", type="integer", json_path=".status.n"),
            tables.Column(name="Ok", json_path=".status.ok"),
            tables.Column(name="Age", type="date", json_path=".metadata.creationTimestamp")]  # fmt: skip
    now = datetime(2026, 1, 3, 1, 0, tzinfo=UTC)
    t = tables.table([o], cols, now=now)
    assert t["rows"][0]["cells"] == ["n", 3, "true", "2d"]
    assert t["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert "object" not in tables.table([o], cols, now=now, include="None")["rows"][0]
    assert tables.age("2026-01-03T00:59:30Z", now) == "30s"
    assert tables.age("2025-01-01T00:00:00Z", now) == "367d"


def test_routes() -> None:
    r = routing.route([GV], "/apis/gpustack.ai/v1/namespaces/ns/settings/x", "PATCH", {})
    assert r is not None and (r.verb, r.namespace, r.name) == ("patch", "ns", "x")
    w = routing.route([GV], "/apis/gpustack.ai/v1/settings", "GET", {"watch": "true"})
    assert w is not None and w.verb == "watch"
    assert routing.route([GV], "/apis/gpustack.ai/v1", "GET", {}) is None
    for path in ("/apis/gpustack.ai/v1/nope", "/apis/other/v1/x",
                 "/apis/gpustack.ai/v1/namespaces/ns/nodeutilizations",
                 "/apis/gpustack.ai/v1/settings/a/b"):  # fmt: skip
        with pytest.raises(ApiFailure) as e:
            routing.route([GV], path, "GET", {})
        assert e.value.code == 404


def test_discovery_v2_only_when_asked() -> None:
    assert discovery.wants_v2(
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    )
    assert not discovery.wants_v2("application/json")
    v2 = discovery.v2_list([GV])
    resources = v2["items"][0]["versions"][0]["resources"]
    assert resources[0]["resource"] == "settings" and resources[0]["scope"] == "Namespaced"
    assert resources[0]["responseKind"] == {"group": "gpustack.ai", "version": "v1",
                                            "kind": "Setting"}  # fmt: skip


def test_openapi_documents_reference_what_they_define() -> None:
    v3 = openapi.v3_document(GV)
    v2 = openapi.v2_document([GV])
    for doc, defs, prefix in ((v3, v3["components"]["schemas"], "#/components/schemas/"),
                              (v2, v2["definitions"], "#/definitions/")):  # fmt: skip
        refs = set(re.findall(r'"\$ref": "([^"]+)"', json.dumps(doc)))
        assert refs and all(r.startswith(prefix) and r[len(prefix) :] in defs for r in refs)
    setting = v3["components"]["schemas"]["ai.gpustack.v1.Setting"]
    assert setting["x-kubernetes-group-version-kind"] == [
        {"group": "gpustack.ai", "version": "v1", "kind": "Setting"}]  # fmt: skip
    patch = v3["paths"]["/apis/gpustack.ai/v1/namespaces/{namespace}/settings/{name}"]["patch"]
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    index = openapi.v3_index([GV])["paths"]["apis/gpustack.ai/v1"]["serverRelativeURL"]
    assert index.endswith(openapi.encoded(v3)[1])


@pytest.mark.parametrize(
    ("value", "tested"),
    [(False, 0), (True, 1), (True, 1.0), ({"a": False}, {"a": 0}), ([0], [False]), ("1", 1)],
)
def test_json_patch_test_compares_json_types(value: Any, tested: Any) -> None:
    # Hypothesis found `false` passing a test against `0` (Python's ==); jsonpatch refuses it.
    ops = [{"op": "test", "path": "/v", "value": tested}]
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch({"v": value}, ops)
    with pytest.raises(ApiFailure) as failed:
        patching.json_patch({"v": value}, ops)
    assert failed.value.code == 422
    assert patching.json_patch({"v": 1}, [{"op": "test", "path": "/v", "value": 1.0}]) == {"v": 1}


def versioned(name: str, rv: int, **rest: Any) -> dict[str, Any]:
    o = obj(name, **rest)
    o["metadata"]["resourceVersion"] = str(rv)
    return o


def test_store_versions_are_served_alike_by_every_replica() -> None:
    """Two workers (caches started apart) over one store that versions its objects: same
    versions, so a continue token or a watch version from one means the same on the other."""
    early = ObjectCache("test", start=10**15)
    early.sync([versioned("a", 5, spec={"v": 0}), versioned("b", 5)])
    changed = early.sync([versioned("a", 9, spec={"v": 1}), versioned("b", 9)])
    assert [(e.type, e.rv) for e in changed] == [("MODIFIED", 9)]  # b's content did not change
    assert early.get("b")["metadata"]["resourceVersion"] == "9"  # ... but its version moved
    late = ObjectCache("test", start=2 * 10**15)
    late.sync([versioned("a", 9, spec={"v": 1}), versioned("b", 9)])
    assert [o["metadata"]["resourceVersion"] for o in late.items()] == ["9", "9"] == [
        o["metadata"]["resourceVersion"] for o in early.items()]  # fmt: skip
    token = listing.list_page(early, options(limit="1")).continue_token
    rest = listing.list_page(late, options(limit="1", **{"continue": token}))
    assert [o["metadata"]["name"] for o in rest.items] == ["b"]
    # a store that changes an object without moving its version still tells watchers
    moved = late.sync([versioned("a", 9, spec={"v": 2}), versioned("b", 9)])
    assert [e.rv for e in moved] == [10] and late.get("a")["metadata"]["resourceVersion"] == "10"
    # an informer's deletion: the collection's version, the same on every replica
    for cache, a in ((early, versioned("a", 9, spec={"v": 1})), (late, versioned("a", 11))):
        (gone,) = [e for e in cache.sync([a], version=12) if e.type == "DELETED"]
        assert (gone.type, gone.rv, gone.obj["metadata"]["name"]) == ("DELETED", 12, "b")


def test_a_view_of_a_crd_takes_its_names_schema_and_columns() -> None:
    from controlplane.extension.core.model import from_crd
    from controlplane.schema import crds

    crd = crds.definitions()["devices"]
    spec = from_crd(crd, verbs=("get", "list", "watch"))
    assert (spec.plural, spec.kind, spec.short, spec.namespaced) == (
        "devices", "Devices", ("devs",), False)  # fmt: skip
    assert spec.schema is crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert [c.name for c in spec.columns][:2] == ["Product", "Accelerators"]
    assert "Age" not in [c.name for c in spec.columns]  # the core adds its own
