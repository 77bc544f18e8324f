"""The scheduling chain: InstanceTypes, the Kueue objects made from node inventory, the fit
labels and the ``gpustack-node-devices`` admission check (docs/scheduling.md)."""
