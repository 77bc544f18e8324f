"""The CRDs: in sync with deploy/crds, accepting what dm detect prints, refusing malformed objects."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from controlplane.schema import crds

HERE = Path(__file__).parents[1]
DEPLOY = HERE.parent.parent / "deploy" / "crds"


def strict(schema: Any) -> Any:
    """The schema as the API server applies it: unknown fields refused (pruning made loud)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
        if schema.get("type") == "object" and "properties" in schema:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def validator(stem: str) -> jsonschema.Draft7Validator:
    crd = crds.definitions()[stem]
    return jsonschema.Draft7Validator(
        strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    )


def test_yaml_in_sync() -> None:
    for stem, crd in crds.definitions().items():
        assert yaml.safe_load((DEPLOY / f"{stem}.yaml").read_text()) == crd


@pytest.mark.parametrize(
    "fixture", ["controlplane_detect_h100x8_mig.json", "controlplane_detect_amd_x2.json"]
)
def test_devices_accepts_dm_detect(fixture: str) -> None:
    groups = json.loads((HERE / fixture).read_text())
    validator("devices").validate({"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices",
                                   "metadata": {"name": "n"}, "spec": {"groups": groups}})  # fmt: skip


def test_devices_rejects_malformed() -> None:
    groups = json.loads((HERE / "controlplane_detect_h100x8_mig.json").read_text())
    v = validator("devices")
    bad: list[Any] = []
    g = copy.deepcopy(groups)
    g[0]["accelerators"][0]["index"] = "zero"
    bad.append(g)
    g = copy.deepcopy(groups)
    del g[0]["manufacturer"]
    bad.append(g)
    g = copy.deepcopy(groups)
    g[0]["accelerators"][0]["status"]["unhealthy"] = "no"
    bad.append(g)
    g = copy.deepcopy(groups)
    g[0]["surprise"] = 1
    bad.append(g)
    for groups_ in bad:
        assert not v.is_valid({"spec": {"groups": groups_}})
    assert not v.is_valid({"status": {"groups": [{"id": "x", "manufacturer": "nvidia", "accelerators": [
        {"id": "a", "index": 0, "mode": "Bogus", "allocated": 0, "remaining": 1}]}]}})  # fmt: skip


def test_modelartifact_schema() -> None:
    v = validator("modelartifacts")
    ok = {"spec": {"source": {"huggingFace": {"repository": "Qwen/Qwen3-8B"}}}}
    v.validate(ok)
    assert not v.is_valid({"spec": {"source": {}}})
    assert not v.is_valid({"spec": {**ok["spec"], "expectedDigest": "sha256:XYZ"}})


@pytest.mark.parametrize("stem", sorted(crds.definitions()))
def test_every_field_has_a_description(stem: str) -> None:
    """``kubectl explain`` has something to say about every field, at every depth."""
    from controlplane.schema import crddocs

    schema = crds.definitions()[stem]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert crddocs.undescribed(schema) == []


def test_a_field_without_a_description_is_found() -> None:
    from controlplane.schema import crddocs

    schema = crddocs.describe("Devices", crds.DEVICES_SCHEMA)
    schema["properties"]["spec"]["properties"]["groups"]["items"]["properties"]["new"] = {
        "type": "object",
        "properties": {"deeper": {"type": "string"}},
    }
    assert crddocs.undescribed(schema) == ["spec.groups[].new", "spec.groups[].new.deeper"]


def test_printer_columns_are_counts_and_human_sizes() -> None:
    """No column lists UUIDs or raw byte counts by default (priority 0)."""
    for crd in crds.definitions().values():
        for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
            if column.get("priority", 0) == 0:
                assert "[*]" not in column["jsonPath"], column
                assert not column["jsonPath"].endswith("Bytes"), column


def test_a_description_lands_on_its_own_field_only() -> None:
    """The schemas reuse one dict for plain string fields; describing ``apiVersion`` must not
    describe every other string field as the API version (it did, through that sharing)."""
    from controlplane.schema import crddocs

    api_version = crddocs.COMMON["apiVersion"]
    for stem, crd in crds.definitions().items():
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        paths = [p for p, s in crddocs._walk(schema, "") if s.get("description") == api_version]
        assert set(paths) <= {"apiVersion"}, (stem, paths)


@pytest.mark.parametrize(
    ("source", "one"),
    [
        ({"huggingFace": {"repository": "o/m"}}, True),
        ({"persistentVolumeClaim": {"claimName": "models", "path": "llm"}}, True),
        ({"image": {"reference": "r.io/m@sha256:" + "1" * 64}}, True),
        ({"huggingFace": {"repository": "o/m"}, "image": {"reference": "r"}}, False),
        ({}, False),
    ],
)
def test_a_model_artifact_names_exactly_one_source(source: dict[str, Any], one: bool) -> None:
    """The schema takes each source's shape; the CRD's CEL rule, evaluated by cel-python (the
    API server's CEL semantics), takes exactly one of them."""
    import celpy

    body = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "ModelArtifact",
            "metadata": {"name": "m"}, "spec": {"source": source}}  # fmt: skip
    assert validator("modelartifacts").is_valid(body) is one  # minProperties, maxProperties
    env = celpy.Environment()
    program = env.program(env.compile(crds.SOURCE_RULE))
    assert bool(program.evaluate({"self": celpy.json_to_cel(source)})) is one
