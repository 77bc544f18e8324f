"""Render wire shapes as the documents people pipe: YAML (the default) or JSON.

Both come from the JSON encoding, so the key order, camelCase names and omitted fields are
exactly the wire's. YAML indents sequences under their key (as kubectl prints) and quotes strings
that a YAML 1.1 reader would otherwise turn into numbers (``"7.2"``, ``"0000:04:00.0"``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Format = Literal["yaml", "json"]


def render(document: Any, fmt: Format) -> str:
    """Return ``document`` (Structs, lists of Structs, builtins) as text ending in a newline."""
    encoded = msgspec.json.encode(document)
    if fmt == "json":
        return msgspec.json.format(encoded, indent=2).decode() + "\n"
    # Through JSON so sequences are lists and the keys are exactly the wire's.
    builtins = msgspec.json.decode(encoded)
    if builtins == []:
        return "[]\n"
    import yaml  # JSON output never pays for the YAML import

    class IndentedDumper(yaml.SafeDumper):
        """Indents block sequences inside mappings, as kubectl and the seed document do."""

        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            super().increase_indent(flow, False)

    text: str = yaml.dump(
        builtins, Dumper=IndentedDumper, sort_keys=False, allow_unicode=True, width=1000
    )
    return text
