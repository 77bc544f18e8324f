"""Where the Hub is, and what names may be sent to it: the rules every Hub user applies once.

The endpoint comes from a flag, else ``HF_ENDPOINT``, else the public Hub; it must be an
``http(s)`` URL with a host (no credentials: they would end up in logs). A repository is
``name`` or ``owner/name`` of the Hub's own characters, so a value such as ``../../etc`` is
refused before it becomes part of a URL path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

__all__ = ["DEFAULT_ENDPOINT", "InvalidName", "endpoint_from", "repository"]

DEFAULT_ENDPOINT: Final = "https://huggingface.co"

_REPOSITORY = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


class InvalidName(ValueError):
    """An endpoint or repository name the Hub client refuses to use."""


def endpoint_from(flag: str | None, env: Mapping[str, str]) -> str:
    """The endpoint: ``flag``, else ``HF_ENDPOINT``, else the public Hub; validated."""
    url = flag or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidName(f"{url!r} is not an http(s) URL with a host")
    if parts.username or parts.password:
        raise InvalidName("the Hub endpoint must not carry credentials (use HF_TOKEN)")
    return url.rstrip("/")


def repository(name: str) -> str:
    """``name`` if it is a Hub repository id (``owner/name``), else :class:`InvalidName`."""
    if not _REPOSITORY.fullmatch(name) or ".." in name:
        raise InvalidName(f"{name!r} is not a repository id such as owner/name")
    return name
