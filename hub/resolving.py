"""Resolve a repository at a revision into its canonical :class:`~hub.manifest.Manifest`.

Shared by the control plane (which pins ``status.resolved.manifestDigest``) and the node plugin
(which re-lists the pinned commit before downloading and refuses a listing whose digest differs).
"""

from __future__ import annotations

from collections.abc import Sequence

from hub import client as hub_client
from hub.manifest import Manifest, filtered

__all__ = ["listing", "resolve"]


async def listing(
    hub: hub_client.HubClient,
    repository: str,
    commit: str,
    *,
    token: str | None,
    allow: Sequence[str] = (),
    ignore: Sequence[str] = (),
) -> Manifest:
    """The manifest of ``repository`` at an already-resolved ``commit``.

    :raises HubError: refusal, unavailability or an invalid listing (path traversal, duplicates).
    """
    entries = await hub.tree(repository, commit, token=token)
    return Manifest.of(filtered(entries, allow=allow, ignore=ignore), commit=commit)


async def resolve(
    repository: str,
    revision: str = "main",
    *,
    endpoint: str = "https://huggingface.co",
    token: str | None = None,
    allow: Sequence[str] = (),
    ignore: Sequence[str] = (),
    hub: hub_client.HubClient | None = None,
) -> Manifest:
    """Resolve ``revision`` to a commit, list its files and build the manifest.

    Pass ``hub`` to reuse a session (its endpoint wins over ``endpoint``); otherwise one is
    opened for this call. :raises HubError: see :mod:`hub.errors`.
    """
    if hub is not None:
        commit = await hub.commit(repository, revision, token=token)
        return await listing(hub, repository, commit, token=token, allow=allow, ignore=ignore)
    async with hub_client.client(hub_client.HubSettings(endpoint=endpoint)) as own:
        return await resolve(repository, revision, token=token, allow=allow, ignore=ignore, hub=own)
