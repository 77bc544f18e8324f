"""The injection side on its own (:class:`injecting.Injector`): driver steps through their
controls or a refusal, the host side prepared or cleaned up, and the ledger only ever read.

The views, claims and ledger are a real node's (Ascend 910B cards, whose shared and sliced grants
need a ``ascend-container-share`` step and whose sliced grants write a work directory); the
injector under test is built over them, so it is the only thing that injects here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vendor_groups import group, token

from agent.deviceplugin import allocation, errors
from agent.deviceplugin.injecting import DriverControl, Injector
from agent.deviceplugin.injection import DriverStep, Injection
from agent.deviceplugin.node import Node
from agent.deviceplugin.server import Key
from agent.deviceplugin.settings import DevicePluginSettings
from agent.deviceplugin.vendors.ascend import CONFIG, CONTAINER_SHARE

A910B = group(
    "ascend", "ascend-910b2", cards=4, memory=65536, cores=24, family="910b",
    runtime_version="8.2", physical=lambda i: (7 - i,),
)  # fmt: skip
SLICED: Key = ("ascend", "sliced")
VISIBILITY: Key = ("ascend", "visibility")


def _setup(tmp_path: Path, controls: dict[str, DriverControl]) -> tuple[Node, Injector]:
    settings = DevicePluginSettings.for_tests(str(tmp_path))
    node = Node(settings, publish=lambda e: None)
    node.update([A910B])
    return node, Injector(settings, node.claims, node.ledger, controls=controls)


def _sliced(node: Node) -> tuple[allocation.View, list[str], allocation.Grant]:
    view = node.offers.view(SLICED)
    ids = [token(A910B, 2, 5)]  # card #2, physical id 5
    return view, ids, allocation.decide(view, ids, node.ledger, now=0.0)


def _work_dirs(tmp_path: Path) -> list[str]:
    pods = tmp_path / "pods"
    return sorted(os.listdir(pods)) if pods.exists() else []


def _config(injection: Injection) -> Path:
    return Path(next(m.host_path for m in injection.mounts if m.container_path == CONFIG))


def test_a_step_with_no_control_refuses_and_the_steps_after_it_are_not_performed(
    tmp_path: Path,
) -> None:
    done: list[DriverStep] = []
    _, injector = _setup(tmp_path, {"first": done.append, "third": done.append})
    steps = [
        DriverStep("first", "card-0"),
        DriverStep("second", "card-1", (("quota", "25"),)),
        DriverStep("third", "card-2"),
    ]

    with pytest.raises(errors.CannotInject, match=r"second on card-1 \(quota=25\).*no driver"):
        injector.perform(steps)
    assert done == steps[:1]

    injector.perform([steps[2], steps[0]])  # those with controls: every one, in order
    assert done == [steps[0], steps[2], steps[0]]


def test_a_failing_control_stops_the_steps_after_it(tmp_path: Path) -> None:
    done: list[DriverStep] = []

    def refuse(step: DriverStep) -> None:
        raise errors.ActuationFailed(f"the driver refused {step.describe()}")

    _, injector = _setup(tmp_path, {"ok": done.append, "no": refuse})
    with pytest.raises(errors.ActuationFailed, match="refused no on card-1"):
        injector.perform([DriverStep("ok", "card-0"), DriverStep("no", "card-1"),
                          DriverStep("ok", "card-2")])  # fmt: skip
    assert done == [DriverStep("ok", "card-0")]


def test_a_refused_step_removes_a_new_allocations_work_directory_but_not_a_held_ones(
    tmp_path: Path,
) -> None:
    node, refusing = _setup(tmp_path, {})
    view, ids, grant = _sliced(node)
    assert grant.holding is not None

    with pytest.raises(errors.CannotInject, match=CONTAINER_SHARE):
        refusing.inject(SLICED, view, ids, grant, node.offers.cards)
    assert _work_dirs(tmp_path) == []  # made, then removed again: nothing left on the host
    assert node.ledger.holdings() == ()

    node.ledger.charge(grant.holding)  # the same allocation, held now (a kubelet retry)
    with pytest.raises(errors.CannotInject, match=CONTAINER_SHARE):
        refusing.inject(SLICED, view, ids, grant, node.offers.cards)
    assert len(_work_dirs(tmp_path)) == 1  # a held allocation keeps its own directory


def test_a_performed_step_writes_the_files_and_leaves_the_ledger_to_the_node(
    tmp_path: Path,
) -> None:
    done: list[DriverStep] = []
    node, injector = _setup(tmp_path, {CONTAINER_SHARE: done.append})
    view, ids, grant = _sliced(node)

    got = injector.inject(SLICED, view, ids, grant, node.offers.cards)

    assert done == [DriverStep(CONTAINER_SHARE, A910B.accelerators[2].id, (("physical-id", "5"),))]
    assert got.envs["ASCEND_VISIBLE_DEVICES"] == "5"
    assert "physical-npu-id=5\nvnpu-id=5\n" in _config(got).read_text()
    assert len(_work_dirs(tmp_path)) == 1
    assert node.ledger.holdings() == ()  # charging is the node's, after inject returned


def test_a_visibility_grant_no_pending_container_asks_for_touches_nothing(
    tmp_path: Path,
) -> None:
    done: list[DriverStep] = []
    node, injector = _setup(tmp_path, {CONTAINER_SHARE: done.append})
    view = node.offers.view(VISIBILITY)
    ids = [token(A910B, 0, 9)]
    grant = allocation.decide(view, ids, node.ledger, now=0.0)

    with pytest.raises(errors.Conflict, match="only mirrors its Pod's owner"):
        injector.inject(VISIBILITY, view, ids, grant, node.offers.cards)
    assert done == [] and _work_dirs(tmp_path) == []
