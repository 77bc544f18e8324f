"""The worker's rights on CustomResourceDefinitions: our three, by name, and exactly enough for
what ``controlplane/schema/crds.py`` does with them.

RBAC is evaluated here the way the API server's RBAC authorizer matches one rule: verb, API group
and resource each listed (or ``*``), and ``resourceNames`` either empty or holding the request's
name. A server-side apply is a PATCH to the object's URL: it is authorized as ``patch`` with that
name and, when it creates the object, also as ``create`` with that name (a POST create carries no
name, so a rule with ``resourceNames`` never allows it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from deploy_helpers import BASE, INSTALLS, REPO, build, find

from bus import events
from controlplane import errors
from controlplane.access.reviewer import KubeReviewer
from controlplane.k8s.client import KubeClient
from controlplane.reconciling import podevents
from controlplane.resources import CRDS, EVENTS, PODS, SUBJECTACCESSREVIEWS, TOKENREVIEWS, Ref
from controlplane.schema import crds

OUR_CRDS = sorted(crd["metadata"]["name"] for crd in crds.definitions().values())
WORKER_ROLE = "gpustack-operator-worker"
PRODUCTION = ("gpustack_operator", "agent", "controlplane", "hub", "kit", "bus")

Request = tuple[str, str, str, str]
"""verb, API group, resource, name"""


def _has(values: list[str], wanted: str) -> bool:
    return wanted in values or "*" in values


def allows(rules: list[dict[str, Any]], request: Request) -> bool:
    verb, group, resource, name = request
    return any(
        _has(r["verbs"], verb)
        and _has(r.get("apiGroups", []), group)
        and _has(r.get("resources", []), resource)
        and (not r.get("resourceNames") or name in r["resourceNames"])
        for r in rules
    )


def _crd_rules(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Every rule of every Role and ClusterRole that can apply to CRDs (wildcards included)."""
    return [
        (f"{role['kind']}/{role['metadata']['name']}", rule)
        for role in objs
        if role["kind"] in {"Role", "ClusterRole"}
        for rule in role.get("rules", [])
        if _has(rule.get("apiGroups", []), CRDS.group)
        and _has(rule.get("resources", []), CRDS.plural)
    ]


@pytest.mark.parametrize("tree", INSTALLS)
def test_every_rule_on_crds_names_exactly_ours(tree: str) -> None:
    rules = _crd_rules(build(tree))
    assert [where for where, _ in rules] == [f"ClusterRole/{WORKER_ROLE}"]
    for where, rule in rules:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], where
        assert sorted(rule.get("resourceNames", [])) == OUR_CRDS, where


def _worker_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = find(build(BASE), "ClusterRole", WORKER_ROLE)["rules"]
    return rules


def _crd_request(verb: str, name: str) -> Request:
    return (verb, CRDS.group, CRDS.plural, name)


def test_the_rules_refuse_what_the_worker_must_not_do() -> None:
    rules = _worker_rules()
    ours = OUR_CRDS[0]
    assert allows(rules, _crd_request("patch", ours))
    assert not allows(rules, _crd_request("patch", "widgets.example.com"))
    assert not allows(rules, _crd_request("create", "widgets.example.com"))
    assert not allows(rules, _crd_request("create", ""))  # POST: no name at authorization
    for verb in ("update", "delete", "deletecollection", "list", "watch"):
        assert not allows(rules, _crd_request(verb, ours)), verb


class _RecordingClient:
    """The two calls ``controlplane.schema.crds`` makes, recorded; names in ``missing`` are absent."""

    def __init__(self, missing: set[str]) -> None:
        self.missing = set(missing)
        self.calls: list[tuple[str, Ref]] = []
        self.recreated = anyio.Event()

    async def get(self, ref: Ref) -> dict[str, Any]:
        self.calls.append(("get", ref))
        if ref.name in self.missing:
            raise errors.NotFound(404, f"{ref} not found")
        return {}

    async def apply(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("apply", ref))
        assert body["metadata"]["name"] == ref.name
        if ref.name in self.missing:
            self.missing.discard(ref.name)
            self.recreated.set()
        return body


def _authorizations(call: str, ref: Ref) -> list[Request]:
    """What the API server authorizes for one call (``apply`` may create: both checks)."""
    assert ref.path().endswith(f"/{CRDS.plural}/{ref.name}"), "the name must be in the URL"
    verbs = {"get": ["get"], "apply": ["patch", "create"]}[call]
    return [_crd_request(verb, ref.name) for verb in verbs]


@pytest.mark.anyio
async def test_what_the_worker_does_with_crds_is_allowed_and_touches_only_ours() -> None:
    client = _RecordingClient(missing=set(OUR_CRDS))
    api = cast(KubeClient, client)
    await crds.ensure(api)
    assert not client.missing
    client.missing.add(OUR_CRDS[1])  # someone deletes one; keep_present applies it again
    client.recreated = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(crds.keep_present, api, 0.001)
            await client.recreated.wait()
            tg.cancel_scope.cancel()
    assert {(call, ref.name) for call, ref in client.calls} == {
        *(("apply", n) for n in OUR_CRDS),
        *(("get", n) for n in OUR_CRDS),
    }
    rules = _worker_rules()
    for call, ref in client.calls:
        assert ref.resource == CRDS
        for request in _authorizations(call, ref):
            assert allows(rules, request), request


def test_only_the_crd_module_names_the_crd_resource() -> None:
    """Nothing else in the production code can touch CustomResourceDefinitions: the resource is
    defined in ``controlplane/resources.py`` and used by ``controlplane/schema/crds.py`` alone."""
    users = {
        str(path.relative_to(REPO))
        for package in PRODUCTION
        for path in (REPO / package).rglob("*.py")
        if re.search(r"\bCRDS\b|customresourcedefinitions|apiextensions", path.read_text())
    }
    assert users == {"controlplane/resources.py", "controlplane/schema/crds.py"}
    assert Path(crds.__file__).resolve() == REPO / "controlplane/schema/crds.py"


class _ReviewRecorder:
    """The one call ``controlplane.access.reviewer`` makes, recorded; every token is Prometheus'."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((method, path))
        if body["kind"] == "TokenReview":
            return {"status": {"authenticated": True, "user": {"username": "prometheus"}}}
        return {"status": {"allowed": True}}


@pytest.mark.anyio
async def test_the_worker_may_create_the_reviews_it_sends_and_do_nothing_else_with_them() -> None:
    recorder = _ReviewRecorder()
    decision = await KubeReviewer(cast(KubeClient, recorder)).allowed("t", "/metrics")
    assert decision.allowed
    rules = _worker_rules()
    sent = {(method, path) for method, path in recorder.calls}
    reviews = (TOKENREVIEWS, SUBJECTACCESSREVIEWS)
    assert sent == {("POST", r.collection_path()) for r in reviews}
    for resource in reviews:
        assert allows(rules, ("create", resource.group, resource.plural, ""))
        for verb in ("get", "list", "watch", "update", "patch", "delete"):
            assert not allows(rules, (verb, resource.group, resource.plural, "")), verb


class _EventRecorder:
    """The calls :class:`PodEventer` makes on Events; the first create meets an existing one."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Ref]] = []

    async def create(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", ref))
        raise errors.Conflict(409, "AlreadyExists")

    async def get(self, ref: Ref) -> dict[str, Any]:
        self.calls.append(("get", ref))
        if ref.resource == PODS:  # the Pod is read first: it must run on the reporting node
            return {"metadata": {"uid": "u"}, "spec": {"nodeName": "n1"}}
        return {"count": 3}

    async def patch(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", ref))
        assert body["count"] == 4
        return body


@pytest.mark.anyio
async def test_the_worker_may_post_and_update_the_pod_events_it_writes() -> None:
    recorder = _EventRecorder()
    pod = events.WaitingPod(namespace="team-a", name="llm-0", uid="u")
    post = podevents.Post("n1", "sha256:" + "a" * 64, pod, podevents.DOWNLOADING, "41%")
    await podevents.PodEventer().write(cast(KubeClient, recorder), post)
    rules = _worker_rules()
    assert [call for call, _ in recorder.calls] == ["get", "create", "get", "patch"]
    (_, read), *written = recorder.calls
    assert read.resource == PODS and read.namespace == "team-a"
    assert allows(rules, ("get", PODS.group, PODS.plural, read.name))
    for call, ref in written:
        assert ref.resource == EVENTS and ref.namespace == "team-a"
        assert allows(rules, (call, EVENTS.group, EVENTS.plural, ref.name)), call
    for verb in ("list", "watch", "update", "delete"):
        assert not allows(rules, (verb, EVENTS.group, EVENTS.plural, "")), verb
