"""``gpustack-operator model-manager manifest REPOSITORY``: print what a ModelArtifact would pin.

Standard output: the resolved commit, the canonical manifest text and the digest, so a person
can set ``expectedDigest``. ``HF_ENDPOINT`` and ``HF_TOKEN`` come from the environment. Patterns
are comma separated (``--allow-pattern '*.json,*.safetensors'``) because the launcher keeps only
the last value of a repeated flag.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import cast

import anyio

from hub import resolving
from hub.errors import HubError
from hub.manifest import Manifest

__all__ = ["manifest_command", "render"]

log = logging.getLogger(__name__)
EXIT_FAILED = 1
EXIT_USAGE = 2


def _patterns(values: Mapping[str, object], name: str) -> tuple[str, ...]:
    raw = values.get(name) or ""
    items = raw if isinstance(raw, list | tuple) else str(raw).split(",")
    return tuple(p.strip() for p in items if str(p).strip())


def render(manifest: Manifest) -> str:
    """The one-shot's document: commit, manifest text, digest."""
    return f"commit: {manifest.commit}\n{manifest.text()}digest: {manifest.digest}\n"


def manifest_command(values: dict[str, object], positionals: list[str]) -> int:
    if len(positionals) != 1:
        log.error("usage: model-manager manifest REPOSITORY [--revision REV] [--allow-pattern P]")
        return EXIT_USAGE
    revision = cast(str, values.get("revision") or "") or "main"
    endpoint = (
        cast(str, values.get("hf_endpoint") or "")
        or os.environ.get("HF_ENDPOINT")
        or "https://huggingface.co"
    )
    token = os.environ.get("HF_TOKEN") or None

    async def main() -> Manifest:
        return await resolving.resolve(
            positionals[0],
            revision,
            endpoint=endpoint,
            token=token,
            allow=_patterns(values, "allow_pattern"),
            ignore=_patterns(values, "ignore_pattern"),
        )

    try:
        manifest = anyio.run(main)
    except HubError as e:
        log.error("%s: %s", e.reason, e)
        return EXIT_FAILED
    sys.stdout.write(render(manifest))
    return 0
