"""The Kueue overlay, built by the real ``kubectl kustomize``: the base plus Kueue's manager
configuration with the credits transformations (in sync with controlplane/chain/kueueconfig.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import yaml
from deploy_helpers import BASE, REPO, build, find

from controlplane.admission.webhooks import WebhookSettings
from controlplane.chain import kueueconfig, naming, workloads

KUEUE = "deploy/overlays/kueue"


def _configuration() -> dict[str, object]:
    cm = find(build(KUEUE), "ConfigMap", kueueconfig.CONFIG_MAP)
    assert cm["metadata"]["namespace"] == "kueue-system"
    loaded: dict[str, object] = yaml.safe_load(cm["data"][kueueconfig.CONFIG_KEY])
    return loaded


def test_overlay_is_the_base_and_kueues_configuration() -> None:
    base = {(o["kind"], o["metadata"]["name"]) for o in build(BASE)}
    objs = {(o["kind"], o["metadata"]["name"]) for o in build(KUEUE)}
    assert objs - base == {
        ("ConfigMap", kueueconfig.CONFIG_MAP),
        ("MutatingWebhookConfiguration", workloads.CONFIGURATION_NAME),
    }
    assert base <= objs


def test_configuration_is_the_generated_one() -> None:
    assert _configuration() == kueueconfig.configuration()


def test_credits_transformations_and_quota_strategy() -> None:
    resources = _configuration()["resources"]
    assert isinstance(resources, dict)
    assert resources["quotaCheckStrategy"] == "IgnoreUndeclared"
    assert "excludeResourcePrefixes" not in resources  # not allowed with IgnoreUndeclared
    rules = {t["input"]: t for t in resources["transformations"]}
    assert rules["nvidia.com/gpu"]["outputs"] == {"credits.gpustack.ai/nvidia": "1600k"}
    assert rules["nvidia.com/gpu.shared"]["outputs"] == {"credits.gpustack.ai/nvidia": "160k"}
    assert rules["amd.com/gpu.sliced.units"]["outputs"] == {"credits.gpustack.ai/amd": "1"}
    assert rules["nvidia.com/gpu.partitioned.units"]["outputs"] == {
        "credits.gpustack.ai/nvidia": "1"
    }
    assert {t["strategy"] for t in rules.values()} == {"Replace"}
    assert len(rules) == 9 * 4  # four inputs per manufacturer
    frameworks = _configuration()["integrations"]
    assert isinstance(frameworks, dict) and "pod" in frameworks["frameworks"]


def test_workload_webhook_is_the_code_without_a_ca_and_ignores_failures() -> None:
    shipped = yaml.safe_load(Path(REPO / "deploy/overlays/kueue/workload-webhook.yaml").read_text())
    assert shipped == workloads.configuration(WebhookSettings(), None)
    (hook,) = shipped["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["clientConfig"]["service"]["path"] == "/webhooks/v1/workloads/mutate"
    assert hook["rules"][0]["resources"] == ["workloads"]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]


def _matches(workload: dict[str, Any]) -> bool:
    (hook,) = workloads.configuration(WebhookSettings(), None)["webhooks"]
    env = celpy.Environment()
    program = env.program(env.compile(hook["matchConditions"][0]["expression"]))
    return bool(program.evaluate({"object": celpy.json_to_cel(workload)}))


def test_only_workloads_of_our_local_queues_are_sent() -> None:
    ours = naming.local_queue("gpustack--nvidia-h200-linux-amd64")
    assert _matches({"spec": {"queueName": ours, "podSets": []}})
    assert not _matches({"spec": {"queueName": "team-queue", "podSets": []}})
    assert not _matches({"spec": {"podSets": []}})
