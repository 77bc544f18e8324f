"""NVIDIA's device channel: the env var, CDI annotations checked against the node's specs, or auto.

Specs are real files in a temporary CDI root, in the shapes ``nvidia-ctk cdi generate`` writes
(YAML) and the JSON the CDI format also allows; the node is driven directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.deviceplugin import cdi, errors
from agent.deviceplugin.injection import Injection
from agent.deviceplugin.node import Node
from agent.deviceplugin.running import device_plugins
from agent.deviceplugin.settings import DevicePluginSettings
from bus import devices, events
from gpustack_operator.main import main

UUID0 = "GPU-0000"
ENV = {"NVIDIA_VISIBLE_DEVICES": f"{UUID0},GPU-0001"}

NVIDIA_CTK_YAML = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: GPU-0000
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: all
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}, {path: /dev/nvidia1}]}
containerEdits: {env: [NVIDIA_VISIBLE_DEVICES=void]}
"""


def catalog_in(tmp_path: Path) -> tuple[cdi.Catalog, list[str]]:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text(NVIDIA_CTK_YAML)
    (run / "more.json").write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
                                               "devices": [{"name": "1"}]}))  # fmt: skip
    (run / "broken.yaml").write_text("kind: [unclosed")
    (run / "notes.txt").write_text("kind: nvidia.com/gpu")
    dirs = [str(etc), str(run), str(tmp_path / "absent")]
    return cdi.read_catalog(dirs), dirs


def test_the_catalog_holds_every_name_the_specs_define(tmp_path: Path) -> None:
    catalog, _ = catalog_in(tmp_path)
    assert catalog.names == {"nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0000",
                             "nvidia.com/gpu=all", "nvidia.com/gpu=1"}  # fmt: skip


def test_a_spec_that_is_no_regular_file_is_skipped_not_read(tmp_path: Path) -> None:
    """A FIFO named like a spec (the old reader blocked on its open for ever) and a device
    (``/dev/zero`` read to the end) are skipped; the real spec beside them still counts."""
    import os

    root = tmp_path / "cdi"
    root.mkdir()
    (root / "nvidia.yaml").write_text(NVIDIA_CTK_YAML)
    os.mkfifo(root / "fifo.yaml")
    (root / "zero.json").symlink_to("/dev/zero")
    assert cdi.read_catalog([str(root)]).names == {
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=GPU-0000",
        "nvidia.com/gpu=all",
    }


def test_cdi_names_each_card_by_uuid_else_index_and_drops_the_env_var(tmp_path: Path) -> None:
    catalog, _ = catalog_in(tmp_path)
    got = cdi.channel("cdi-annotations", Injection(envs=ENV), catalog,
                      [(UUID0, 0), ("GPU-0001", 1)])  # fmt: skip
    assert got.annotations == {cdi.ANNOTATION: "nvidia.com/gpu=GPU-0000,nvidia.com/gpu=1"}
    assert "NVIDIA_VISIBLE_DEVICES" not in got.envs
    assert cdi.channel("auto", Injection(envs=ENV), catalog, [(UUID0, 0)]).annotations


def test_auto_keeps_the_env_var_where_a_name_would_not_resolve(tmp_path: Path) -> None:
    catalog, _ = catalog_in(tmp_path)
    unknown = [(UUID0, 0), ("GPU-0007", 7)]
    assert cdi.channel("auto", Injection(envs=ENV), catalog, unknown) == Injection(envs=ENV)
    assert cdi.channel("envvar", Injection(envs=ENV), catalog, [(UUID0, 0)]) == Injection(envs=ENV)
    with pytest.raises(errors.CannotInject, match="unresolvable CDI devices .*nvidia-ctk"):
        cdi.channel("cdi-annotations", Injection(envs=ENV), catalog, unknown)


def test_an_allocate_answers_with_the_annotation_or_refuses_and_charges_nothing(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    published: list[events.Event] = []
    settings = DevicePluginSettings.for_tests(str(tmp_path), nvidia_injection="cdi-annotations")
    node = Node(settings, publish=published.append)
    node.update(h200)
    view = node.offers.view(("nvidia", "exclusive"))
    by_index = sorted(view.tokens.values(), key=lambda t: view.cards[t.card].index)
    first, second = by_index[0], by_index[1]
    node.injector.use_cdi(cdi.Catalog(frozenset({f"nvidia.com/gpu={first.card}"})))
    got = node.allocate(("nvidia", "exclusive"), [first.id])
    assert got.annotations == {cdi.ANNOTATION: f"nvidia.com/gpu={first.card}"}
    assert "NVIDIA_VISIBLE_DEVICES" not in got.envs
    with pytest.raises(errors.CannotInject, match="unresolvable CDI devices"):
        node.allocate(("nvidia", "exclusive"), [second.id])
    assert [h.device_ids for h in node.ledger.holdings()] == [(first.id,)]


def test_an_unknown_strategy_exits_2_at_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUSTACK_NVIDIA_DEVICE_INJECTION_STRATEGY", "cdi")
    assert main(["dm", "serve"]) == 2
    assert "nvidia-device-injection-strategy" in capsys.readouterr().err


@pytest.mark.anyio
async def test_the_plugins_read_the_specs_when_cdi_may_be_used(tmp_path: Path) -> None:
    _, dirs = catalog_in(tmp_path)
    for strategy, expected in (("auto", True), ("envvar", False)):
        settings = DevicePluginSettings.for_tests(
            str(tmp_path), nvidia_injection=strategy, cdi_spec_dirs=tuple(dirs)
        )
        async with device_plugins(settings, publish=lambda event: None) as plugins:
            known = "nvidia.com/gpu=all" in plugins.cdi_catalog().names
        assert known is expected
