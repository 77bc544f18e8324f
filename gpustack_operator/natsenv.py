"""The nats CLI's environment and contexts, for the bus tools a person runs (``bus watch``).

Someone who already uses the ``nats`` CLI has its settings in the environment (``NATS_URL``,
``NATS_CREDS``, ``NATS_NKEY``, ``NATS_CERT``, ``NATS_KEY``, ``NATS_CA``, ``NATS_USER``,
``NATS_PASSWORD``) or in a *context*: a JSON file ``<name>.json`` under
``$XDG_CONFIG_HOME/nats/context/`` (``~/.config`` by default), named by ``NATS_CONTEXT`` or
else selected by ``nats context select`` (the name in ``nats/context.txt``). ``NATS_CONTEXT`` may
also be the path of such a file.

A user name without a password (from the environment or a context) is a token, as the nats
CLI's ``--user`` says ("username or token"). Precedence, as in the nats CLI: a ``--nats-*`` flag (or its ``GPUSTACK_NATS_*`` variable) wins
over a ``NATS_*`` variable, which wins over the context. A context's ``inbox_prefix`` is not
used: our servers let a dashboard read replies under its own prefix only (docs/bus.md).
Pure functions of the environment mapping handed in; files are read only when a context is named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Final

from kit import files
from kit.options import SettingsError

__all__ = ["ENVIRONMENT", "context_path", "layered"]

CONTEXT_BYTES: Final = 1024 * 1024
"""The largest nats context file read (they are a few hundred bytes)."""

ENVIRONMENT: Final = {
    "url": "NATS_URL",
    "user": "NATS_USER",
    "password": "NATS_PASSWORD",
    "creds_file": "NATS_CREDS",
    "nkey_seed_file": "NATS_NKEY",
    "tls_cert_file": "NATS_CERT",
    "tls_key_file": "NATS_KEY",
    "tls_ca_file": "NATS_CA",
}
"""BusSettings field -> the nats CLI's variable."""

_CONTEXT_KEYS: Final = {
    "url": "url",
    "user": "user",
    "password": "password",
    "token": "token",
    "creds_file": "creds",
    "nkey_seed_file": "nkey",
    "tls_cert_file": "cert",
    "tls_key_file": "key",
    "tls_ca_file": "ca",
}
"""BusSettings field -> the key in a context file (the nats CLI's context format)."""


def _config_home(env: Mapping[str, str]) -> str:
    if env.get("XDG_CONFIG_HOME"):
        return env["XDG_CONFIG_HOME"]
    return os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")


def context_path(env: Mapping[str, str]) -> str | None:
    """The context file in force: ``NATS_CONTEXT`` (a name or a ``.json`` path), else the
    selected one; None when neither says.

    :raises SettingsError: ``NATS_CONTEXT`` names a context that does not exist.
    """
    nats_dir = os.path.join(_config_home(env), "nats")
    name = env.get("NATS_CONTEXT", "").strip()
    if name:
        path = name if name.endswith(".json") else os.path.join(nats_dir, "context", name + ".json")
        if not os.path.isfile(path):
            raise SettingsError(f"NATS_CONTEXT={name}: no context file {path}")
        return path
    try:
        with open(os.path.join(nats_dir, "context.txt"), encoding="utf-8") as f:
            selected = f.read().strip()
    except OSError:
        return None
    path = os.path.join(nats_dir, "context", selected + ".json")
    return path if selected and os.path.isfile(path) else None


def _context(path: str) -> dict[str, str]:
    """The fields a context file sets (its non-empty strings), by BusSettings field.

    :raises SettingsError: unreadable, not a JSON object, or an ``nsc://`` context.
    """
    try:
        data = json.loads(files.read_capped(path, limit=CONTEXT_BYTES))
    except files.InputRefused as e:
        raise SettingsError(f"nats context {e}") from e
    except ValueError as e:
        raise SettingsError(f"nats context {path}: {e}") from e
    if not isinstance(data, dict):
        raise SettingsError(f"nats context {path}: not a JSON object")
    if data.get("nsc"):
        raise SettingsError(f"nats context {path}: nsc:// contexts are not supported")
    found = {field: data.get(key) for field, key in _CONTEXT_KEYS.items()}
    return {k: os.path.expanduser(v) if k.endswith("_file") else v for k, v in found.items() if v}


def _with_scheme(urls: str) -> str:
    """``host:4222`` as ``nats://host:4222``, as the nats CLI accepts it."""
    parts = [u.strip() for u in urls.split(",") if u.strip()]
    return ",".join(u if "://" in u else f"nats://{u}" for u in parts)


def layered(flags: Mapping[str, str | None], env: Mapping[str, str]) -> dict[str, str]:
    """Each BusSettings connection field's value: flag, else ``NATS_*``, else context.

    :param flags: the value each field got from its ``--nats-*`` flag (None: not given).
    :raises SettingsError: as :func:`context_path` and the context file's reader.
    """
    out = {k: v for k, v in flags.items() if v}
    for field, var in ENVIRONMENT.items():
        if field not in out and env.get(var):
            out[field] = env[var]
    path = context_path(env)
    if path is not None:
        for field, value in _context(path).items():
            out.setdefault(field, value)
    if "url" in out:
        out["url"] = _with_scheme(out["url"])
    if not flags.get("user") and out.get("user") and not out.get("password"):
        out.setdefault("token", out.pop("user"))  # the nats CLI's "username or token"
    return out
