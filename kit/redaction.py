"""Secrets out of what people read: passwords inside URLs become ``REDACTED``.

A NATS or Hub URL may carry ``user:password@`` (``nats://u:p@host:4222``). Such URLs are shown
in warnings that repeat on every reconnect, in errors, in banners and in ``--print-cmdline``,
and all of those end up in log collectors that many more people can read than the Secret the
password came from. Everything that shows a URL passes it through :func:`redact_urls` first;
the log formatter does so once more for lines from code that does not know it holds a URL.

The user name stays: it says which identity failed, and it is not a secret. A NATS URL with a
user part alone (``nats://t0ken@host``) carries a token, so there the whole user part goes.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["REDACTED", "redact_urls"]

REDACTED: Final = "REDACTED"

_PASSWORD: Final = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:,'\"]*:)[^\s/,'\"]*@")
"""``scheme://user:password@``. The password runs to the last ``@`` before the host (as URL
parsers read it), so one holding an unescaped ``@`` is hidden whole; whitespace, quotes, ``/``
and the commas of a URL list end it."""

_TOKEN: Final = re.compile(r"(?P<head>\b(?:nats|tls|ws|wss)://)[^\s/:,'\"]+@")
"""``nats://token@``: NATS reads a user part without a password as a token."""


def redact_urls(text: str) -> str:
    """``text`` with every password (and NATS token) inside a URL replaced by REDACTED."""
    if "@" not in text:
        return text  # the common case, on every log line: no regex work
    text = _PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}@", text)
    return _TOKEN.sub(lambda m: f"{m['head']}{REDACTED}@", text)
