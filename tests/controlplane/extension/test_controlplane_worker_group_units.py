"""The pure parts of ``worker.gpustack.ai/v1``: the progress of an artifact and the ledger's
bodies (standalone), which stay the same objects while nothing but a timestamp changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import msgspec
import pytest

from bus import events
from bus.devices import DeviceGroup
from controlplane.extension.workergroup import catalog
from controlplane.extension.workergroup.progress import progress
from controlplane.extension.workergroup.providers import InformerProvider, LedgerFeed
from controlplane.reconciling.nodestates import Ledger

DIGEST = "sha256:" + "cd" * 32
ARTIFACT = {"metadata": {"name": "m", "namespace": "t"},
            "status": {"resolved": {"manifestDigest": DIGEST, "sizeBytes": 1000}}}  # fmt: skip


def state(kind: str, done: int | None = None, reason: str | None = None) -> events.ModelState:
    return events.ModelState(model=DIGEST, digest=DIGEST, state=kind,  # type: ignore[arg-type]
                             bytes_done=done, bytes_total=1000, reason=reason)  # fmt: skip


def test_progress_counts_every_node_and_sums_at_most_max_live_downloads() -> None:
    nodes = [
        ("a", (state("downloading", 500),)), ("b", (state("downloading", 1000),)),
        ("c", (state("downloading", 0),)), ("d", (state("ready"),)),
        ("e", (state("failed", reason="AccessDenied"),)), ("f", (state("failed"),)),
        ("g", (state("evicting"),)), ("h", None),
    ]  # fmt: skip
    got = progress(ARTIFACT, nodes, now="2026-01-01T00:00:00Z", max_live=2)
    assert (got["ready"], got["downloading"], got["failed"]) == (1, 3, 2)
    assert (got["live"], got["downloadingBytes"]) == (2, 1500)  # a and b only
    assert got["downloadingPercent"] == 75  # mean of 50 and 100
    assert got["failureReasons"] == [{"reason": "AccessDenied", "count": 1},
                                     {"reason": "Unknown", "count": 1}]  # fmt: skip
    assert got["sizeBytes"] == 1000 and got["kind"] == "ModelArtifactProgress"


def test_progress_of_an_unresolved_artifact_is_zero() -> None:
    got = progress({"metadata": {"name": "m"}}, [("a", (state("ready"),))], now="x")
    assert (got["ready"], got["downloading"], got["live"]) == (0, 0, 0)
    assert "manifestDigest" not in got


def test_ledger_bodies_are_kept_while_only_timestamps_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=m) for m in range(100))
    monkeypatch.setattr(events, "now", lambda: next(clock))  # every computation stamps later
    groups = msgspec.json.decode(
        (Path(__file__).parents[1] / "controlplane_detect_h200x8.json").read_bytes(),
        type=tuple[DeviceGroup, ...],
    )
    ledger = Ledger()
    ledger.apply(events.DevicesEvent(node="n1", ts=datetime.now(UTC), groups=groups))
    ledger.apply(events.ModelsEvent(node="n1", ts=datetime.now(UTC), models=()))
    feed = LedgerFeed(ledger)
    feed.sync()
    first = {r: dict(h) for r, h in feed.held.items()}
    feed.sync()  # the NodeModelStore's conditions are stamped again: no change
    assert all(feed.held[r][n] is first[r][n] for r in first for n in first[r])
    assert set(first["devices"]) == {"n1"} and set(first["nodemodelstores"]) == {"n1"}
    assert first["instancetypes"] and first["instancetypeflavors"]
    assert all(b["apiVersion"] == catalog.GROUP_VERSION for h in first.values() for b in h.values())
    ledger.apply(events.DevicesEvent(node="n2", ts=datetime.now(UTC), groups=groups))
    feed.sync()
    assert set(feed.held["devices"]) == {"n1", "n2"}
    assert feed.held["devices"]["n1"] is first["devices"]["n1"]


@pytest.mark.anyio
async def test_an_unchanged_informer_body_is_handed_out_as_the_same_view() -> None:
    """The core takes an object it was handed before as unchanged without comparing: a read
    of a large informer-backed resource costs identity checks only."""
    from typing import cast

    from controlplane.k8s.client import KubeClient
    from controlplane.k8s.informing import Informer
    from controlplane.resources import DEVICES

    informer = Informer(cast(KubeClient, None), DEVICES)
    informer.apply_list([{"metadata": {"name": "a", "resourceVersion": "1"}},
                         {"metadata": {"name": "b", "resourceVersion": "1"}}])  # fmt: skip
    provider = InformerProvider("devices", informer)
    first = await provider.objects()
    again = await provider.objects()
    informer.apply("MODIFIED", {"metadata": {"name": "b", "resourceVersion": "2"}})
    after = await provider.objects()
    assert [x is y for x, y in zip(first, again, strict=True)] == [True, True]
    assert after[0] is first[0] and after[1] is not first[1]
    assert after[1]["metadata"]["resourceVersion"] == "2"
    assert after[1]["apiVersion"] == catalog.GROUP_VERSION


@pytest.mark.anyio
async def test_a_change_told_while_the_follower_is_busy_is_not_lost() -> None:
    from controlplane.extension.workergroup.providers import Changes

    changes = Changes()
    async with changes.follow() as follower:
        changes.tell()  # before the follower first asks: still seen
        with anyio.fail_after(5):
            await follower.__anext__()
        changes.tell()  # told while the follower was away (busy with the first)
        with anyio.fail_after(5):
            await follower.__anext__()
