"""``gpustack-operator model-manager manifest REPOSITORY``: print what a ModelArtifact would pin.

Standard output: the resolved commit, the canonical manifest text and the digest, so a person
can set ``expectedDigest``. ``HF_ENDPOINT``, the token (``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN`` or
the login file under ``HF_HOME``), ``HF_HUB_OFFLINE`` and the proxies come from the environment
(:func:`hub.endpoints.environment`). Patterns
are comma separated or repeated (``--allow-pattern '*.json' --allow-pattern '*.safetensors'``).
"""

from __future__ import annotations

import logging
import sys

import anyio
import msgspec

from hub import client as hub_client
from hub import endpoints, resolving
from hub.errors import HubError
from hub.manifest import Manifest
from kit.options import Options, SettingsError

__all__ = ["ManifestSettings", "manifest_command", "render", "settings_from"]

log = logging.getLogger(__name__)
EXIT_FAILED = 1


def render(manifest: Manifest) -> str:
    """The one-shot's document: commit, manifest text, digest."""
    return f"commit: {manifest.commit}\n{manifest.text()}digest: {manifest.digest}\n"


class ManifestSettings(msgspec.Struct, frozen=True, kw_only=True):
    repository: str
    revision: str
    endpoint: str
    token: str | None = None
    allow: tuple[str, ...]
    ignore: tuple[str, ...]
    hub_env: endpoints.HubEnvironment = endpoints.HubEnvironment()

    @property
    def hub(self) -> hub_client.HubSettings:
        return hub_client.HubSettings.of(self.endpoint, self.hub_env)


def settings_from(options: Options) -> ManifestSettings:
    """:raises SettingsError: no single repository id, or an endpoint that is not a URL."""
    if len(options.positionals) != 1:
        raise SettingsError("needs exactly one REPOSITORY (owner/name)")
    env = endpoints.environment(options.env)
    try:
        return ManifestSettings(
            repository=endpoints.repository(options.positionals[0]),
            revision=options.text("revision") or "main",
            endpoint=endpoints.endpoint_from(options.optional_text("hf-endpoint"), options.env),
            token=env.token,
            allow=options.items("allow-pattern"),
            ignore=options.items("ignore-pattern"),
            hub_env=env,
        )
    except endpoints.InvalidName as e:
        raise SettingsError(str(e)) from e


def manifest_command(settings: ManifestSettings) -> int:
    async def main() -> Manifest:
        async with hub_client.client(settings.hub) as hub:
            return await resolving.resolve(
                settings.repository,
                settings.revision,
                token=settings.token,
                allow=settings.allow,
                ignore=settings.ignore,
                hub=hub,
            )

    try:
        manifest = anyio.run(main)
    except HubError as e:
        log.error("%s: %s", e.reason, e)
        return EXIT_FAILED
    sys.stdout.write(render(manifest))
    return 0
