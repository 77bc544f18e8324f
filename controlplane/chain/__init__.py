"""The scheduling chain: InstanceTypes, the Kueue objects made from node inventory, the fit
labels and the ``gpustack-node-devices`` admission check (docs/scheduling.md).

Pure: :mod:`kueue` (the desired chain), :mod:`views`, :mod:`fit`, :mod:`nodelabels` (a node's
labels and signature), :mod:`deciding` (a pass's plan, statuses, activation, the Kueue wait).
I/O: :mod:`converging` (the writes, planned by :func:`controlplane.reconciling.planning.plan` and
performed by the one executor :mod:`controlplane.reconciling.applying`), :mod:`reconciler` (the
state between passes and the listing), :mod:`checking` (the admission check controller).
"""
