"""The health state machine, without an event loop or a clock: the caller passes ``now``."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.serve import health
from agent.serve.metrics import AgentMetrics
from agent.serve.observing import Observer, keep_failed
from agent.serve.settings import ServeSettings
from bus import devices, events
from bus.settings import BusSettings

Q = 60.0


def _book() -> health.HealthBook:
    return health.HealthBook(quarantine_s=Q)


def _sample(
    *ids: str, lost: tuple[str, ...] = (), manufacturer: str = "nvidia"
) -> devices.MonitorSample:
    accelerators = tuple(
        devices.AcceleratorSample(id=i, unhealthy=i in lost) for i in (*ids, *lost)
    )
    return devices.MonitorSample(
        manufacturer=manufacturer, timestamp="t", accelerators=accelerators
    )


def _group(
    *ids: str, manufacturer: str = "nvidia", gid: str = "nvidia-h200"
) -> devices.DeviceGroup:
    return devices.DeviceGroup(
        id=gid,
        manufacturer=manufacturer,
        name="NVIDIA H200",
        accelerators=tuple(
            devices.Accelerator(
                id=i, index=int(i[-1]), status=devices.AcceleratorStatus(unhealthy=False)
            )
            for i in ids
        ),
    )


@pytest.mark.parametrize("xid", sorted(health.IGNORED_XIDS))
def test_application_xids_are_ignored(xid: int) -> None:
    book = _book()

    assert book.xid("GPU-0", xid, now=0.0) is None
    assert not book.unhealthy("GPU-0")


def test_the_xid_table_matches_nvidia_plugin_and_catalog() -> None:
    assert health.IGNORED_XIDS == {13, 31, 43, 45, 68, 109}
    assert {48, 63, 64, 74, 79, 95, 119, 120} <= health.RESET_XIDS
    assert health.classify_xid(94) is health.Verdict.TRANSIENT  # catalog: RESTART_APP
    assert health.classify_xid(62) is health.Verdict.TRANSIENT
    assert not health.IGNORED_XIDS & health.RESET_XIDS


def test_transient_xid_recovers_only_after_the_quarantine_and_a_normal_answer() -> None:
    book = _book()

    down = book.xid("GPU-0", 62, now=0.0)
    early = book.answered("GPU-0", now=Q - 1)
    back = book.answered("GPU-0", now=Q)

    assert down == health.Transition("GPU-0", False, "XID", "XID 62: XID critical error", xid=62)
    assert early is None
    assert back is not None and back.healthy and back.reason == "RECOVERED"
    assert not book.unhealthy("GPU-0")


def test_a_new_xid_restarts_the_quarantine_without_repeating_the_transition() -> None:
    book = _book()
    book.xid("GPU-0", 62, now=0.0)

    again = book.xid("GPU-0", 62, now=50.0)

    assert again is None
    assert book.answered("GPU-0", now=Q + 1) is None
    assert book.answered("GPU-0", now=50.0 + Q) is not None


@pytest.mark.parametrize("xid", [48, 79, 95, 119])
def test_reset_required_xids_stay_down(xid: int) -> None:
    book = _book()

    down = book.xid("GPU-0", xid, now=0.0)

    assert down is not None and "reset required" in down.message
    assert book.answered("GPU-0", now=1e9) is None
    assert book.unhealthy("GPU-0")


def test_a_transient_card_is_condemned_by_a_later_reset_xid() -> None:
    book = _book()
    book.xid("GPU-0", 62, now=0.0)

    assert book.xid("GPU-0", 79, now=1.0) is None
    assert book.answered("GPU-0", now=1e9) is None


def test_lost_and_vanished_cards_go_down_and_come_back_when_answering() -> None:
    book = _book()
    expected = {"nvidia": {"GPU-0", "GPU-1", "GPU-2"}}

    first = book.observe(expected, [_sample("GPU-0", lost=("GPU-1",))], (), now=0.0)
    repeat = book.observe(expected, [_sample("GPU-0", lost=("GPU-1",))], (), now=1.0)
    still = book.observe(expected, [_sample("GPU-0", "GPU-1", "GPU-2")], (), now=Q - 0.5)
    back = book.observe(expected, [_sample("GPU-0", "GPU-1", "GPU-2")], (), now=Q + 1.5)

    assert [(t.accelerator_id, t.healthy, t.reason) for t in first] == [
        ("GPU-1", False, "LOST"),
        ("GPU-2", False, "LOST"),
    ]
    assert repeat == []
    assert still == []  # answering again, but the quarantine (restarted at t=1) is not over
    assert {(t.accelerator_id, t.healthy, t.reason) for t in back} == {
        ("GPU-1", True, "RECOVERED"),
        ("GPU-2", True, "RECOVERED"),
    }


def test_a_failed_pass_says_nothing_about_its_cards() -> None:
    book = _book()

    changes = book.observe({"amd": {"A"}, "nvidia": {"N"}}, [], ["amd", "nvidia"], now=0.0)

    assert changes == []


def test_a_whole_manufacturer_gone_marks_every_card_lost() -> None:
    book = _book()

    changes = book.observe({"amd": {"A0", "A1"}}, [], (), now=0.0)

    assert [(t.accelerator_id, t.reason) for t in changes] == [("A0", "LOST"), ("A1", "LOST")]


def test_overlay_marks_unhealthy_and_keeps_vanished_cards() -> None:
    book = _book()
    book.xid("GPU-0", 79, now=0.0)
    book.lost("GPU-1", 0.0, "gone")
    previous = [_group("GPU-0", "GPU-1", "GPU-2")]
    detected = [_group("GPU-0", "GPU-2")]

    published = health.overlay(book, detected, previous)

    status = {a.id: a.status.unhealthy for g in published for a in g.accelerators}
    assert status == {"GPU-0": True, "GPU-1": True, "GPU-2": False}
    assert [a.id for a in published[0].accelerators] == ["GPU-0", "GPU-1", "GPU-2"]


def test_overlay_drops_a_vanished_card_that_is_healthy_again() -> None:
    book = _book()

    published = health.overlay(book, [_group("GPU-0")], [_group("GPU-0", "GPU-1")])

    assert [a.id for g in published for a in g.accelerators] == ["GPU-0"]


def test_overlay_samples_reflects_the_book() -> None:
    book = _book()
    book.xid("GPU-0", 48, now=0.0)

    (sample,) = health.overlay_samples(book, [_sample("GPU-0", "GPU-1")])

    assert [(a.id, a.unhealthy) for a in sample.accelerators] == [
        ("GPU-0", True),
        ("GPU-1", False),
    ]


def test_transition_becomes_a_health_event() -> None:
    change = health.Transition("GPU-0", False, "XID", "XID 79: off the bus", xid=79)

    event = change.event("node-1")

    assert (event.node, event.accelerator_id, event.healthy, event.xid) == (
        "node-1",
        "GPU-0",
        False,
        79,
    )


def test_keep_failed_carries_the_failed_manufacturers_groups() -> None:
    amd = _group("A0", manufacturer="amd", gid="radeon")
    nvidia_now = _group("GPU-0", "GPU-1")

    merged = keep_failed([nvidia_now], [amd, _group("GPU-0")], {"amd"})

    assert merged == [amd, nvidia_now]


def test_republish_sends_the_whole_state_of_the_node(tmp_path: Path) -> None:
    """After a reconnect the server may have lost everything: devices once detected, every card
    that is down now (healthy ones need no event), and the agent record go out again."""
    sent: list[events.Event] = []
    settings = ServeSettings.for_tests(str(tmp_path), bus=BusSettings(), node_name="n1")
    observer = Observer(settings, [], sent.append, AgentMetrics(CollectorRegistry()))
    observer.republish()
    assert [events.kind_of(e) for e in sent] == ["agent"]  # nothing detected yet
    observer.passes, observer.published = 1, [_group("GPU-0", "GPU-1")]
    assert observer.book.xid("GPU-1", 79, now=0.0) is not None
    sent.clear()
    observer.republish()
    assert [events.kind_of(e) for e in sent] == ["devices", "health", "agent"]
    devices_event, down, _ = sent
    assert isinstance(devices_event, events.DevicesEvent)
    assert devices_event.groups == (_group("GPU-0", "GPU-1"),)
    assert isinstance(down, events.HealthEvent)
    assert (down.node, down.accelerator_id, down.healthy, down.xid) == ("n1", "GPU-1", False, 79)
