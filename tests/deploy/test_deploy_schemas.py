"""Every object kustomize builds validates offline: Kubernetes kinds against the bundled
OpenAPI schemas (``kubernetes-validate``, strict: unknown fields fail), our kinds against our
CRDs' schemas; and the CRDs accept the documents the agents produce.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from deploy_helpers import K8S_VERSION, REPO, TREES, build

CRD_GROUPS = {"worker.gpustack.ai"}
FOREIGN_CRD_GROUPS = {"monitoring.coreos.com"}
"""The Prometheus Operator's ServiceMonitor (deploy/overlays/monitoring): no bundled schema;
tests/deploy/test_deploy_monitoring.py checks it."""


def _is_custom(obj: dict[str, Any]) -> bool:
    return obj["apiVersion"].split("/")[0] in CRD_GROUPS


def _is_foreign(obj: dict[str, Any]) -> bool:
    return obj["apiVersion"].split("/")[0] in FOREIGN_CRD_GROUPS


@pytest.mark.parametrize("tree", TREES)
def test_kubernetes_objects_validate_strictly(tree: str) -> None:
    for obj in build(tree):
        if _is_custom(obj) or _is_foreign(obj):
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:  # pragma: no cover - the failure path
            pytest.fail(f"{tree}: {obj['kind']}/{obj['metadata']['name']}: {e.message}")


def test_strict_validation_can_fail() -> None:
    bad = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": "not-a-number"}], "unknownField": 1},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def json_schema(openapi: Any) -> Any:
    """A CRD's structural OpenAPI v3 schema as JSON Schema (the parts the API server enforces)."""
    if isinstance(openapi, list):
        return [json_schema(s) for s in openapi]
    if not isinstance(openapi, dict):
        return openapi
    out = {k: json_schema(v) for k, v in openapi.items() if not k.startswith("x-kubernetes-")}
    out.pop("nullable", None)
    out.pop("format", None)  # int64, int32: ranges the server checks; not JSON Schema formats
    if openapi.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if openapi.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _crd_validators(objs: list[dict[str, Any]]) -> dict[tuple[str, str], jsonschema.Validator]:
    validators: dict[tuple[str, str], jsonschema.Validator] = {}
    for crd in (o for o in objs if o["kind"] == "CustomResourceDefinition"):
        for version in crd["spec"]["versions"]:
            schema = json_schema(version["schema"]["openAPIV3Schema"])
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            validators[key] = jsonschema.Draft7Validator(schema)
    return validators


@pytest.fixture(scope="module")
def crd_validators(base: list[dict[str, Any]]) -> dict[tuple[str, str], jsonschema.Validator]:
    return _crd_validators(base)


@pytest.mark.parametrize("tree", TREES)
def test_custom_objects_validate_against_our_crds(
    tree: str, crd_validators: dict[tuple[str, str], jsonschema.Validator]
) -> None:
    for obj in build(tree):
        if _is_custom(obj):
            crd_validators[(obj["apiVersion"], obj["kind"])].validate(obj)


def test_crd_schemas_are_valid_json_schema(
    crd_validators: dict[tuple[str, str], jsonschema.Validator],
) -> None:
    assert {k for _, k in crd_validators} == {
        "Devices", "NodeModelStore", "ModelArtifact", "InstanceType", "InstanceTypeFlavor",
        "ModelStore", "ModelStoreBinding", "ModelPrefetch",
    }  # fmt: skip
    for validator in crd_validators.values():
        jsonschema.Draft7Validator.check_schema(validator.schema)


def _detected_groups(profile: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "gpustack_operator.main", "dm", "detect", "--simulate", profile]
        + ["-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=REPO,
    )
    groups: list[dict[str, Any]] = json.loads(done.stdout)
    assert groups, "the simulated profile detected nothing"
    return groups


def _devices(groups: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "Devices",
        "metadata": {"name": "node-1"},
        "spec": {"groups": groups},
    }


@pytest.mark.parametrize("profile", ["nvidia-h100x8-mig", "amd-rx7800xt-x2"])
def test_devices_crd_accepts_what_dm_detect_produces(
    profile: str, crd_validators: dict[tuple[str, str], jsonschema.Validator]
) -> None:
    validator = crd_validators[("worker.gpustack.ai/v1alpha1", "Devices")]
    errors = [e.message for e in validator.iter_errors(_devices(_detected_groups(profile)))]
    assert errors == []


def test_devices_crd_refuses_a_malformed_document(
    crd_validators: dict[tuple[str, str], jsonschema.Validator],
) -> None:
    groups = _detected_groups("nvidia-h100x8-mig")
    groups[0]["memory"] = "eighty gigabytes"
    validator = crd_validators[("worker.gpustack.ai/v1alpha1", "Devices")]
    assert not validator.is_valid(_devices(groups))
