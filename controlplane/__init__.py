"""The control plane: the only part of the system that speaks to the Kubernetes API.

It subscribes to the bus and reconciles node events into CRDs. It never imports ``agent``.
"""
