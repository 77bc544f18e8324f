"""Render wire shapes as the documents people pipe: YAML (the default) or JSON.

Both come from the JSON encoding, so the key order, camelCase names and omitted fields are
exactly the wire's. :func:`yaml_text` is the one YAML dumper of every command (``dm detect``,
``dm preflight``, ``bus watch -o yaml``, ``mm manifest``/``mm pull -o yaml``), so they share one
style: block sequences indented under their key (as kubectl prints), a multi-line string as a
``|`` block (it reads verbatim), and quotes on strings that a YAML 1.1 reader would otherwise
turn into numbers (``"7.2"``, ``"0000:04:00.0"``).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import msgspec

__all__ = ["Format", "render", "yaml_text"]

Format = Literal["yaml", "json"]


def render(document: Any, fmt: Format) -> str:
    """Return ``document`` (Structs, lists of Structs, builtins) as text ending in a newline."""
    encoded = msgspec.json.encode(document)
    if fmt == "json":
        return msgspec.json.format(encoded, indent=2).decode() + "\n"
    # Through JSON so sequences are lists and the keys are exactly the wire's.
    return yaml_text(msgspec.json.decode(encoded))


def yaml_text(builtins: Any) -> str:
    """JSON-shaped builtins (dicts, lists, strings, numbers) as one YAML document."""
    if builtins == []:
        return "[]\n"
    import yaml  # JSON output never pays for the YAML import

    text: str = yaml.dump(
        builtins, Dumper=_dumper(), sort_keys=False, allow_unicode=True, width=1000
    )
    return text


@functools.cache
def _dumper() -> type[Any]:
    import yaml

    class Dumper(yaml.SafeDumper):
        """Indents block sequences inside mappings, as kubectl and the seed document do."""

        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            super().increase_indent(flow, False)

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return Dumper
