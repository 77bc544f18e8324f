"""The worker-gateway: what a GPUStack server runs to read its Kubernetes clusters (docs/gateway.md).

- :mod:`.running` (the service), :mod:`.settings`, :mod:`.serving` (its endpoint);
- :mod:`.api` (the API under ``/apis``), :mod:`.hub` (every cluster's changes to every watch);
- :mod:`.subscriptions` (subscribed clusters and their readiness loops), :mod:`.upstream` (one
  cluster's Kubernetes API);
- pure decisions: :mod:`.aggregation` (what the read routes answer), :mod:`.kinds` (the kinds a
  subscription may name, a cluster's readiness).
"""
