"""The OpenAPI schemas of ``InstanceType`` and ``InstanceTypeFlavor`` (worker.gpustack.ai/v1alpha1).

Data only; :mod:`controlplane.schema.crds` wraps them into CustomResourceDefinitions with the others.
Every field carries a description (``kubectl explain`` shows it). The printed column
``ACCELERATOR(EX/SH/SL/PT)`` is ``onceMaxRequest/remaining`` of each of the four views.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["INSTANCETYPEFLAVOR_SCHEMA", "INSTANCETYPE_COLUMNS", "INSTANCETYPE_SCHEMA"]


def _s(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": text, **extra}


def _i(text: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": 0, "description": text}


def _b(text: str) -> dict[str, Any]:
    return {"type": "boolean", "description": text}


def _o(text: str, props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "description": text, "properties": props}
    if required:
        out["required"] = list(required)
    return out


def _view(text: str, unit: str) -> dict[str, Any]:
    return _o(
        text,
        {
            "onceMaxRequest": _i(f"The most one request can ask now ({unit})."),
            "remaining": _i(f"What the InstanceType's nodes can still grant ({unit})."),
            "capacity": _i(f"Everything its nodes offer in this family ({unit})."),
        },
    )


def _profiles(text: str) -> dict[str, Any]:
    item = _o(
        "One partition profile and a count of its instances.",
        {"name": _s("The profile, e.g. 3g.40gb."), "count": _i("Instances.")},
        ("name", "count"),
    )
    return {
        "type": "array",
        "description": text,
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
    }


_PARTITIONED: Final = _view(
    "Hardware partitions (NVIDIA MIG), in instances: a request is one instance.", "instances"
)
_PARTITIONED["properties"].update(
    allocatedProfiles=_profiles("Instances held, per profile; every profile listed, even at 0."),
    remainingProfiles=_profiles("Instances that still fit, per profile; every profile listed."),
)

INSTANCETYPE_SCHEMA: Final = _o(
    "A class of machine work can be scheduled on: one accelerator group on one os/arch (or "
    "CPU only), entered through its LocalQueue and governed by its ClusterQueue of the same name.",
    {
        "apiVersion": _s("The API version."),
        "kind": _s("The kind."),
        "metadata": {"type": "object", "description": "Standard object metadata."},
        "spec": _o(
            "What the InstanceType is; frozen after creation except displayName and inactive.",
            {
                "acceleratorGroup": _s(
                    "The accelerator group key (acceleratable.feature.gpustack.ai/<key>); "
                    "empty for a CPU InstanceType."
                ),
                "generalGroup": _s("The general (CPU) key; generic when CPUs are not told apart."),
                "os": _s("kubernetes.io/os of its nodes."),
                "arch": _s("kubernetes.io/arch of its nodes."),
                "manufacturer": _s("The accelerator manufacturer (nvidia, amd, ...)."),
                "product": _s("The accelerator product name, e.g. NVIDIA H200."),
                "memory": _i("VRAM of one card, MiB: the divisor of memory-mib requests."),
                "unit": _i("Units of one whole card (1600000): what credits count."),
                "displayName": _s("A name for people."),
                "inactive": _b("True: its ClusterQueue holds (admits nothing new)."),
            },
            ("os", "arch", "unit"),
        ),
        "status": _o(
            "What its nodes can grant now, computed from the Devices ledger.",
            {
                "accelerator": _view("Exclusive whole cards.", "cards"),
                "acceleratorShared": _view(
                    "Shared cards, in shares (10 a card); onceMaxRequest counts cards.", "shares"
                ),
                "acceleratorSliced": _view(
                    "Logical slices, in memory percent (100 a card).", "memory percent"
                ),
                "acceleratorPartitioned": _PARTITIONED,
                "detail": _o(
                    "What one card offers.",
                    {
                        "slicedDetail": {
                            "type": "object",
                            "description": "The capability catalog of one card (memoryMib, "
                            "logicalSlices, coresPercentageOvercommit, profiles).",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                ),
                "entrance": _s("The LocalQueue name Pods use (kueue.x-k8s.io/queue-name)."),
                "conditions": {
                    "type": "array",
                    "description": "Degraded=True (reason TooManyFlavors) while its nodes make "
                    "more flavors than one Kueue resource group holds (64): the message names "
                    "the nodes its ClusterQueue leaves out. Absent when all fit.",
                    "items": _o(
                        "One condition.",
                        {
                            "type": _s("Degraded."),
                            "status": _s(
                                "True, False or Unknown.", enum=["True", "False", "Unknown"]
                            ),
                            "reason": _s("A CamelCase reason, e.g. TooManyFlavors."),
                            "message": _s("What is wrong, for people."),
                            "lastTransitionTime": _s(
                                "When status last changed.", format="date-time"
                            ),
                        },
                        ("type", "status"),
                    ),
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["type"],
                },
                "summary": _s(
                    "onceMaxRequest/remaining of the four views, exclusive shared sliced "
                    "partitioned, e.g. 8/8 8/80 100/800 0/0 (the printed column)."
                ),
            },
        ),
    },
    ("spec",),
)

INSTANCETYPE_COLUMNS: Final = [
    ("ACCELERATOR(EX/SH/SL/PT)", ".status.summary"),
    ("ENTRANCE", ".status.entrance"),
]
"""A column's jsonPath cannot join two numbers, so the status carries the printed pairs."""

INSTANCETYPEFLAVOR_SCHEMA: Final = _o(
    "One ResourceFlavor's hardware, as a catalog entry (same name as the flavor).",
    {
        "apiVersion": _s("The API version."),
        "kind": _s("The kind."),
        "metadata": {"type": "object", "description": "Standard object metadata."},
        "spec": _o(
            "The nodes behind the flavor.",
            {
                "acceleratorGroup": _s("The accelerator group key; absent for CPU flavors."),
                "generalGroup": _s("The general (CPU) key of its nodes."),
                "acceleratable": _b("True when its nodes have accelerators."),
                "manufacturer": _s("The accelerator manufacturer."),
                "product": _s("The accelerator product name."),
                "family": _s("The accelerator family, e.g. Hopper."),
                "memory": _i("VRAM of one card, MiB."),
                "cores": _i("Compute units of one card."),
                "count": _i("Cards (or CPU cores) per node."),
                "nodes": _i("Nodes in the flavor."),
                "os": _s("kubernetes.io/os of its nodes."),
                "arch": _s("kubernetes.io/arch of its nodes."),
            },
        ),
    },
)
