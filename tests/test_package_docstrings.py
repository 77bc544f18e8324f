"""Every package's docstring names each module and subpackage that lives in it.

A reader opening ``kit/__init__.py`` or ``controlplane/__init__.py`` should find the whole room
listed; a module added without a word there fails here (``kit`` once listed 4 of its 10).
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

OURS = ("gpustack_operator", "agent", "controlplane", "hub", "kit", "bus")


def packages() -> list[str]:
    found = []
    for root in OURS:
        found.append(root)
        path = importlib.import_module(root).__path__
        found += [m.name for m in pkgutil.walk_packages(path, f"{root}.") if m.ispkg]
    return sorted(found)


def unnamed(package: str) -> list[str]:
    """The children of ``package`` its docstring does not name (as a whole word)."""
    module = importlib.import_module(package)
    doc = module.__doc__ or ""
    children = [m.name for m in pkgutil.iter_modules(module.__path__)]
    return [c for c in children if not re.search(rf"(?<!\w){re.escape(c)}(?!\w)", doc)]


@pytest.mark.parametrize("package", packages())
def test_the_package_docstring_names_what_lives_there(package: str) -> None:
    assert unnamed(package) == []
