"""The URLs the Hub client fetches, parsed once: what a request, a redirect and a proxy need.

Why not yarl: it was the download path's only use of it, and importing it (with idna and
multidict) cost about 10 ms of every ``mm pull``'s start-up, where the whole small-file pull
is a few hundred. This is :func:`urllib.parse.urlsplit` (already imported by ``pathlib``) plus
the few rules a client needs on top:

- the scheme and host are compared lower-case, and a non-ASCII host is IDNA-encoded (it goes
  into ``Host`` and the TLS server name);
- the *origin* is (scheme, host, port) with the scheme's default port filled in, so
  ``https://hub`` and ``https://hub:443`` are the same origin (RFC 6454) — the token rule
  depends on it;
- the request target keeps the path and query as the server wrote them; only bytes that may
  not appear in a request line (controls, space, non-ASCII) are percent-encoded, so a
  ``Location`` is followed exactly and can never inject a header;
- the fragment is dropped (it never goes on the wire).

Every malformed URL (no host, a bad port) is :class:`ValueError`; callers map it to their own
error at the boundary.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote, unquote, urljoin, urlsplit

__all__ = ["Url"]

DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_TARGET_SAFE: Final = "".join(chr(c) for c in range(0x21, 0x7F))
"""Printable ASCII but space: kept as written (``%`` included, so nothing is encoded twice)."""


class Url:
    """One absolute ``http``/``https`` URL; immutable. :raises ValueError: when malformed."""

    __slots__ = ("explicit_port", "host", "password", "port", "scheme", "target", "user")

    scheme: str
    host: str
    """Lower-case; IPv6 without brackets; IDNA-encoded when it was not ASCII."""
    port: int
    """The explicit port, else the scheme's default."""
    explicit_port: int | None
    target: str
    """Path and query for the request line: ``/`` at least, never a fragment."""
    user: str | None
    password: str | None
    """Percent-decoded (a proxy URL's Basic credentials)."""

    def __init__(self, text: str) -> None:
        try:
            parts = urlsplit(text.strip())
            explicit = parts.port
        except ValueError as e:
            raise ValueError(f"malformed URL {text[:200]!r}: {e}") from e
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"not an http(s) URL with a host: {text[:200]!r}")
        host = parts.hostname
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii")
            except UnicodeError as e:
                raise ValueError(f"malformed host in {text[:200]!r}") from e
        target = parts.path or "/"
        if parts.query:
            target = f"{target}?{parts.query}"
        self.scheme, self.host, self.explicit_port = scheme, host, explicit
        self.port = explicit if explicit is not None else DEFAULT_PORTS[scheme]
        self.target = quote(target, safe=_TARGET_SAFE)
        self.user = None if parts.username is None else unquote(parts.username)
        self.password = None if parts.password is None else unquote(parts.password)

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    @property
    def path(self) -> str:
        """The target without its query (for messages)."""
        return self.target.partition("?")[0]

    @property
    def host_port(self) -> str:
        """What ``Host`` says: the host (bracketed if IPv6), ``:port`` only if explicit."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.explicit_port is None else f"{host}:{self.explicit_port}"

    def join(self, reference: str) -> Url:
        """Where ``reference`` (a ``Location`` or a ``Link`` target) points from here.

        An absolute ``http(s)`` reference (what a CDN redirect is) needs nothing of this URL:
        it is parsed as it is, which is what resolving it would give.
        """
        reference = reference.strip()
        if reference.startswith(("https://", "http://")):
            return Url(reference)
        return Url(urljoin(str(self), reference))

    def under(self, path: str) -> Url:
        """This URL with ``path`` (percent-encoded, starting with ``/``) appended to its path:
        the same origin, parsed once for every file of a pull. :raises ValueError: this URL
        has a query, or ``path`` holds a byte a request line may not carry."""
        verbatim = path.startswith("/") and path.isascii() and path.isprintable()
        if "?" in self.target or not verbatim or " " in path:
            raise ValueError(f"cannot append {path[:200]!r} to {self}")
        url = object.__new__(Url)
        url.scheme, url.host, url.port = self.scheme, self.host, self.port
        url.explicit_port, url.user, url.password = self.explicit_port, self.user, self.password
        url.target = self.target.rstrip("/") + path
        return url

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host_port}{self.target}"

    def __repr__(self) -> str:
        return f"Url({str(self)!r})"
