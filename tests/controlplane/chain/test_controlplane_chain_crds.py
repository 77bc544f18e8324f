"""InstanceType and InstanceTypeFlavor CRDs: what the chain writes validates; every field is told."""

from __future__ import annotations

from typing import Any

from test_controlplane_chain_planning import AMD, H200, MIG, chain, facts
from test_controlplane_crds import validator

from controlplane.schema import crds


def _undescribed(schema: dict[str, Any], path: str = "") -> list[str]:
    out = [] if "description" in schema else [path or "<root>"]
    for name, sub in (schema.get("properties") or {}).items():
        out += _undescribed(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += [p for p in _undescribed(schema["items"], f"{path}[]") if p != f"{path}[]"]
    return out


def test_every_field_has_a_description() -> None:
    for stem in ("instancetypes", "instancetypeflavors"):
        schema = crds.definitions()[stem]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert _undescribed(schema) == [], stem


def test_printer_columns_show_the_four_views() -> None:
    version = crds.definitions()["instancetypes"]["spec"]["versions"][0]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["ACCELERATOR(EX/SH/SL/PT)"] == ".status.summary"
    assert version["subresources"] == {"status": {}}


def test_what_the_chain_writes_validates() -> None:
    plan = chain([facts("h", H200), facts("r", AMD, cpu="16"), facts("m", MIG)])
    it = validator("instancetypes")
    for name, desired in plan.instance_types.items():
        body = {
            "apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "InstanceType",
            "metadata": {"name": name, **desired.metadata}, "spec": desired.spec,
            "status": plan.statuses[name],
        }  # fmt: skip
        it.validate(body)
    assert plan.statuses["gpustack--nvidia-h200-linux-amd64"]["summary"] == "8/8 8/80 100/800 0/0"
    flavor = validator("instancetypeflavors")
    for name, desired in plan.catalog.items():
        flavor.validate({"kind": "InstanceTypeFlavor", "metadata": {"name": name},
                         "spec": desired.spec})  # fmt: skip
