"""The chain's knobs: one frozen struct, built at the edge (the worker's settings).

The fields that mirror a ``Setting`` (:func:`controlplane.clustersettings.catalog.chain_fields` names
them) take their defaults here from the catalog's own (one place); whether Kueue objects are
managed at all follows ``--disable-applications=kueue``. The worker swaps this struct whenever
the Settings change.
"""

from __future__ import annotations

import msgspec

from controlplane.clustersettings.catalog import DEFAULTS

__all__ = ["ChainSettings"]


class ChainSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What the chain reconcilers and the Workload webhook do."""

    manage_kueue: bool = True
    """False: no ResourceFlavor, ClusterQueue, LocalQueue, AdmissionCheck or Topology is
    written, and no admission check is answered (``--disable-applications=kueue``)."""
    workload_fit_affinity: bool = DEFAULTS.workload_fit_affinity
    """The Workload webhook pins PodSets to nodes whose fit labels can take them."""
    instance_type_derived_from_node: bool = DEFAULTS.instance_type_derived_from_node
    """InstanceTypes are created from node inventory (create-only), and accelerated
    ClusterQueues carry the ``gpustack-node-devices`` check."""
    node_management_manual: bool = DEFAULTS.node_management_manual
    """True: ``gpustack.ai/managed`` is the administrator's label, never set by the worker."""
    instance_type_mixed_on_node: bool = DEFAULTS.instance_type_mixed_on_node
    """True: every managed node also takes CPU work (an accelerated node is on its
    accelerators' InstanceTypes and the CPU one). False: only nodes with no accelerator do; the
    worker labels them ``feature.gpustack.ai/cpu-only=true`` and the CPU flavors select that."""
    instance_type_drain_when_no_flavors: bool = DEFAULTS.instance_type_drain_when_no_flavors
    """A ClusterQueue that had flavors and has none left: ``HoldAndDrain`` (True: admitted
    workloads are evicted) or ``Hold`` (False: they keep running, nothing new is admitted)."""
    instance_type_aware_cpu_manufacturer: bool = DEFAULTS.instance_type_aware_cpu_manufacturer
    """True: the general (CPU) key is part of an InstanceType's identity, so nodes with other
    CPUs make other InstanceTypes and ClusterQueues (``gpustack--<gKey>--<aKey>-<os>-<arch>``)."""
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
