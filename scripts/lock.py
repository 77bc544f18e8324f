"""Print the image's pinned runtime dependencies (``deploy/requirements.lock``).

Usage: ``python scripts/lock.py > deploy/requirements.lock``, in an environment where the
project is installed (``pip install -e .``), on Linux with Python 3.11 like the image.

The roots are ``[project].dependencies`` of ``pyproject.toml`` (not the installed metadata, which
an editable install may have frozen before a dependency was added); the closure follows the
installed distributions. Extras are not followed (the image installs none); environment markers
are evaluated for this interpreter. A test checks that the committed lock names exactly this set.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path
from typing import Final

from packaging.requirements import Requirement  # installed with the dev extra (pytest needs it)

__all__ = ["LockError", "lock_lines"]

HEADER: Final = "# The image's runtime dependencies, pinned: python scripts/lock.py\n"


class LockError(Exception):
    """A runtime dependency is not installed in this environment."""


def lock_lines(pyproject: Path = Path("pyproject.toml")) -> list[str]:
    """``name==version`` of every installed runtime dependency of the project, transitively.

    :raises LockError: a dependency is not installed here.
    """
    roots = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pending = [_req_name(r) for r in roots if _applies(r)]
    found: dict[str, str] = {}
    while pending:
        name = _canonical(pending.pop())
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError as e:
            raise LockError(f"{name} is not installed; install the project first") from e
        found[name] = dist.version
        pending.extend(_req_name(r) for r in dist.requires or [] if _applies(r))
    return [f"{n}=={v}" for n, v in sorted(found.items())]


def _req_name(requirement: str) -> str:
    return re.split(r"[\s;\[<>=!~(]", requirement, maxsplit=1)[0]


def _applies(requirement: str) -> bool:
    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate({"extra": ""})


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str]) -> int:
    if argv:
        sys.stderr.write("usage: lock.py > deploy/requirements.lock\n")
        return 2
    try:
        lines = lock_lines()
    except LockError as e:
        sys.stderr.write(f"lock: {e}\n")
        return 1
    sys.stdout.write(HEADER + "".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
