"""``gpustack-operator model-manager manifest REPOSITORY``: print what a ModelArtifact would pin.

Standard output: the resolved commit, the canonical manifest text and the digest, so a person
can set ``expectedDigest``. With ``--hub modelscope`` the repository is on ModelScope
(``MODELSCOPE_DOMAIN``, ``MODELSCOPE_API_TOKEN``: :mod:`hub.modelscope_env`); otherwise
``HF_ENDPOINT``, the token (``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN`` or
the login file under ``HF_HOME``), ``HF_HUB_OFFLINE`` and the proxies come from the environment
(:func:`hub.endpoints.environment`). Patterns
are comma separated or repeated (``--allow-pattern '*.json' --allow-pattern '*.safetensors'``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Literal, cast

import anyio
import msgspec

from hub import client as hub_client
from hub import endpoints, kinds, resolving
from hub.errors import HubError
from hub.manifest import Manifest
from kit import rendering
from kit.options import Flags, Options, SettingsError

__all__ = [
    "FORMATS",
    "ManifestSettings",
    "manifest_command",
    "pulled_document",
    "render",
    "settings_from",
]

log = logging.getLogger(__name__)
EXIT_FAILED = 1
Output = Literal["text", "json", "yaml"]
FORMATS: tuple[Output, ...] = ("text", "json", "yaml")
"""``-o``: the canonical text (the digest is taken of it), or a document for a script."""


class FileEntry(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    size: int
    algorithm: str
    oid: str


class ManifestDocument(msgspec.Struct, frozen=True, kw_only=True):
    """``mm manifest -o json|yaml``: what a ModelArtifact would pin, and the files behind it."""

    repository: str
    revision: str
    commit: str | None
    digest: str
    size: int
    files: tuple[FileEntry, ...]


class PulledDocument(msgspec.Struct, frozen=True, kw_only=True):
    """``mm pull -o json|yaml``: the snapshot that was pulled, and where its tree is."""

    repository: str
    revision: str
    commit: str | None
    digest: str
    size: int
    path: str


def render(
    manifest: Manifest, output: Output = "text", *, repository: str = "", revision: str = ""
) -> str:
    """The one-shot's document: commit, manifest text and digest; or the same as a document."""
    if output == "text":
        return f"commit: {manifest.commit}\n{manifest.text()}digest: {manifest.digest}\n"
    files = tuple(
        FileEntry(path=e.path, size=e.size, algorithm=e.algorithm, oid=e.oid)
        for e in manifest.entries
    )
    document = ManifestDocument(
        repository=repository,
        revision=revision,
        commit=manifest.commit,
        digest=manifest.digest,
        size=manifest.size,
        files=files,
    )
    return rendering.render(document, output)


def pulled_document(
    manifest: Manifest, tree: Path, output: Output, *, repository: str, revision: str
) -> str:
    """What ``mm pull`` prints: ``commit``/``digest``/``path`` lines, or a document."""
    if output == "text":
        return f"commit: {manifest.commit}\ndigest: {manifest.digest}\npath: {tree}\n"
    document = PulledDocument(
        repository=repository,
        revision=revision,
        commit=manifest.commit,
        digest=manifest.digest,
        size=manifest.size,
        path=str(tree),
    )
    return rendering.render(document, output)


class ManifestSettings(msgspec.Struct, frozen=True, kw_only=True):
    repository: str
    revision: str
    endpoint: str
    token: str | None = None
    allow: tuple[str, ...]
    ignore: tuple[str, ...]
    hub_env: endpoints.HubEnvironment = endpoints.HubEnvironment()
    hub_kind: kinds.Kind = kinds.HUGGING_FACE
    output: Output = "text"

    @property
    def hub(self) -> hub_client.HubSettings:
        return hub_client.HubSettings.of(self.endpoint, self.hub_env)


class SnapshotFlags(Flags, frozen=True, kw_only=True):
    """Which snapshot of a repository, from which Hub, shown how (``mm manifest``, ``mm pull``)."""

    hub: str
    revision: str
    """Empty: the hub's default branch (``main``; ``master`` on ModelScope)."""
    allow_pattern: tuple[str, ...]
    ignore_pattern: tuple[str, ...]
    hf_endpoint: str
    modelscope_endpoint: str
    output: str


def snapshot_of(options: Options) -> tuple[SnapshotFlags, kinds.Snapshot]:
    """The snapshot flags of ``mm manifest`` and ``mm pull``, read once, and the snapshot they
    name (the one positional is the repository: the caller checks there is one).

    :raises SettingsError: a repository id or endpoint the hub cannot take.
    """
    flags = options.read_flags(SnapshotFlags)
    try:
        snapshot = kinds.snapshot_from(
            flags.hub,
            options.positionals[0],
            flags.revision,
            hf_endpoint=flags.hf_endpoint or None,
            modelscope_endpoint=flags.modelscope_endpoint or None,
            env=options.env,
        )
    except endpoints.InvalidName as e:
        raise SettingsError(str(e)) from e
    return flags, snapshot


def settings_from(options: Options) -> ManifestSettings:
    """:raises SettingsError: no single repository id, or an endpoint that is not a URL."""
    if len(options.positionals) != 1:
        raise SettingsError("needs exactly one REPOSITORY (owner/name)")
    flags, snapshot = snapshot_of(options)
    return ManifestSettings(
        repository=snapshot.repository,
        revision=snapshot.revision,
        endpoint=snapshot.endpoint,
        token=snapshot.env.token,
        allow=flags.allow_pattern,
        ignore=flags.ignore_pattern,
        hub_env=snapshot.env,
        hub_kind=snapshot.kind,
        output=cast(Output, flags.output),
    )


def manifest_command(settings: ManifestSettings) -> int:
    async def main() -> Manifest:
        async with hub_client.client(
            settings.hub, kind=kinds.client_class(settings.hub_kind)
        ) as hub:
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
    shown = render(
        manifest, settings.output, repository=settings.repository, revision=settings.revision
    )
    sys.stdout.write(shown)
    return 0
