"""Cluster-wide settings (``Setting`` objects), as distinct from a process's own flags.

- :mod:`.catalog`: every setting the worker reads, its type, default and rules (pure);
- :mod:`.source`: where they live (a Secret, the bus's KV) and the one frozen ``Values`` the
  worker reads them from.
"""
