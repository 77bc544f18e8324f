"""The aggregated extension API the worker serves (``gpustack.ai/v1``: Settings and read-only
views from the bus), behind the aggregation layer's authentication and SubjectAccessReview,
on the API-serving core (:mod:`controlplane.extension.core`) that any further group uses."""
