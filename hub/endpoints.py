"""Where the Hub is, and what names may be sent to it: the rules every Hub user applies once.

The endpoint comes from a flag, else ``HF_ENDPOINT``, else the public Hub; it must be an
``http(s)`` URL with a host (no credentials: they would end up in logs). A repository is
``name`` or ``owner/name`` of the Hub's own characters, so a value such as ``../../etc`` is
refused before it becomes part of a URL path.

The rest of the environment a Hugging Face user expects is read here too, once, at the edge
(:func:`environment`): the token (``HF_TOKEN``, the legacy ``HUGGING_FACE_HUB_TOKEN``, else the
file ``huggingface-cli login`` writes: ``HF_TOKEN_PATH``, else ``$HF_HOME/token``, else
``~/.cache/huggingface/token``), ``HF_HUB_OFFLINE`` and the proxies (``HTTPS_PROXY``,
``HTTP_PROXY``, ``NO_PROXY``, either case, as curl and requests read them).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

from hub.urls import Url
from kit.files import InputRefused, read_capped

__all__ = [
    "DEFAULT_ENDPOINT",
    "HubEnvironment",
    "InvalidName",
    "bypasses",
    "endpoint_from",
    "environment",
    "repository",
    "token_from",
]

DEFAULT_ENDPOINT: Final = "https://huggingface.co"
TOKEN_BYTES: Final = 64 * 1024
"""The largest Hub token file read (a token is under a hundred bytes)."""

_REPOSITORY = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


class InvalidName(ValueError):
    """An endpoint or repository name the Hub client refuses to use."""


def endpoint_from(flag: str | None, env: Mapping[str, str]) -> str:
    """The endpoint: ``flag``, else ``HF_ENDPOINT``, else the public Hub; validated by the
    client's own URL parser, so a URL it would refuse at the first request (a bad port, an
    unclosed IPv6 bracket) is refused here, where the command exits 2."""
    url = flag or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    try:
        parsed = Url(url)
    except ValueError as e:
        raise InvalidName(f"the Hub endpoint is not usable: {e}") from e
    if parsed.user is not None or parsed.password is not None:
        raise InvalidName("the Hub endpoint must not carry credentials (use HF_TOKEN)")
    return url.rstrip("/")


def repository(name: str) -> str:
    """``name`` if it is a Hub repository id (``owner/name``), else :class:`InvalidName`."""
    if not _REPOSITORY.fullmatch(name) or ".." in name:
        raise InvalidName(f"{name!r} is not a repository id such as owner/name")
    return name


_TRUE: Final = frozenset({"1", "on", "yes", "true"})


class HubEnvironment(msgspec.Struct, frozen=True, kw_only=True):
    """What the Hugging Face environment says, read once by a command's settings builder."""

    token: str | None = None
    offline: bool = False
    """``HF_HUB_OFFLINE``: no request reaches the Hub (cached trees still serve)."""
    https_proxy: str | None = None
    http_proxy: str | None = None
    no_proxy: tuple[str, ...] = ()
    """Hosts (``example.com``, ``.example.com``), ``host:port``, CIDRs, or ``*``: no proxy."""

    def __repr__(self) -> str:  # the token never reaches a log line
        return f"HubEnvironment(offline={self.offline}, https_proxy={self.https_proxy!r})"


def token_from(env: Mapping[str, str]) -> str | None:
    """The token as ``huggingface_hub`` finds it: variables first, then the login file.

    An unreadable token file is no token (a daemon's HOME may not be there), not an error.
    """
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if value := env.get(name, "").strip():
            return value
    path = env.get("HF_TOKEN_PATH") or os.path.join(
        env.get("HF_HOME") or os.path.join(_cache_home(env), "huggingface"), "token"
    )
    try:
        data = read_capped(Path(path).expanduser(), limit=TOKEN_BYTES)
        return data.decode("utf-8").strip() or None
    except (InputRefused, UnicodeDecodeError):
        return None


def _cache_home(env: Mapping[str, str]) -> str:
    if xdg := env.get("XDG_CACHE_HOME"):
        return xdg
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".cache")


def _either(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name.lower()) or env.get(name.upper()) or None


def environment(env: Mapping[str, str]) -> HubEnvironment:
    """Token, offline switch and proxies from ``env`` (see the module docstring)."""
    no_proxy = _either(env, "no_proxy") or ""
    return HubEnvironment(
        token=token_from(env),
        offline=env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE,
        https_proxy=_either(env, "https_proxy"),
        http_proxy=_either(env, "http_proxy"),
        no_proxy=tuple(p.strip() for p in no_proxy.split(",") if p.strip()),
    )


def bypasses(no_proxy: tuple[str, ...], host: str, port: int | None) -> bool:
    """Whether ``NO_PROXY`` entries exempt ``host`` (and ``port``) from the proxy.

    As curl: ``*`` matches everything; a name matches itself and its subdomains (a leading dot
    is optional); ``name:port`` only that port; an IP address or CIDR matches addresses in it.
    """
    host = host.lower().strip("[]")
    for raw in no_proxy:
        entry = raw.lower()
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if _has_port(entry) else (entry, "", "")
        if entry_port and port is not None and entry_port != str(port):
            continue
        name = name.strip("[]").lstrip(".")
        if host == name or host.endswith("." + name) or _in_network(host, name):
            return True
    return False


def _has_port(entry: str) -> bool:
    head, sep, tail = entry.rpartition(":")
    return bool(sep) and tail.isdigit() and (head.endswith("]") or ":" not in head)


def _in_network(host: str, entry: str) -> bool:
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
