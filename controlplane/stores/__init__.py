"""Model stores: which ``ModelStore`` wins each node, and the ``NodeModelStore`` spec it gives.

- :mod:`.modelstores`: the pool layer (every store's status, the winner per node);
- :mod:`.storespec`: ``NodeModelStore.spec`` from the settings, the winner and the user's edits
  (pure).
"""
