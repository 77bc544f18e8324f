"""No import loop inside any package of ours, at any depth.

import-linter's contracts name the layers they know; a loop between two siblings it was never
told about (``controlplane.admission`` <-> ``controlplane.reconciling`` was one) passes them all.
This check needs no list: for every package it folds each child's descendants into the child
and asks whether the children's import graph has a cycle. A child package importing a sibling
counts as the child importing it, so the answer matches what a reader sees in the tree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

OURS = ("gpustack_operator", "agent", "controlplane", "hub", "kit", "bus")


def sibling_edges(graph: grimp.ImportGraph, package: str) -> dict[str, set[str]]:
    """``child -> {sibling it imports}`` for the children of ``package``, descendants folded."""

    def child(module: str) -> str | None:
        if not module.startswith(f"{package}."):
            return None
        return f"{package}.{module[len(package) + 1 :].split('.')[0]}"

    edges: dict[str, set[str]] = {}
    for module in graph.find_descendants(package):
        source = child(module)
        for imported in graph.find_modules_directly_imported_by(module):
            target = child(imported)
            if source and target and target != source:
                edges.setdefault(source, set()).add(target)
    return edges


def cycles(nodes: Iterable[str], edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def loops_in(*roots: str) -> list[str]:
    """One line per loop: the package, its looping children, and their imports of each other."""
    graph = grimp.build_graph(*roots)
    lines = []
    for package in sorted(m for m in graph.modules if graph.find_children(m)):
        edges = sibling_edges(graph, package)
        for component in cycles(graph.find_children(package), edges):
            arrows = [f"{a} -> {b}" for a in component for b in sorted(edges[a]) if b in component]
            lines.append(f"{package}: {', '.join(arrows)}")
    return lines


def test_no_package_of_ours_has_an_import_loop_among_its_children() -> None:
    assert loops_in(*OURS) == []


def test_the_check_sees_a_loop_between_sibling_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shape of the loops it was written for: two subpackages' modules import each other's
    package, while no single module imports back (so a module-level cycle search finds none)."""
    root = tmp_path / "looproot"
    for name, text in {
        "__init__.py": "",
        "low.py": "",
        "a/__init__.py": "",
        "a/one.py": "from looproot.b import two\n",
        "b/__init__.py": "",
        "b/two.py": "from looproot import low\n",
        "b/three.py": "from looproot.a import one\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert loops_in("looproot") == ["looproot: looproot.a -> looproot.b, looproot.b -> looproot.a"]
