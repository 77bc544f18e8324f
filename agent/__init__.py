"""Per-node agents: device detection, monitoring, the kubelet device plugin and the CSI plugin.

Agents speak only NATS (through ``bus``) and the kubelet's local gRPC sockets; they never import
``controlplane`` and never talk to the Kubernetes API.

What lives here, top to bottom (the import contracts in ``pyproject.toml`` keep this order):

- :mod:`agent.serve`: ``dm serve``, the device agent (detection loop, metrics, health, the
  device plugins' ledger on disk);
- :mod:`agent.models`: ``model-manager``, the model agent (CSI node plugin, downloads);
- :mod:`agent.preflight`: ``dm preflight``, the one-shot proof that the allocation modes work;
- :mod:`agent.oneshots`: ``dm detect`` and ``dm monitor``;
- :mod:`agent.deviceplugin`: the kubelet device plugins ``dm serve`` runs;
- :mod:`agent.devices`: detection and monitoring, vendor readers over their C-library adapters;
- :mod:`agent.settings` (the node-name rule), :mod:`agent.grpcsocket` (grpclib on unix
  sockets, for the device plugins and the CSI driver), :mod:`agent.errors` (the agents' error
  types) and :mod:`agent.testing` (a fake kubelet, for tests only).
"""
