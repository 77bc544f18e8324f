"""Per-node agents: device detection, monitoring, the kubelet device plugin and the CSI plugin.

Agents speak only NATS (through ``bus``) and the kubelet's local gRPC sockets; they never import
``controlplane`` and never talk to the Kubernetes API.
"""
