"""Where ModelScope is and which token to use: the conventions of ModelScope's own SDK and CLI.

- endpoint: a flag, else ``MODELSCOPE_ENDPOINT`` (the current SDK's, ``modelscope_hub``), else
  ``MODELSCOPE_DOMAIN`` (the older SDK's, now deprecated there but still read), else
  :data:`DEFAULT_ENDPOINT`; either variable may be a bare domain such as ``www.modelscope.ai``,
  to which ``https://`` is prefixed as the SDK does, or a full ``http(s)://`` URL. Checked with
  the client's own URL parser, so a value it would refuse at the first request is refused where
  a command exits 2;
- token: ``MODELSCOPE_API_TOKEN`` (what both SDKs read), else none: public repositories need
  none. The SDK's login file (``~/.modelscope/credentials/cookies``) is a pickled cookie jar and
  is deliberately not read: unpickling a file is running code;
- proxies as for Hugging Face (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``, either case);
  ``HF_HUB_OFFLINE`` is Hugging Face's switch and does not apply here.

A repository id is ``owner/name`` (the SDK refuses any other form).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import msgspec

from hub import endpoints
from hub.endpoints import HubEnvironment, InvalidName
from hub.urls import Url

__all__ = ["DEFAULT_ENDPOINT", "endpoint_from", "environment", "repository", "token_from"]

DEFAULT_ENDPOINT: Final = "https://www.modelscope.cn"
_REPOSITORY = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def _with_scheme(value: str) -> str:
    """A bare domain gets ``https://``; a value with any scheme is left for the URL check
    (so ``ftp://host`` is refused, not read as the host ``ftp``)."""
    value = value.strip()
    if value and "://" not in value:
        return "https://" + value
    return value


def endpoint_from(flag: str | None, env: Mapping[str, str]) -> str:
    """The endpoint: ``flag``, else ``MODELSCOPE_ENDPOINT``, else ``MODELSCOPE_DOMAIN``, else
    the public ModelScope."""
    from_env = _with_scheme(env.get("MODELSCOPE_ENDPOINT") or "") or _with_scheme(
        env.get("MODELSCOPE_DOMAIN") or ""
    )
    url = flag or from_env or DEFAULT_ENDPOINT
    try:
        parsed = Url(url)
    except ValueError as e:
        raise InvalidName(f"the ModelScope endpoint is not usable: {e}") from e
    if parsed.user is not None or parsed.password is not None:
        raise InvalidName(
            "the ModelScope endpoint must not carry credentials (use MODELSCOPE_API_TOKEN)"
        )
    return url.rstrip("/")


def repository(name: str) -> str:
    """``name`` if it is a ModelScope model id (``owner/name``), else :class:`InvalidName`."""
    if not _REPOSITORY.fullmatch(name) or ".." in name:
        raise InvalidName(f"{name!r} is not a ModelScope model id such as owner/name")
    return name


def token_from(env: Mapping[str, str]) -> str | None:
    return (env.get("MODELSCOPE_API_TOKEN") or "").strip() or None


def environment(env: Mapping[str, str]) -> HubEnvironment:
    """The proxies of :func:`hub.endpoints.environment` with ModelScope's token, never offline."""
    return msgspec.structs.replace(endpoints.environment(env), token=token_from(env), offline=False)
