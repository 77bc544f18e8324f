"""klog-shaped logging: header shape, verbosity, vmodule, backtraces, stderr only."""

from __future__ import annotations

import inspect
import json
import logging
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from gpustack_operator import logs


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_header_shape_and_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.LogSettings())
    logging.getLogger("agent.x").warning("card %d lost", 3)
    out, err = capsys.readouterr()
    assert out == ""
    assert re.fullmatch(r"W\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ test_logs\.py:\d+\] card 3 lost\n", err)


def test_skip_headers(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.LogSettings(skip_headers=True))
    logging.getLogger("agent.x").info("plain")
    assert capsys.readouterr().err == "plain\n"


def test_add_dir_header_shows_the_path(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.LogSettings(add_dir_header=True))
    logging.getLogger("agent.x").info("where")
    assert "/tests/gpustack_operator/test_logs.py:" in capsys.readouterr().err


def test_verbosity_levels(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.LogSettings(verbosity=0))
    log = logging.getLogger("agent.x")
    log.debug("hidden at v0")
    log.info("shown at v0")
    logs.configure(logs.LogSettings(verbosity=2))
    log.debug("shown at v2")
    log.log(logs.V3, "hidden at v2")
    logs.configure(logs.LogSettings(verbosity=3))
    log.log(logs.V3, "shown at v3")
    err = capsys.readouterr().err
    assert "hidden" not in err
    assert err.count("shown") == 3


def test_vmodule_raises_one_file(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.LogSettings(vmodule=logs.parse_vmodule("test_l*=3")))
    logging.getLogger("agent.x").log(logs.V3, "decision")
    assert "decision" in capsys.readouterr().err
    logs.configure(logs.LogSettings(vmodule=logs.parse_vmodule("other=3")))
    logging.getLogger("agent.x").log(logs.V3, "decision")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("text", ["x", "a=", "=1", "a=b"])
def test_bad_vmodule(text: str) -> None:
    with pytest.raises(ValueError, match="--vmodule"):
        logs.parse_vmodule(text)


def test_backtrace_at(capsys: pytest.CaptureFixture[str]) -> None:
    def here() -> int:
        logging.getLogger("agent.x").info("marked")
        return here.__code__.co_firstlineno + 1

    line = here.__code__.co_firstlineno + 1
    logs.configure(logs.LogSettings(backtrace_at=logs.parse_backtrace_at(f"test_logs.py:{line}")))
    here()
    err = capsys.readouterr().err
    assert "marked" in err
    assert "in test_backtrace_at" in err
    assert "logging/__init__.py" not in err


def test_log_to_file_when_not_to_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logs.configure(logs.LogSettings(to_stderr=False))
    logging.getLogger("agent.x").info("to a file")
    for handler in logging.getLogger().handlers:
        handler.flush()
    assert capsys.readouterr().err == ""
    path = logs.log_file_path()
    assert path.startswith(str(tmp_path))
    assert any("to a file" in p.read_text() for p in tmp_path.iterdir())


def test_verbosity_applies_to_our_loggers_only(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.LogSettings(verbosity=2))
    logging.getLogger("hpack.hpack").debug("header dump")
    logging.getLogger("kubernetes_asyncio.client.rest").info("response body")
    logging.getLogger("agent.x").debug("ours at v2")
    logging.getLogger("aiohttp.client").warning("theirs at warning")
    err = capsys.readouterr().err
    assert "ours at v2" in err and "theirs at warning" in err
    assert "header dump" not in err and "response body" not in err


@pytest.mark.parametrize("vmodule", ["hpack*=2", "hpack=2", "hpack.hpack=2"])
def test_vmodule_names_a_third_party_logger(
    vmodule: str, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure(logs.LogSettings(verbosity=2, vmodule=logs.parse_vmodule(vmodule)))
    logging.getLogger("hpack.hpack").debug("header dump")
    logging.getLogger("h2.connection").debug("frame")
    logging.getLogger("agent.x").debug("ours at v2")
    err = capsys.readouterr().err
    assert "header dump" in err and "ours at v2" in err
    assert "frame" not in err


def _json_lines(err: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in err.splitlines()]


def test_json_format_has_kubernetes_fields(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.LogSettings(verbosity=3, logging_format="json"))
    log = logging.getLogger("agent.x")
    before = time.time()
    log.info("card %d found", 3, extra={"node": "n1", "card": {"index": 3}})
    log.debug("detail")
    log.log(logs.V3, "decision")
    line = inspect.currentframe().f_lineno  # type: ignore[union-attr]
    try:
        raise ValueError("bad value")
    except ValueError:
        log.exception("failed")
    info, debug, decision, error = _json_lines(capsys.readouterr().err)
    assert before <= info["ts"] <= time.time()  # type: ignore[operator]
    assert info["msg"] == "card 3 found" and info["v"] == 0
    assert info["node"] == "n1" and info["card"] == {"index": 3}
    assert info["caller"] == f"test_logs.py:{line - 3}"
    assert (debug["v"], decision["v"]) == (2, 3)
    assert error["msg"] == "failed" and "v" not in error
    assert error["err"] == "ValueError: bad value"
    assert "Traceback" in error["stacktrace"]  # type: ignore[operator]


def test_json_format_keeps_newlines_inside_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.LogSettings(logging_format="json"))
    logging.getLogger("bus.x").warning('two\nlines "quoted"', extra={"obj": object()})
    (entry,) = _json_lines(capsys.readouterr().err)
    assert entry["msg"] == 'two\nlines "quoted"' and entry["v"] == 0
    assert str(entry["obj"]).startswith("<object object")


def test_standalone_banner_is_one_entry_when_logs_are_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpustack_operator import standalone

    banner = "\ngpustack-operator standalone is running.\n  bus: nats://127.0.0.1:4222\n"
    logs.configure(logs.LogSettings(logging_format="json"))
    anyio.run(standalone._show, banner, None)
    (entry,) = _json_lines(capsys.readouterr().err)
    assert entry["msg"] == banner.strip("\n")
    logs.configure(logs.LogSettings())
    anyio.run(standalone._show, banner, None)
    assert capsys.readouterr().err == banner


def test_json_format_shows_an_unserializable_extra_as_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure(logs.LogSettings(logging_format="json"))
    looped: list[object] = []
    looped.append(looped)
    logging.getLogger("kit.x").info("odd", extra={"pairs": {(1, 2): "x"}, "looped": looped})
    (entry,) = _json_lines(capsys.readouterr().err)
    assert entry["msg"] == "odd"
    assert entry["pairs"] == "{(1, 2): 'x'}" and entry["looped"] == "[[...]]"
