"""Kubernetes names we generate from facts we do not control, kept within the API's limits (pure).

A label name part (the text after ``prefix/``) and a label value hold at most 63 characters, an
object name (DNS subdomain) 253. A name made from a CPU model or an accelerator product can be
longer; the API server then refuses the whole object or patch. :func:`bounded` shortens such a
text to a limit: its first characters, a dash, and 10 hex digits of the SHA-256 of the whole
text. Invariants:

- a text within the limit is returned unchanged (every name that was valid stays the same);
- the same text always gives the same name, in every process and release (a label written once
  is found again), and two texts that share a long prefix still get different names;
- the result keeps the text's alphabet and ends with an alphanumeric character, so a valid but
  long name part stays a valid name part.
"""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = ["DNS_SUBDOMAIN_MAX", "LABEL_NAME_MAX", "LABEL_VALUE_MAX", "bounded"]

LABEL_NAME_MAX: Final = 63
LABEL_VALUE_MAX: Final = 63
DNS_SUBDOMAIN_MAX: Final = 253
_DIGEST: Final = 10


def bounded(text: str, limit: int) -> str:
    """``text`` when at most ``limit`` characters, else its head, ``-`` and a stable digest."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:_DIGEST]
    head = text[: max(limit - _DIGEST - 1, 0)].rstrip("-_.")
    return f"{head}-{digest}" if head else digest[:limit]
