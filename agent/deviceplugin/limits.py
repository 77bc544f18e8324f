"""Bounds on what a kubelet request may carry, checked before anything else looks at it.

kubelet's requests are small: a few containers, a few ids each, ids of a few dozen bytes. A
request far outside that is a bug or an attack, and echoing it is what makes it expensive (one
1 MB id copied into a log line and the ``grpc-message`` trailer blocked the agent for over a
minute). So every request is measured once, in O(size), and refused with a short message before
any id is parsed, charged or quoted; and an id we do quote is cut to :data:`SHOWN_CHARS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from agent.deviceplugin import errors

__all__ = ["MAX_CONTAINERS", "MAX_IDS", "MAX_ID_BYTES", "check_requests", "shown"]

MAX_CONTAINERS: Final = 64
"""Container requests in one call (a Pod has far fewer containers asking for one resource)."""
MAX_IDS: Final = 4096
"""Ids in one container request, or offered in a preferred-allocation request."""
MAX_ID_BYTES: Final = 256
"""Bytes of one id (ours are ``<group>:<card>:<index>``, well under 100)."""
SHOWN_CHARS: Final = 64


def check_requests(resource: str, id_lists: Sequence[Iterable[str]]) -> None:
    """Refuse a request with too many containers, too many ids or an oversized id.

    :raises errors.BadRequest: naming the bound, never quoting more than :data:`SHOWN_CHARS`.
    """
    if len(id_lists) > MAX_CONTAINERS:
        raise errors.BadRequest(
            f"{len(id_lists)} container requests for {resource}; at most {MAX_CONTAINERS}"
        )
    for ids in id_lists:
        for count, device in enumerate(ids, 1):
            if count > MAX_IDS:
                raise errors.BadRequest(f"more than {MAX_IDS} device ids for {resource}")
            if len(device) > MAX_ID_BYTES:
                raise errors.BadRequest(
                    f"device id {shown(device)} is {len(device)} characters; at most {MAX_ID_BYTES}"
                )


def shown(device: str) -> str:
    """``device`` quoted for a message, cut to :data:`SHOWN_CHARS` characters."""
    if len(device) <= SHOWN_CHARS:
        return repr(device)
    return repr(device[:SHOWN_CHARS]) + "…"
