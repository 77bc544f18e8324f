"""The settings of a service's HTTPS endpoint, built from its flags at start-up.

:class:`HttpsSettings` is what :func:`kit.serving.https_server` is started with; :func:`https_from`
builds it from a serving command's :class:`ServingFlags` (``--bind-address``, ``--secure-port``,
``--cert-dir``, ``--metrics-auth``), :func:`https_at` from parts (``standalone``).

Invariants: the settings are frozen and checked when built, so a bad address or a certificate
directory without ``tls.crt``/``tls.key`` is one :class:`~kit.options.SettingsError` line at
start-up, never a failure at the first connection. Nothing here speaks HTTP or TLS: a one-shot
that reads these settings loads no server stack.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

import msgspec

from kit.options import Flags, SettingsError

__all__ = [
    "Auth",
    "HttpsSettings",
    "ServingFlags",
    "bind_address",
    "cert_dir",
    "https_at",
    "https_from",
]

Auth = Literal["review", "none"]
"""``review``: every route but the probes needs a bearer token the reviewer allows for its path;
``none``: anyone who reaches the address may read them."""


class HttpsSettings(msgspec.Struct, frozen=True, kw_only=True):
    bind_address: str = "0.0.0.0"
    port: int = 0
    """0 picks a free port (tests); services pass ``--secure-port``."""
    cert_dir: str | None = None
    """Directory holding ``tls.crt`` and ``tls.key``; None means self-signed."""
    shutdown_timeout_s: float = 2.0
    """Bound on closing connections when the block exits (inside the process runner's)."""
    auth: Auth = "review"
    """Who may read the routes other than the probes (``--metrics-auth``). Secure by default:
    a caller that forgets to pass an authorizer fails to start rather than serving openly."""
    cors_allowed_origins: tuple[str, ...] | None = None
    """Regular expressions, each matched against a request's whole ``Origin``: a match gets
    the CORS headers (and a preflight ``OPTIONS`` its 204), anything else none (preflight 403).
    None: no CORS handling at all (the agents)."""


class ServingFlags(Flags, frozen=True, kw_only=True):
    """The flags of a serving command's HTTPS endpoint."""

    bind_address: str
    secure_port: int
    cert_dir: str
    metrics_auth: str


def https_from(flags: ServingFlags) -> HttpsSettings:
    """``--bind-address``, ``--secure-port``, ``--cert-dir`` and ``--metrics-auth``.

    :raises SettingsError: the address is not an IP address, or the certificate directory
        lacks ``tls.crt`` or ``tls.key``, so the mistake is one line at start-up.
    """
    auth: Auth = "none" if flags.metrics_auth == "none" else "review"
    return https_at(flags.bind_address, flags.secure_port, flags.cert_dir, auth)


def https_at(address: str, port: int, cert_dir_text: str, auth: Auth) -> HttpsSettings:
    """The endpoint's settings from its parts (``standalone`` gives each component its port and
    no ``--metrics-auth``). :raises SettingsError: as :func:`https_from`."""
    return HttpsSettings(
        bind_address=bind_address(address),
        port=port,
        cert_dir=cert_dir(cert_dir_text or None),
        auth=auth,
    )


def bind_address(text: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError as e:
        raise SettingsError(f"--bind-address {text!r} is not an IP address") from e
    return text


def cert_dir(path: str | None) -> str | None:
    if path is None:
        return None
    missing = [name for name in ("tls.crt", "tls.key") if not os.path.isfile(Path(path, name))]
    if missing:
        raise SettingsError(f"--cert-dir {path}: no {' or '.join(missing)} there")
    return path
