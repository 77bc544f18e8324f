"""The host side of a sliced injection: the node makes each allocation's work directory before
Allocate answers, and removes it when the allocation is released. No event loop needed."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.deviceplugin import errors
from agent.deviceplugin.holdings import LiveContainer
from agent.deviceplugin.injection import Injection
from agent.deviceplugin.node import Node
from agent.deviceplugin.settings import DevicePluginSettings
from bus import devices, events


def _node(tmp_path: Path, **kw: object) -> tuple[Node, list[events.Event]]:
    published: list[events.Event] = []
    settings = DevicePluginSettings.for_tests(str(tmp_path), release_grace_s=0.0, **kw)
    return Node(settings, publish=published.append), published


def _tokens(groups: Sequence[devices.DeviceGroup], card: int, *indexes: int) -> list[str]:
    return [f"nvidia-h200:{groups[0].accelerators[card].id}:{i:04d}" for i in indexes]


def _vgpu(injection: Injection) -> Path:
    return Path(next(m.host_path for m in injection.mounts if m.container_path == "/tmp/vgpu"))


def test_allocate_makes_a_writable_work_directory_and_release_removes_it(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    node, _ = _node(tmp_path)
    node.update(h200)
    ids = _tokens(h200, 0, 0, 1)

    injection = node.allocate(("nvidia", "sliced"), ids)
    vgpu = _vgpu(injection)
    (vgpu / "cudevshr.cache").write_bytes(b"usage")

    assert vgpu.is_dir() and vgpu.is_relative_to(tmp_path / "pods")
    assert stat.S_IMODE(vgpu.stat().st_mode) == 0o777
    assert node.allocate(("nvidia", "sliced"), ids) == injection  # a retry: same directory
    assert (vgpu / "cudevshr.cache").read_bytes() == b"usage"

    node.reconcile([])  # kubelet lists no container holding it any more

    assert not node.ledger.holdings()
    assert os.listdir(tmp_path / "pods") == []


def test_other_allocations_keep_their_directories_when_one_is_released(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    node, _ = _node(tmp_path)
    node.update(h200)
    first = _vgpu(node.allocate(("nvidia", "sliced"), _tokens(h200, 0, 0)))
    second = _vgpu(node.allocate(("nvidia", "sliced"), _tokens(h200, 0, 1)))
    live = LiveContainer(
        namespace="ns",
        pod="p",
        container="c",
        resource="nvidia.com/gpu.sliced",
        device_ids=tuple(_tokens(h200, 0, 1)),
    )

    node.reconcile([live])

    assert not first.exists() and second.is_dir()


def test_a_work_directory_that_cannot_be_made_refuses_and_charges_nothing(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    (tmp_path / "pods").write_text("a file where the directory should be")
    node, published = _node(tmp_path)
    node.update(h200)

    with pytest.raises(errors.CannotInject, match="cannot create the work directory"):
        node.allocate(("nvidia", "sliced"), _tokens(h200, 0, 0))

    assert not node.ledger.holdings() and published == []


def test_exclusive_allocations_touch_no_directory(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    node, _ = _node(tmp_path)
    node.update(h200)

    node.allocate(("nvidia", "exclusive"), _tokens(h200, 3, 0))

    assert not (tmp_path / "pods").exists()
