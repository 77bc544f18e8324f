"""The project's tooling keeps its promises: CI runs the checks, the README's tests, the benches."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted(p.name for p in (REPO / "bench").glob("bench_*.py"))


def _recipe(name: str) -> str:
    text = (REPO / "justfile").read_text()
    match = re.search(rf"^{re.escape(name)}:.*\n((?:[ \t]+.*\n?)+)", text, re.MULTILINE)
    assert match, f"no recipe {name!r} in the justfile"
    return match.group(1)


def test_every_bench_is_in_both_recipes_and_has_a_smoke_mode() -> None:
    assert BENCHES
    for recipe in ("bench", "bench-smoke"):
        listed = sorted(set(re.findall(r"bench/(bench_\w+\.py)", _recipe(recipe))))
        assert listed == BENCHES, recipe
    assert all("BENCH_SMOKE=1" in line for line in _recipe("bench-smoke").strip().splitlines())
    for name in BENCHES:
        assert 'os.environ.get("BENCH_SMOKE"' in (REPO / "bench" / name).read_text(), name


def test_ci_runs_the_checks_then_the_readme_tests_then_the_bench_smoke() -> None:
    readme = (REPO / "README.md").read_text()
    command = "python3 -m pip install -e '.[dev]' && python3 -m pytest -n auto --dist worksteal"
    assert command in readme
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert lines.index("just check") < lines.index(command) < lines.index("just bench-smoke")


def test_no_merge_conflict_markers_in_tracked_files() -> None:
    """A conflict left inside a docstring still parses, so no other check would notice it (one
    sat in the fake API's docstring for a session)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    marker = re.compile(rb"^(<{7}|>{7})( |$)", re.MULTILINE)
    found = [
        name.decode()
        for name in tracked
        if name
        and (path := REPO / name.decode()).is_file()
        and path.suffix in {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg"}
        and marker.search(path.read_bytes())
    ]
    assert found == []
