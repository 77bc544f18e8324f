"""One command installs everything: the base, built by the real ``kubectl kustomize`` and applied
to a fresh (fake) cluster as ``kubectl apply --server-side -k deploy/base`` would, then the worker
started with the built Deployment's own arguments and environment. No key is made by hand: the
worker generates the bus's Secret at its first start, the NATS server then starts with the
shipped ``auth.conf`` and that Secret's values (as kubelet passes them through the StatefulSet's
``secretKeyRef``), the worker connects with the generated password, authorizes an agent with
the generated callout key, and a restart reuses the same Secret."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from deploy_helpers import BASE, REPO, build, find, kustomized, pod_spec
from test_deploy_nats import _AuthServer, _config

from bus import codec, connection, embedded, events, subjects, testing
from bus.testing import eventually
from controlplane import applications
from controlplane.admission.certificates import new_authority
from controlplane.applications.installing import resource_of
from controlplane.applications.pins import PINS
from controlplane.k8s.client import KubeSettings, open_client
from controlplane.resources import Ref
from controlplane.worker import running
from controlplane.worker.settings import settings_from
from gpustack_operator.main import options_for

# The control plane's test helpers, and its test folders (one test module is imported below by
# its bare name, as tests/controlplane/conftest.py allows there).
_CONTROLPLANE_TESTS = REPO / "tests" / "controlplane"
sys.path[:0] = [
    str(_CONTROLPLANE_TESTS),
    *(str(p) for p in sorted(_CONTROLPLANE_TESTS.iterdir()) if p.is_dir()),
]
from controlplane_fakeapi import FakeApi, fake_api
from test_controlplane_extension_api import auth_configmap

pytestmark = pytest.mark.anyio

NS = "gpustack-system"
SECRET = ("api/v1/secrets", NS, "gpustack-nats-auth")
INVENTORY = ("api/v1/configmaps", NS, "gpustack-applications")


async def _kubectl_apply(url: str, objs: list[dict[str, Any]]) -> None:
    """What ``kubectl apply --server-side -k`` sends: one apply per object, manager kubectl."""
    async with open_client(KubeSettings.for_tests(url)) as api:
        for obj in objs:
            ns = obj["metadata"].get("namespace")
            resource = resource_of(obj["apiVersion"], obj["kind"], bool(ns))
            ref = Ref(resource=resource, name=obj["metadata"]["name"], namespace=ns)
            await api.apply(ref, obj, field_manager="kubectl")


def _deployed_worker(objs: list[dict[str, Any]], url: str, nats: embedded.ServerProcess) -> Any:
    """The worker as the built Deployment runs it; only what cannot run here is replaced: the
    API (the fake), the NATS Service (a loopback server), the HTTPS port (a free one)."""
    container = pod_spec(find(objs, "Deployment", "gpustack-operator-worker"))["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    conf = settings_from(options_for(("worker",), container["args"][1:], env))
    assert conf.nats_auth_secret == "gpustack-nats-auth" and conf.bus_auth is not None
    assert conf.bus.password is None  # nothing of the Secret comes through the environment
    bus = testing.settings_for(nats, user=conf.bus.user, inbox_prefix=conf.bus.inbox_prefix)
    return msgspec.structs.replace(
        conf, kube=KubeSettings.for_tests(url, backoff_s=0.01), bus=bus,
        https=msgspec.structs.replace(conf.https, bind_address="127.0.0.1", port=0),
    )  # fmt: skip


def _secret(fake: FakeApi) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in fake.objects[SECRET]["data"].items()}


async def _agent_publishes(fake: FakeApi, nats: embedded.ServerProcess) -> None:
    token = fake.issue_token(NS, "gpustack-operator-device-manager", node="gpu-a.example")
    agent = testing.settings_for(
        nats, token=token, inbox_prefix="_INBOX.device-manager.gpu-a%2Eexample"
    )
    event = next(e for e in testing.example_events("gpu-a.example")
                 if events.kind_of(e) == "devices")  # fmt: skip
    async with connection.connect(agent, retry=False) as conn:
        await conn.publish_acked(subjects.subject("gpu-a.example", "devices"), codec.encode(event))


APPLICATIONS = "deploy/overlays/applications"


def _agent_sets(fake: FakeApi) -> dict[str, tuple[frozenset[str], str]]:
    """Every DaemonSet in the fake → (its field managers, its first container's image)."""
    return {
        key[2]: (frozenset(fake.field_managers[key]), pod_spec(obj)["containers"][0]["image"])
        for key, obj in fake.objects.items()
        if key[0] == "apis/apps/v1/daemonsets"
    }


def _worker_pod(fake: FakeApi, objs: list[dict[str, Any]]) -> str | None:
    """The worker's Pod as its ReplicaSet would create it; its name, where the Deployment hands
    it to the worker (``KUBERNETES_POD_NAME`` from the downward API)."""
    spec = pod_spec(find(objs, "Deployment", "gpustack-operator-worker"))
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    if "KUBERNETES_POD_NAME" not in env:
        return None
    assert env["KUBERNETES_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    name = "gpustack-operator-worker-7d9f-x2x4q"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
           "spec": spec}  # fmt: skip
    fake.put_object("api/v1/pods", pod)
    return name


@pytest.mark.parametrize("tree", [BASE, APPLICATIONS])
async def test_kubectl_apply_k_is_the_whole_install(
    tree: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = kustomized(tree)  # what kubectl sends
    nats = _AuthServer(tmp_path / "nats", port=embedded.free_port())
    nats.auth = _config(tree)["auth.conf"]
    async with fake_api() as (fake, url):
        fake.put_object("api/v1/configmaps", auth_configmap(new_authority()[0]))  # kube-system's
        await _kubectl_apply(url, objs)
        assert SECRET not in fake.objects  # nobody made a key by hand
        conf = _deployed_worker(objs, url, nats)
        conf = msgspec.structs.replace(conf, pod_name=_worker_pod(fake, objs))
        try:
            async with anyio.create_task_group() as tg:
                first = anyio.Event()

                async def start() -> None:
                    await tg.start(running.run, conf)
                    first.set()

                tg.start_soon(start)

                async def generated() -> bool:
                    return SECRET in fake.objects

                await eventually(generated)
                keys = _secret(fake)
                # The NATS pods start once the Secret exists, with its values as environment.
                monkeypatch.setenv("NATS_WORKER_PASSWORD", keys["worker-password"])
                monkeypatch.setenv("NATS_CALLOUT_ISSUER", keys["callout-issuer"])
                await nats.start()
                with anyio.fail_after(60):
                    await first.wait()  # the worker connected with the generated password
                await _agent_publishes(fake, nats)  # authorized with the generated callout key

                async def recorded() -> bool:
                    return INVENTORY in fake.objects

                await eventually(recorded)  # the leader went through the applications
                tg.cancel_scope.cancel()
            rv = fake.objects[SECRET]["metadata"]["resourceVersion"]
            async with anyio.create_task_group() as tg:  # a restart (or the second replica)
                await tg.start(running.run, conf)
                await _agent_publishes(fake, nats)
                tg.cancel_scope.cancel()
        finally:
            await nats.stop()
        assert _secret(fake) == keys
        assert fake.objects[SECRET]["metadata"]["resourceVersion"] == rv
        assert len(keys["worker-password"]) == 32
        outcomes = json.loads(fake.objects[INVENTORY]["data"]["status.json"])
        agent_sets = _agent_sets(fake)
    _check_applications(tree, objs, outcomes, agent_sets)


def _check_applications(
    tree: str,
    objs: list[dict[str, Any]],
    outcomes: dict[str, Any],
    agent_sets: dict[str, tuple[frozenset[str], str]],
) -> None:
    if tree == BASE:
        assert outcomes == {}  # --disable-applications=*
        assert set(agent_sets) == {o["metadata"]["name"] for o in objs if o["kind"] == "DaemonSet"}
    else:
        # Every application attempted; the upstream ones refused while their pins carry no
        # verified checksum (pins.py), never applied unverified.
        assert outcomes["model-manager"]["state"] == "installed"
        assert outcomes["device-manager"]["state"] == "installed"
        # The agents, applied by the worker under their applications' managers, with the image
        # its Pod runs (the one kustomize gave it).
        image = pod_spec(find(objs, "Deployment", "gpustack-operator-worker"))["containers"][0]
        assert len(agent_sets) == 10
        assert set(agent_sets.values()) == {
            (frozenset({"gpustack-operator-device-manager"}), image["image"]),
            (frozenset({"gpustack-operator-model-manager"}), image["image"]),
        }
        assert set(outcomes) == set(applications.NAMES)
        for name, pin in PINS.items():
            if pin.sha256 is None:  # refused before any download (no network needed here)
                assert outcomes[name]["state"] == "unpinned", name


def test_the_applications_overlay_lets_the_worker_install_every_application() -> None:
    def worker(tree: str) -> Any:
        objs = build(tree)
        container = pod_spec(find(objs, "Deployment", "gpustack-operator-worker"))["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        return objs, settings_from(options_for(("worker",), container["args"][1:], env))

    objs, conf = worker("deploy/overlays/applications")
    assert conf.applications == frozenset(applications.NAMES)
    binding = find(objs, "ClusterRoleBinding", "gpustack-operator-worker-applications")
    assert binding["roleRef"]["name"] == "cluster-admin"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpustack-operator-worker", "namespace": NS}
    ]
    base_objs, base_conf = worker(BASE)
    assert base_conf.applications == frozenset()  # the base: least privilege, nothing installed
    assert not [o for o in base_objs if o["kind"] == "ClusterRoleBinding"
                and o["roleRef"]["name"] == "cluster-admin"]  # fmt: skip


def test_the_worker_may_generate_and_read_only_its_secrets() -> None:
    from test_deploy_rbac import allows

    objs = build(BASE)
    bound = {b["roleRef"]["name"] for b in objs if b["kind"] == "RoleBinding"
             and {"kind": "ServiceAccount", "name": "gpustack-operator-worker",
                  "namespace": NS} in b["subjects"]}  # fmt: skip
    rules = [r for o in objs if o["kind"] == "Role" and o["metadata"]["name"] in bound
             for r in o["rules"]]  # fmt: skip
    for verb in ("get", "patch"):  # what controlplane/access/bootstrap.py does
        assert allows(rules, (verb, "", "secrets", "gpustack-nats-auth"))
        assert not allows(rules, (verb, "", "secrets", "someone-elses"))
    assert allows(rules, ("create", "", "secrets", ""))
    assert not allows(rules, ("list", "", "secrets", ""))
