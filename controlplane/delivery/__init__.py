"""Model delivery to the nodes, beyond one artifact on one node: the leader's loops that meter
ModelStoreBindings (:mod:`.metering`: each namespace's use against its quotas, written to the
bindings' status and to the agents' records) and carry out ModelPrefetches (:mod:`.prefetching`:
warm-up Pods, the nodes' pins). Their decisions are pure and live in :mod:`controlplane.stores`
(:mod:`~controlplane.stores.bindings`, :mod:`~controlplane.stores.prefetches`); these modules
only list, watch and write. Nothing else lives here.
"""
