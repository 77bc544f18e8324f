"""Rigs for the seven library-read backends: a simulated tree and library from a profile."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import msgspec.yaml

from agent.devices import vendor
from agent.devices.hostfs import HostFS
from agent.devices.simulation import profiles, sysfs
from agent.devices.simulation.fakelib import SimulatedLibrary
from agent.devices.simulation.libraries import _SIMULATORS
from controlplane.schema import crds


@dataclass
class Rig:
    key: str
    profile: profiles.Profile
    host: HostFS
    library: SimulatedLibrary
    backend: vendor.VendorBackend
    made: int = 0


def load(name_or_yaml: str) -> profiles.Profile:
    if "\n" in name_or_yaml:
        return msgspec.yaml.decode(name_or_yaml.encode(), type=profiles.Profile)
    return profiles.load(name_or_yaml)


def simulator(key: str, profile: profiles.Profile) -> SimulatedLibrary:
    import importlib

    module, cls, _ = _SIMULATORS[key]
    made: SimulatedLibrary = getattr(importlib.import_module(module), cls)(getattr(profile, key))
    return made


def rig(key: str, profile: profiles.Profile | str, root: Path, *, pci_check: bool = True) -> Rig:
    """The backend over the profile's tree and a simulator the test can inspect and break."""
    if isinstance(profile, str):
        profile = load(profile)
    host = sysfs.materialize(profile, root)
    library = simulator(key, profile)
    census = vendor.PciCensus(host, {0})
    made = Rig(key, profile, host, library, None)  # type: ignore[arg-type]

    def make() -> Any:
        made.made += 1
        return library

    made.backend = vendor.VendorBackend(
        key, host=host, census=census, library=make, pci_check=pci_check, simulated=True
    )
    return made


def wire(value: object) -> Any:
    """What the value looks like once encoded (lists, camelCase, absent fields left out)."""
    return msgspec.json.decode(msgspec.json.encode(value))


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
        if schema.get("type") == "object" and "properties" in schema:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def validate_devices(groups: Any) -> None:
    """Validate a detect output against the Devices CRD, unknown fields refused."""
    crd = crds.definitions()["devices"]
    schema = _strict(copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
    jsonschema.Draft7Validator(schema).validate(
        {
            "apiVersion": "worker.gpustack.ai/v1alpha1",
            "kind": "Devices",
            "metadata": {"name": "node"},
            "spec": {"groups": wire(groups)},
        }
    )


def accelerators(groups: Any) -> list[dict[str, Any]]:
    return [a for g in wire(groups) for a in g["accelerators"]]
