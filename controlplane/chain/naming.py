"""Names, labels and resources of the chain: every string two modules must agree on (pure).

Names (reference §7.3), with ``aKey`` the accelerator group key (``nvidia-h200``) and ``gKey``
the general (CPU) key (``amd-epyc-7763``, else ``generic``):

- ResourceFlavor ``gpustack--<gKey>--<aKey>-<os>-<arch>-<n>d`` (n cards per node) or
  ``gpustack--<gKey>-<os>-<arch>-<c>c`` (c CPU cores), with ``-p<profile>`` when the node's
  topology profile is not ``default``;
- ClusterQueue and InstanceType ``gpustack--<aKey>-<os>-<arch>`` or ``gpustack--generic-<os>-<arch>``;
  when CPUs are told apart (``instance-type-aware-cpu-manufacturer``)
  ``gpustack--<gKey>--<aKey>-<os>-<arch>`` or ``gpustack--<gKey>-<os>-<arch>``;
- LocalQueue ``gpustack-fnv64-<16 hex of FNV-1a 64 of the ClusterQueue name>`` (31 characters);
- Topology ``gpustack--<profile>``.

Every generated name stays valid: ``gKey`` and ``aKey`` are label name parts, cut to fit with a
stable digest where they are made (:func:`controlplane.chain.inventory.general_key`,
:func:`controlplane.reconciling.labeling.product_key`), and an object name longer than 253
characters is cut the same way (:func:`kit.k8snames.bounded`).

Kueue's own limit the chain must respect: :data:`MAX_FLAVORS` flavors in one resource group.
"""

from __future__ import annotations

import re
from typing import Final

from controlplane.reconciling.allocating import UNITS
from controlplane.resources import Resource
from kit import k8snames

__all__ = [
    "ADMISSIONCHECKS",
    "CHECK_JOINT",
    "CHECK_NODE_DEVICES",
    "CLUSTERQUEUES",
    "INSTANCETYPEFLAVORS",
    "INSTANCETYPES",
    "KUEUE_KINDS",
    "LOCALQUEUES",
    "MAX_FLAVORS",
    "NAMESPACES",
    "RESOURCEFLAVORS",
    "TOPOLOGIES",
    "WORKLOADS",
    "credits",
    "fnv64a",
    "local_queue",
    "quantity",
]

KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
GROUP: Final = "worker.gpustack.ai"
VERSION: Final = "v1alpha1"

RESOURCEFLAVORS: Final = Resource(
    group=KUEUE_GROUP, version=KUEUE_VERSION, plural="resourceflavors", kind="ResourceFlavor"
)
CLUSTERQUEUES: Final = Resource(
    group=KUEUE_GROUP, version=KUEUE_VERSION, plural="clusterqueues", kind="ClusterQueue"
)
LOCALQUEUES: Final = Resource(
    group=KUEUE_GROUP, version=KUEUE_VERSION, plural="localqueues", kind="LocalQueue",
    namespaced=True,
)  # fmt: skip
ADMISSIONCHECKS: Final = Resource(
    group=KUEUE_GROUP, version=KUEUE_VERSION, plural="admissionchecks", kind="AdmissionCheck"
)
TOPOLOGIES: Final = Resource(
    group=KUEUE_GROUP, version=KUEUE_VERSION, plural="topologies", kind="Topology"
)
WORKLOADS: Final = Resource(
    group=KUEUE_GROUP, version=KUEUE_VERSION, plural="workloads", kind="Workload", namespaced=True
)
KUEUE_KINDS: Final = (TOPOLOGIES, ADMISSIONCHECKS, RESOURCEFLAVORS, CLUSTERQUEUES, LOCALQUEUES)
"""In the order they are created (a reference never dangles); deleted in reverse."""
INSTANCETYPES: Final = Resource(
    group=GROUP, version=VERSION, plural="instancetypes", kind="InstanceType"
)
INSTANCETYPEFLAVORS: Final = Resource(
    group=GROUP, version=VERSION, plural="instancetypeflavors", kind="InstanceTypeFlavor"
)
NAMESPACES: Final = Resource(group="", version="v1", plural="namespaces", kind="Namespace")

CHECK_NODE_DEVICES: Final = "gpustack-node-devices"
CHECK_JOINT: Final = "gpustack-model-deployment-joint"
CONTROLLER_NODE_DEVICES: Final = "gpustack.ai/node-devices"
CONTROLLER_JOINT: Final = "gpustack.ai/model-deployment-joint"

MANAGED: Final = "gpustack.ai/managed"
GENERAL_PREFIX: Final = "general.feature.gpustack.ai/"
CPU_ONLY: Final = "feature.gpustack.ai/cpu-only"
"""On managed nodes with no accelerator when ``instance-type-mixed-on-node`` is false: the CPU
flavors select it, so accelerated nodes take no CPU work."""
ACCELERATED_PREFIX: Final = "acceleratable.feature.gpustack.ai/"
PROFILE: Final = "topology.gpustack.ai/profile"
DEFAULT_PROFILE: Final = "default"
HOSTNAME: Final = "kubernetes.io/hostname"
OS: Final = "kubernetes.io/os"
ARCH: Final = "kubernetes.io/arch"
SLICED_FIT: Final = "sliced-max-free-units.fit.gpustack.ai/"
SHARED_FIT: Final = "shared-free-cards.fit.gpustack.ai/"
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
ENTRANCE: Final = "schedule.gpustack.ai/queue-entrance"
QUEUE_ANNOTATION: Final = "schedule.gpustack.ai/queue"
EMPTY_PLAN_HOLD: Final = "topology.gpustack.ai/empty-plan-hold"
PART_OF: Final = {"app.kubernetes.io/part-of": "gpustack-operator"}
LOCAL_QUEUE_PREFIX: Final = "gpustack-fnv64-"
CREDITS_PREFIX: Final = "credits.gpustack.ai/"
MAX_FLAVORS: Final = 64
"""``ClusterQueue.spec.resourceGroups[].flavors`` maxItems in Kueue's CRD (v0.19.2 and later)."""
DEGRADED: Final = "Degraded"

_FNV_OFFSET: Final = 0xCBF29CE484222325
_FNV_PRIME: Final = 0x100000001B3
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def fnv64a(text: str) -> int:
    """FNV-1a, 64 bits, over the UTF-8 bytes of ``text``."""
    h = _FNV_OFFSET
    for byte in text.encode():
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def local_queue(cluster_queue: str) -> str:
    """``gpustack-fnv64-<16 hex>``: the LocalQueue of ``cluster_queue`` in every namespace."""
    return f"{LOCAL_QUEUE_PREFIX}{fnv64a(cluster_queue):016x}"


def credits(manufacturer: str) -> str:
    """The quota resource of a manufacturer's cards: one card is 1,600,000 credits."""
    return f"{CREDITS_PREFIX}{manufacturer}"


def slug(text: str) -> str:
    """A name segment: lowercase letters, digits and single dashes."""
    return _NOT_NAME.sub("-", text.lower()).strip("-") or "unknown"


def quantity(value: int) -> str:
    """A non-negative integer in the API server's canonical DecimalSI form (``12800k``, ``96``).

    Written canonical so that what is read back equals what was written: a quota in any other
    spelling would be re-patched at every reconcile.
    """
    suffixes = ("", "k", "M", "G", "T", "P", "E")
    i = 0
    while value and value % 1000 == 0 and i < len(suffixes) - 1:
        value //= 1000
        i += 1
    return f"{value}{suffixes[i]}"


def card_credits(cards: int) -> str:
    return quantity(cards * UNITS)


def cluster_queue(a_key: str | None, os: str, arch: str, g_key: str | None = None) -> str:
    """``g_key`` given (``instance-type-aware-cpu-manufacturer``): the general key leads."""
    if g_key is None:
        name = f"gpustack--{a_key or 'generic'}-{slug(os)}-{slug(arch)}"
    elif a_key is None:
        name = f"gpustack--{g_key}-{slug(os)}-{slug(arch)}"
    else:
        name = f"gpustack--{g_key}--{a_key}-{slug(os)}-{slug(arch)}"
    return k8snames.bounded(name, k8snames.DNS_SUBDOMAIN_MAX)


def flavor(g_key: str, a_key: str | None, os: str, arch: str, count: int, profile: str) -> str:
    tail = "" if profile == DEFAULT_PROFILE else f"-p{slug(profile)}"
    if a_key is None:
        name = f"gpustack--{g_key}-{slug(os)}-{slug(arch)}-{count}c{tail}"
    else:
        name = f"gpustack--{g_key}--{a_key}-{slug(os)}-{slug(arch)}-{count}d{tail}"
    return k8snames.bounded(name, k8snames.DNS_SUBDOMAIN_MAX)


def topology(profile: str) -> str:
    return k8snames.bounded(f"gpustack--{slug(profile)}", k8snames.DNS_SUBDOMAIN_MAX)
