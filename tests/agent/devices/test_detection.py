"""The pass orchestration: failure isolation between manufacturers, fast-failed, timestamps."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

import pytest

from agent.devices import detection
from agent.errors import AgentError, DetectionError, HostReadError
from bus import devices


def _group(manufacturer: str, index: int, name: str = "Card") -> devices.DeviceGroup:
    accelerator = devices.Accelerator(
        id=f"GPU-{manufacturer}-{index}",
        index=index,
        status=devices.AcceleratorStatus(unhealthy=False),
    )
    return devices.DeviceGroup(
        id=devices.group_id(manufacturer, name),
        manufacturer=manufacturer,
        name=name,
        accelerators=(accelerator,),
    )


@dataclass
class FakeBackend:
    manufacturer: str
    passes: list[list[devices.DeviceGroup] | AgentError]
    simulated: bool = False
    calls: int = 0
    samples: list[devices.AcceleratorSample] = field(default_factory=list)

    def detect(self) -> list[devices.DeviceGroup]:
        outcome = self.passes[min(self.calls, len(self.passes) - 1)]
        self.calls += 1
        if isinstance(outcome, AgentError):
            raise outcome
        return outcome

    def sample(self) -> list[devices.AcceleratorSample]:
        if self.samples == [] and self.passes and isinstance(self.passes[0], AgentError):
            raise self.passes[0]
        return self.samples


def test_one_manufacturer_failing_keeps_the_others_cards() -> None:
    nvidia = FakeBackend("nvidia", [DetectionError("nvidia", "NVML failed")])
    amd = FakeBackend("amd", [[_group("amd", 0)]])
    result = detection.detect([amd, nvidia])
    assert [g.manufacturer for g in result.items] == ["amd"]
    assert [str(e) for e in result.errors] == ["nvidia: NVML failed"]


def test_a_host_that_cannot_be_read_fails_that_manufacturer_only() -> None:
    unreadable = HostReadError("cannot list /sys/bus/pci/devices: Permission denied")
    nvidia = FakeBackend("nvidia", [unreadable])
    amd = FakeBackend("amd", [[_group("amd", 0)]])
    result = detection.detect([amd, nvidia], fast_failed=False)
    assert [g.manufacturer for g in result.items] == ["amd"]
    assert [str(e) for e in result.errors] == [f"nvidia: {unreadable}"]
    sampled = detection.sample([nvidia])
    assert sampled.items == [] and [e.manufacturer for e in sampled.errors] == ["nvidia"]


def test_groups_come_out_in_canonical_order() -> None:
    nvidia = FakeBackend("nvidia", [[_group("nvidia", 1, "B"), _group("nvidia", 0, "A")]])
    amd = FakeBackend("amd", [[_group("amd", 0)]])
    result = detection.detect([nvidia, amd])
    assert [(g.manufacturer, g.name) for g in result.items] == [
        ("amd", "Card"),
        ("nvidia", "A"),
        ("nvidia", "B"),
    ]


def test_fast_failed_detects_again_when_one_manufacturer_found_nothing() -> None:
    sleeps: list[float] = []
    backend = FakeBackend("nvidia", [[], [], [_group("nvidia", 0)]])
    result = detection.detect([backend], retries=2, retry_delay_s=0.5, sleep=sleeps.append)
    assert backend.calls == 3
    assert sleeps == [0.5, 0.5]
    assert len(result.items) == 1


def test_fast_failed_gives_up_after_the_retries() -> None:
    backend = FakeBackend("nvidia", [[]])
    result = detection.detect([backend], retries=2, sleep=lambda _: None)
    assert backend.calls == 3 and result.items == []


def test_no_fast_failed_publishes_the_first_empty_pass() -> None:
    backend = FakeBackend("nvidia", [[], [_group("nvidia", 0)]])
    result = detection.detect([backend], fast_failed=False, sleep=pytest.fail)
    assert backend.calls == 1 and result.items == []


def test_fast_failed_applies_only_to_exactly_one_manufacturer() -> None:
    a, b = FakeBackend("amd", [[]]), FakeBackend("nvidia", [[]])
    detection.detect([a, b], sleep=pytest.fail)
    assert (a.calls, b.calls) == (1, 1)


def test_sample_skips_manufacturers_without_cards_and_carries_the_simulated_mark() -> None:
    reading = devices.AcceleratorSample(id="GPU-1", memory=10, unhealthy=False)
    amd = FakeBackend("amd", [[]], simulated=True, samples=[reading])
    nvidia = FakeBackend("nvidia", [[]])
    now = datetime(2026, 8, 29, 0, 1, 43, 565038, tzinfo=UTC)
    result = detection.sample([amd, nvidia], now=now)
    assert len(result.items) == 1
    sample = result.items[0]
    assert sample.manufacturer == "amd" and sample.simulated is True
    assert sample.accelerators == (reading,)


def test_sample_failure_is_reported_not_raised() -> None:
    nvidia = FakeBackend("nvidia", [DetectionError("nvidia", "lost")])
    result = detection.sample([nvidia])
    assert result.items == [] and len(result.errors) == 1


def test_rfc3339_nano_uses_the_local_offset_and_trims_zeros() -> None:
    plus8 = timezone(timedelta(hours=8))
    moment = datetime(2026, 8, 29, 8, 1, 43, 565038, tzinfo=plus8)
    text = detection.rfc3339_nano(moment.astimezone(plus8))
    # astimezone() inside converts to the machine's zone; compare instants, not text.
    parsed = datetime.fromisoformat(text)
    assert parsed == moment
    assert text.split(".")[1].rstrip("Z").split("+")[0].split("-")[0] == "565038"


def test_rfc3339_nano_of_now_has_nanosecond_precision() -> None:
    text = detection.rfc3339_nano()
    fraction = text.split(".")[1]
    digits = "".join(ch for ch in fraction if ch.isdigit())[:9]
    assert 1 <= len(digits) <= 9
    assert text[10] == "T"
