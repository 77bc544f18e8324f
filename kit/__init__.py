"""Small pieces every process shares that are neither the bus nor a process of their own.

- :mod:`kit.serving`: the HTTPS endpoint (``/metrics``, ``/readyz``, ``/livez`` and extras)
  that ``dm serve``, ``model-manager`` and ``worker`` expose the same way, built of:
  :mod:`kit.httpsettings` (its settings and flags), :mod:`kit.listening` (how every HTTP server
  binds, and what one connection may take of it), :mod:`kit.gating` (who may read which route:
  the bearer-token gate, CORS, the client certificate) and :mod:`kit.tls` (its certificate);
- :mod:`kit.access`: who may read that endpoint (the authorization seam, its decision cache);
- :mod:`kit.rendering`: wire shapes rendered as the YAML or JSON documents people pipe;
- :mod:`kit.tables`: kubectl-style tables and human units for ``-o wide``;
- :mod:`kit.options`: a command's parsed flags as the settings builders read them;
- :mod:`kit.values`: one parser per value type (settings, flags, webhooks);
- :mod:`kit.files`: files a process keeps on its node, read bounded and written whole;
- :mod:`kit.backoff`: the one capped exponential backoff schedule;
- :mod:`kit.latest`: the latest decision per key, held for its readers, the changed keys told;
- :mod:`kit.tasks`: long-lived named tasks that never end unnoticed;
- :mod:`kit.heap`: pacing the garbage collector of a process with a large long-lived heap;
- :mod:`kit.k8snames`: Kubernetes names generated within the API's limits;
- :mod:`kit.redaction`: passwords inside URLs redacted before anyone reads them;
- :mod:`kit.version`: the installed package's version;
- :mod:`kit.testing`: for tests only, cancelling a server's start at every step.

Nothing here knows the bus or Kubernetes; ``agent`` and ``controlplane`` both build on it,
which is why it lives beside ``bus`` rather than inside either of them.
"""
