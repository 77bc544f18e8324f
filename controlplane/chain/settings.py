"""The chain's knobs: one frozen struct, built at the edge (the worker's settings).

Defaults are the reference's (``Setting`` catalog: ``workload-fit-affinity=true``,
``instance-type-derived-from-node=true``, ``node-management-manual=false``); whether Kueue
objects are managed at all follows ``--disable-applications=kueue``. The flags that set them are
wired by the worker's settings, not here.
"""

from __future__ import annotations

import msgspec

__all__ = ["ChainSettings"]


class ChainSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What the chain reconcilers and the Workload webhook do."""

    manage_kueue: bool = True
    """False: no ResourceFlavor, ClusterQueue, LocalQueue, AdmissionCheck or Topology is
    written, and no admission check is answered (``--disable-applications=kueue``)."""
    workload_fit_affinity: bool = True
    """The Workload webhook pins PodSets to nodes whose fit labels can take them."""
    instance_type_derived_from_node: bool = True
    """InstanceTypes are created from node inventory (create-only), and accelerated
    ClusterQueues carry the ``gpustack-node-devices`` check."""
    node_management_manual: bool = False
    """True: ``gpustack.ai/managed`` is the administrator's label, never set by the worker."""
    system_namespace: str = "gpustack-system"
    """LocalQueues go to every namespace but this one and ``kube-*``."""
    fit_coalesce_s: float = 3.0
    """Fit labels are recomputed at most this often per node (allocation bursts coalesce)."""
    period_s: float = 15.0
    """The level-based resync of the Kueue objects and InstanceTypes."""
    retry_s: float = 5.0
    """First wait after a failure (Kueue's CRDs absent, API errors); doubles up to
    ``retry_cap_s``."""
    retry_cap_s: float = 120.0
