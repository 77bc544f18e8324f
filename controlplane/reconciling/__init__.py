"""Bus events in, Kubernetes objects out: the worker's reconcilers and their pure decisions.

Pure and synchronous: :mod:`.nodestates` (the latest state of every node, folded from events),
:mod:`.allocating` (``Devices.status``), :mod:`.labeling` (node labels and capacity),
:mod:`.objects` (desired Devices and NodeModelStore), :mod:`.storing` (NodeModelStore status),
:mod:`.artifacts` (ModelArtifact decisions), :mod:`.revalidating` (when a resolved artifact is
checked again, and what the outcome does), :mod:`.planning` (desired vs observed -> actions),
executed by the one executor :mod:`.applying`.
The async layer: :mod:`.processing` (the fold, :mod:`.queueing`'s coalescing queue, the worker
tasks), :mod:`.nodes` and :mod:`.artifacting` (the reconcilers), :mod:`.annotating` (allocations
written to Pods), :mod:`.podevents` (download progress as Pod events), :mod:`.pending` (pending
sliced requests pushed to agents); the seams they write and read through: :mod:`.sinks`
(Kubernetes or the bus's KV) and :mod:`.hubresolver` (the Hub).
"""
