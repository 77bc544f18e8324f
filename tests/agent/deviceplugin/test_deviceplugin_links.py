"""What the node talks to, given at construction (:class:`Links`): the Allocate listener, the
kubelet view asked before an Allocate, the CDI catalog. Driven on a real :class:`Node` with
simulated H200s."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.deviceplugin import cdi, errors
from agent.deviceplugin.claims import KubeletKey
from agent.deviceplugin.node import Links, Node
from agent.deviceplugin.settings import DevicePluginSettings
from bus import devices
from bus.records import PendingContainer

KEY = ("nvidia", "exclusive")
ADMITTING = {("ns", "s", "main"): frozenset[str]()}


class Told:
    def __init__(self, answers: list[Mapping[KubeletKey, frozenset[str]] | None]) -> None:
        self.allocations = 0
        self.asked = 0
        self._answers = answers

    def allocated(self) -> None:
        self.allocations += 1

    async def containers(self) -> Mapping[KubeletKey, frozenset[str]] | None:
        self.asked += 1
        return self._answers.pop(0)


def claim() -> PendingContainer:
    return PendingContainer(
        pod_uid="uid-s", namespace="ns", pod="s", container="main", resource="nvidia.com/gpu",
        count=1, units=0, created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip


def node(tmp_path: Path, groups: list[devices.DeviceGroup], told: Told, pending: list[PendingContainer],
         **kw: object) -> Node:  # fmt: skip
    settings = DevicePluginSettings.for_tests(str(tmp_path), **kw)
    links = Links(kubelet=told, listener=told)
    n = Node(settings, publish=lambda e: None, pending_containers=lambda: pending, links=links)
    n.update(groups)
    return n


def test_the_listener_hears_every_allocate_that_went_through_and_no_refused_one(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    told = Told([])
    n = node(tmp_path, h200, told, [], nvidia_injection="cdi-annotations")
    first = min(t.id for t in n.offers.servicers[KEY].spec.tokens)
    with pytest.raises(errors.CannotInject):  # no CDI device known yet: refused
        n.allocate(KEY, [first])
    assert told.allocations == 0
    card = n.offers.view(KEY).tokens[first].card
    n.injector.use_cdi(cdi.Catalog(frozenset({f"nvidia.com/gpu={card}"})))
    n.allocate(KEY, [first])
    n.allocate(KEY, [first])  # kubelet's retry: the same answer, heard again
    assert told.allocations == 2 and n.injector.cdi_catalog.names == {f"nvidia.com/gpu={card}"}


@pytest.mark.anyio
async def test_kubelet_is_asked_only_when_a_pending_container_could_be_the_one(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    pending: list[PendingContainer] = []
    told = Told([ADMITTING, None])
    n = node(tmp_path, h200, told, pending)
    await n.ask_kubelet_first()
    assert told.asked == 0  # nobody pending: nothing kubelet could name
    pending.append(claim())
    await n.ask_kubelet_first()
    assert told.asked == 1 and n.claims.waiting_for("nvidia.com/gpu") == {("uid-s", "main")}
    await n.ask_kubelet_first()  # kubelet did not answer: the last view stays
    assert told.asked == 2 and n.claims.waiting_for("nvidia.com/gpu") == {("uid-s", "main")}
    assert n.claims.identified("nvidia.com/gpu", 1) == claim()
