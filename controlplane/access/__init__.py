"""Who may connect, proven by Kubernetes: the worker holds the rights, others ask it.

- :mod:`.busauth`: the bus's auth callout (who is connecting to NATS);
- :mod:`.reviewer`: TokenReview then SubjectAccessReview for an HTTPS scraper, for the worker's
  own endpoint and, through :mod:`bus.accessreviews`, for every agent's;
- :mod:`.bootstrap`: the secrets (bus keys, serving certificates) generated at first start.
"""
