"""Small pieces every process shares that are neither the bus nor a process of their own.

- :mod:`kit.serving`: the HTTPS endpoint (``/metrics``, ``/readyz``, ``/livez`` and extras)
  that ``dm serve``, ``model-manager`` and ``worker`` expose the same way;
- :mod:`kit.rendering`: wire shapes rendered as the YAML or JSON documents people pipe;
- :mod:`kit.heap`: pacing the garbage collector of a process with a large long-lived heap;
- :mod:`kit.testing`: for tests only, cancelling a server's start at every step.

Nothing here knows the bus or Kubernetes; ``agent`` and ``controlplane`` both build on it,
which is why it lives beside ``bus`` rather than inside either of them.
"""
