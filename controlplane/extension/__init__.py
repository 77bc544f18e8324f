"""The aggregated extension API the worker serves (``gpustack.ai/v1``: Settings and read-only
views from the bus), behind the aggregation layer's authentication and SubjectAccessReview,
on the API-serving core (:mod:`controlplane.extension.core`) that any further group uses.

- :mod:`.api`: the HTTP surface (authentication, authorization, then the core);
  :mod:`.auth`: the aggregation layer's rules; :mod:`.audit`: one audit Event per request;
- :mod:`.objects` (documents and schemas), :mod:`.served` (one provider per resource),
  :mod:`.registration` (the APIService), :mod:`.fleetview` (a worker-gateway's aggregate);
- :mod:`.guards`: who may write a NodeModelStore's or a ModelArtifact's status;
- :mod:`.core`: the API-serving core; :mod:`.workergroup`: ``worker.gpustack.ai/v1``.
"""
