"""The Kueue overlay, built by the real ``kubectl kustomize``: the base plus Kueue's manager
configuration with the credits transformations (in sync with controlplane/chain/kueueconfig.py)."""

from __future__ import annotations

import yaml
from deploy_helpers import BASE, build, find

from controlplane.chain import kueueconfig

KUEUE = "deploy/overlays/kueue"


def _configuration() -> dict[str, object]:
    cm = find(build(KUEUE), "ConfigMap", kueueconfig.CONFIG_MAP)
    assert cm["metadata"]["namespace"] == "kueue-system"
    loaded: dict[str, object] = yaml.safe_load(cm["data"][kueueconfig.CONFIG_KEY])
    return loaded


def test_overlay_is_the_base_and_kueues_configuration() -> None:
    base = {(o["kind"], o["metadata"]["name"]) for o in build(BASE)}
    objs = {(o["kind"], o["metadata"]["name"]) for o in build(KUEUE)}
    assert objs - base == {("ConfigMap", kueueconfig.CONFIG_MAP)} and base <= objs


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
