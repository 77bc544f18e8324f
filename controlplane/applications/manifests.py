"""Where a pinned release manifest comes from, and the check that it is the pinned one.

Sources, in order: a mirror (``--applications-mirror``: a directory, e.g. a mounted ConfigMap,
or an ``http(s)://`` base URL inside an air-gapped network, holding ``<name>/<version>/<file>``;
or ``configmap:<name>``, a ConfigMap of the system namespace read through the API, whose
``data`` or ``binaryData`` key ``<name>_<version>_<file>`` holds it); else the pin's upstream
URL. Whatever the source, :func:`verify`
compares the bytes' SHA-256 with the pin before anything is parsed, so a mirror cannot change
what is installed. :func:`parse` turns a verified multi-document YAML into its objects.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any, Final

import aiohttp
import anyio
import yaml

from controlplane import errors
from controlplane.applications.pins import Pin
from controlplane.errors import ControlPlaneError
from controlplane.k8s.client import KubeClient
from controlplane.resources import CONFIGMAPS, Ref

__all__ = [
    "ManifestError",
    "configmap_key",
    "fetch",
    "how_to_pin",
    "location",
    "parse",
    "require_checksum",
    "verify",
]

MAX_BYTES = 16 * 1024 * 1024
"""A release manifest larger than this is refused (Kueue's is a few MiB)."""


class ManifestError(ControlPlaneError):
    """A manifest could not be had, or is not the pinned one; ``reason`` is its one-word kind."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


CONFIGMAP: Final = "configmap:"


def configmap_key(pin: Pin) -> str:
    """The key of a ``configmap:`` mirror holding the pin (ConfigMap keys have no ``/``)."""
    return f"{pin.name}_{pin.version}_{pin.file}"


def how_to_pin(pin: Pin) -> str:
    """What an operator does about a pin that cannot be verified or fetched (pure): where the
    file comes from, where the checksum goes, where a mirror holds it, or how to opt out."""
    source = f"download {pin.url}" if pin.url else f"build {pin.build or 'the release manifest'}"
    return (
        f"to install it, {source}, record its `sha256sum` as the pin's sha256 in "
        "controlplane/applications/pins.py and rebuild the image; where the cluster cannot "
        f"reach upstream, serve the file from --applications-mirror as "
        f"<mirror>/{pin.name}/{pin.version}/{pin.file} (a directory or http(s) base URL) or "
        f"under the key {configmap_key(pin)} of the ConfigMap named by configmap:NAME "
        f'(docs/deploy.md, "Applications"); or install {pin.name} yourself and add it to '
        "--disable-applications"
    )


def location(pin: Pin, mirror: str | None) -> str:
    """The file or URL the pin's manifest is read from (pure)."""
    if mirror and mirror.startswith(CONFIGMAP):
        return f"{mirror}/{configmap_key(pin)}"
    if mirror:
        if mirror.startswith(("http://", "https://")):
            return f"{mirror.rstrip('/')}/{pin.name}/{pin.version}/{pin.file}"
        return str(Path(mirror) / pin.name / pin.version / pin.file)
    if pin.url is None:
        raise ManifestError(
            "no-source", f"{pin.name} {pin.version}: upstream has no single manifest and no "
            f"--applications-mirror is set; {how_to_pin(pin)}",
        )  # fmt: skip
    return pin.url


async def fetch(
    pin: Pin,
    mirror: str | None,
    *,
    api: KubeClient | None = None,
    namespace: str = "gpustack-system",
    timeout_s: float = 60.0,
) -> bytes:
    """The manifest's bytes (``api`` reads a ``configmap:`` mirror).

    :raises ManifestError: unreachable, not found, too large."""
    where = location(pin, mirror)
    try:
        if where.startswith(CONFIGMAP):
            assert api is not None, "a configmap: mirror is read through the API"
            data = await _configmap(pin, where.removeprefix(CONFIGMAP), api, namespace)
        elif not where.startswith(("http://", "https://")):
            data = await anyio.Path(where).read_bytes()
        else:
            data = await _get(pin, where, timeout_s)
    except (OSError, aiohttp.ClientError, TimeoutError, errors.ApiError) as e:
        raise ManifestError("fetch-failed", f"{pin.name}: reading {where}: {e}") from e
    if len(data) > MAX_BYTES:
        raise ManifestError("fetch-failed", f"{pin.name}: {where} is larger than {MAX_BYTES} bytes")
    return data


async def _configmap(pin: Pin, where: str, api: KubeClient, namespace: str) -> bytes:
    name, _, key = where.partition("/")
    cm = await api.get(Ref(resource=CONFIGMAPS, name=name, namespace=namespace))
    if key in (cm.get("binaryData") or {}):
        return base64.b64decode(cm["binaryData"][key])
    text = (cm.get("data") or {}).get(key)
    if text is None:
        raise ManifestError("fetch-failed", f"{pin.name}: ConfigMap {name} has no key {key}")
    return str(text).encode()


async def _get(pin: Pin, url: str, timeout_s: float) -> bytes:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
        if response.status != 200:
            raise ManifestError("fetch-failed", f"{pin.name}: GET {url} answered {response.status}")
        return await response.content.read(MAX_BYTES + 1)


def require_checksum(pin: Pin) -> str:
    """The pinned checksum; checked before anything is fetched (a manifest that cannot be
    verified is not worth downloading). :raises ManifestError: none is pinned."""
    if pin.sha256 is None:
        raise ManifestError(
            "unpinned",
            f"{pin.name} {pin.version}: no checksum is pinned in this build, so nothing is "
            f"applied; {how_to_pin(pin)}",
        )
    return pin.sha256


def verify(pin: Pin, data: bytes) -> None:
    """:raises ManifestError: the pin has no checksum, or ``data`` does not hash to it."""
    expected = require_checksum(pin)
    got = hashlib.sha256(data).hexdigest()
    if got != expected.lower():
        raise ManifestError(
            "checksum-mismatch",
            f"{pin.name} {pin.version}: sha256 {got} is not the pinned {expected}; nothing applied",
        )


def parse(pin: Pin, data: bytes) -> list[dict[str, Any]]:
    """The manifest's objects (empty documents and ``List`` wrappers flattened).

    :raises ManifestError: not YAML, or a document that is not a Kubernetes object.
    """
    try:
        docs = list(yaml.safe_load_all(data))
    except yaml.YAMLError as e:
        raise ManifestError("invalid", f"{pin.name}: the manifest is not YAML: {e}") from e
    out: list[dict[str, Any]] = []
    for doc in docs:
        if doc is None:
            continue
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
        for item in items or []:
            if not (isinstance(item, dict) and item.get("apiVersion") and item.get("kind")
                    and (item.get("metadata") or {}).get("name")):  # fmt: skip
                raise ManifestError(
                    "invalid", f"{pin.name}: a document is not a named Kubernetes object"
                )
            out.append(item)
    return out
