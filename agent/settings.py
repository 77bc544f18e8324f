"""The one rule every agent names its node by, built from flags at the edge only.

Nothing below the command modules reads the environment or the command line; they receive
frozen settings objects. Detection's settings live in :mod:`agent.devices.settings`, each
service's beside it (``agent.serve.settings``, ``agent.models.settings``, ...).
"""

from __future__ import annotations

import re
import socket

from kit.options import Flags, Options, SettingsError

_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")


class NodeFlags(Flags, frozen=True, kw_only=True):
    node_name: str


def node_name_from(options: Options) -> str:
    """The node an agent runs on: ``--node-name``, else ``KUBERNETES_NODE_NAME``, else the host.

    The one rule for every agent (``dm serve``, ``model-manager``, ``standalone``); the
    DaemonSets set ``KUBERNETES_NODE_NAME`` from the downward API. The host name is lowercased
    as kubelet does. :raises SettingsError: not a Kubernetes node name (a DNS subdomain), so
    nothing such as ``a*b`` ever reaches a bus subject.
    """
    name = (
        options.read_flags(NodeFlags).node_name
        or options.env.get("KUBERNETES_NODE_NAME")
        or socket.gethostname().lower()
    )
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise SettingsError(
            f"node name {name!r} is not a Kubernetes node name (lowercase letters, digits, "
            "'-' and '.'); set --node-name or KUBERNETES_NODE_NAME"
        )
    return name
