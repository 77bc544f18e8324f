"""Which hub a repository is on: the one choice that picks client, endpoint, token and defaults.

Every command and component that names a repository names its hub with it (``--hub``,
``spec.source.huggingFace`` or ``spec.source.modelScope``); this module turns that name into
what differs between the two, once, so no caller compares hub names itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from hub import endpoints, modelscope_env
from hub.client import HubClient
from hub.endpoints import HubEnvironment, InvalidName
from hub.modelscope import ModelScopeClient

__all__ = [
    "HUGGING_FACE",
    "KINDS",
    "MODELSCOPE",
    "Kind",
    "Snapshot",
    "client_class",
    "default_revision",
    "snapshot_from",
]

Kind = Literal["huggingface", "modelscope"]
HUGGING_FACE: Final[Kind] = "huggingface"
MODELSCOPE: Final[Kind] = "modelscope"
KINDS: Final[tuple[Kind, ...]] = (HUGGING_FACE, MODELSCOPE)
_DEFAULT_REVISION: Final[Mapping[str, str]] = {HUGGING_FACE: "main", MODELSCOPE: "master"}


def default_revision(kind: Kind) -> str:
    """``main`` on Hugging Face, ``master`` on ModelScope (each hub's default branch)."""
    return _DEFAULT_REVISION[kind]


def client_class(kind: Kind) -> type[HubClient]:
    return ModelScopeClient if kind == MODELSCOPE else HubClient


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A repository at a revision on one hub, with where that hub is and its environment."""

    kind: Kind = HUGGING_FACE
    repository: str
    revision: str
    endpoint: str
    env: HubEnvironment = HubEnvironment()


def snapshot_from(
    kind: str,
    repository: str,
    revision: str,
    *,
    hf_endpoint: str | None,
    modelscope_endpoint: str | None,
    env: Mapping[str, str],
) -> Snapshot:
    """Validate a command's choice of hub, repository and endpoint flags.

    :raises InvalidName: an unknown hub, a repository id that hub refuses, an endpoint that is
        not usable, or the other hub's endpoint flag (a flag is never silently ignored).
    """
    if kind not in KINDS:
        raise InvalidName(f"--hub must be one of {', '.join(KINDS)}, not {kind!r}")
    chosen: Kind = kind
    if chosen == MODELSCOPE:
        if hf_endpoint:
            raise InvalidName("--hf-endpoint is for --hub huggingface; use --modelscope-endpoint")
        return Snapshot(
            kind=chosen,
            repository=modelscope_env.repository(repository),
            revision=revision or default_revision(chosen),
            endpoint=modelscope_env.endpoint_from(modelscope_endpoint, env),
            env=modelscope_env.environment(env),
        )
    if modelscope_endpoint:
        raise InvalidName("--modelscope-endpoint needs --hub modelscope")
    return Snapshot(
        kind=chosen,
        repository=endpoints.repository(repository),
        revision=revision or default_revision(chosen),
        endpoint=endpoints.endpoint_from(hf_endpoint, env),
        env=endpoints.environment(env),
    )
