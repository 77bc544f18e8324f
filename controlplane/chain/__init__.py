"""The scheduling chain: InstanceTypes, the Kueue objects made from node inventory, the fit
labels and the ``gpustack-node-devices`` admission check (docs/scheduling.md).

- I/O: :mod:`.checking` (the admission check controller), :mod:`.workloads` (the Workload
  fit-pin webhook), :mod:`.reconciler` (the loop and the state between passes), :mod:`.listing` (what
  it last listed, when to list again, the wait for Kueue's CRDs),
  :mod:`.converging` (the writes, planned by :func:`controlplane.reconciling.planning.plan` and
  performed by the one executor :mod:`controlplane.reconciling.applying`);
- pure decisions: :mod:`.fit` (does work fit a node's cards), :mod:`.kueue` (the desired chain),
  :mod:`.views` (an InstanceType's status), :mod:`.inventory` (one node's facts),
  :mod:`.nodelabels` (a node's labels and signature), :mod:`.deciding` (a pass's plan, statuses,
  activation, the Kueue wait), :mod:`.naming` (every string two modules must agree on);
- data: :mod:`.schemas` (the chain's CRD schemas), :mod:`.kueueconfig` (Kueue's configuration),
  :mod:`.settings` (the chain's knobs).
"""
