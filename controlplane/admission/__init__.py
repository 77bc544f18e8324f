"""Pod admission: the fractional-GPU request model and the webhooks that enforce it.

``requests`` (the model and its folds), ``mutating`` and ``validating`` (the two decisions) are
pure functions over typed data; ``review`` speaks AdmissionReview; ``webhooks`` and
``certificates`` are the only parts that do I/O. ``pods`` is the typed Pod admission reads,
``folds`` the memory folds, ``cards`` the accelerator groups the worker's ledger knows.
``modelrules`` keeps ModelStoreBinding and ModelPrefetch updates within their rules.
"""
