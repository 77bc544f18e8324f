"""kit.files.unique_file: the temporary file of an atomic write, made without :mod:`tempfile`."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kit import files


def test_each_call_creates_a_new_private_file(tmp_path: Path) -> None:
    made = [files.unique_file(tmp_path, ".x.", ".tmp") for _ in range(50)]
    for fd, _ in made:
        os.close(fd)
    names = {name for _, name in made}
    assert len(names) == 50
    for name in names:
        assert Path(name).parent == tmp_path
        assert Path(name).name.startswith(".x.") and name.endswith(".tmp")
        assert stat.S_IMODE(os.stat(name).st_mode) == 0o600


def test_a_name_taken_already_is_drawn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".x.000000000000.tmp").write_bytes(b"someone else's")
    draws = iter([b"\0" * 6, b"\1" * 6])
    monkeypatch.setattr(os, "urandom", lambda n: next(draws))
    fd, name = files.unique_file(tmp_path, ".x.", ".tmp")
    os.close(fd)
    assert name == str(tmp_path / ".x.010101010101.tmp")
    assert (tmp_path / ".x.000000000000.tmp").read_bytes() == b"someone else's"


def test_a_symlink_in_the_way_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / ".x.000000000000.tmp").symlink_to(target)
    draws = iter([b"\0" * 6, b"\2" * 6])
    monkeypatch.setattr(os, "urandom", lambda n: next(draws))
    fd, name = files.unique_file(tmp_path, ".x.", ".tmp")
    os.close(fd)
    assert name.endswith(".x.020202020202.tmp")
    assert not target.exists()


def test_write_atomically_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "layout"
    path.write_bytes(b"old")
    files.write_atomically(path, b"new", mode=0o640)
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["layout"]
