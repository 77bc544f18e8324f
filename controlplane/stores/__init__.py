"""Model stores: which ``ModelStore`` wins each node, and the ``NodeModelStore`` spec it gives.

- :mod:`.modelstores`: the pool layer (every store's status, the winner per node);
- :mod:`.storespec`: ``NodeModelStore.spec`` from the settings, the winner and the user's edits
  (pure);
- :mod:`.bindings`: a ModelStoreBinding's use, phase and quotas (pure);
- :mod:`.prefetches`: a ModelPrefetch's targets, warm-up Pods, pins and status (pure).

Their I/O (metering, warm-up Pods) is :mod:`controlplane.delivery`.
"""
