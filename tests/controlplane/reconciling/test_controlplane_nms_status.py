"""NodeModelStore.status planning (pure) and the CRD accepting what it produces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
import pytest
from test_controlplane_crds import strict

from bus import events
from controlplane.reconciling import objects, storing
from controlplane.reconciling.nodestates import Ledger
from controlplane.reconciling.planning import Desired, Patch, plan, settle_conditions
from controlplane.resources import NODEMODELSTORES, Observed, Ref
from controlplane.schema import crds

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
D = ["sha256:" + c * 64 for c in "abcd"]
REF = Ref(resource=NODEMODELSTORES, name="n1")


VALIDATOR = jsonschema.Draft7Validator(
    strict(crds.definitions()["nodemodelstores"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]),
    format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER,
)  # fmt: skip


def full_event(*, used: int = 700, failed: bool = True) -> events.ModelsEvent:
    models = [
        events.ModelState(model=D[0], digest=D[0], state="ready", bytes_total=400,
                          referenced=2, last_used=T0),
        events.ModelState(model=D[1], digest=D[1], state="downloading", bytes_done=30,
                          bytes_total=90, referenced=0),
    ]  # fmt: skip
    if failed:
        models.append(
            events.ModelState(model=D[2], digest=D[2], state="failed", referenced=0,
                              reason="IntegrityMismatch", message="IntegrityMismatch: bad bytes",
                              retry_time=T1)
        )  # fmt: skip
    return events.ModelsEvent(
        node="n1", ts=T0, models=tuple(models), capacity_bytes=1000, stored_bytes=400,
        used_bytes=used,
    )  # fmt: skip


def status_of(event: events.ModelsEvent | None, *, now: datetime = T0, **spec: Any) -> Any:
    report = storing.StoreReport.of(event) if event is not None else None
    return storing.store_status(
        event.models if event is not None else None, report, spec=spec or None, now=now
    )


def conditions(status: Any) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_every_field_of_the_status() -> None:
    status = status_of(full_event())

    assert status["capacity"] == {"totalBytes": 1000, "storedBytes": 400, "usedPercent": 70,
                                  "total": "1000 B", "stored": "400 B"}  # fmt: skip
    assert status["modelCounts"] == {"ready": 1, "downloading": 1, "failed": 1}
    failed, downloading, ready = status["models"]
    assert failed == {"digest": D[2], "state": "Failed", "referenced": 0,
                      "reason": "IntegrityMismatch", "message": "bad bytes",
                      "retryTime": "2026-01-01T00:05:00Z"}  # fmt: skip
    assert downloading == {"digest": D[1], "state": "Downloading", "sizeBytes": 90,
                           "downloadedBytes": 30, "progress": "33% (30 B of 90 B)",
                           "referenced": 0}  # fmt: skip
    assert status["downloading"] == f"{D[1][:19]} 33% (30 B of 90 B)"
    assert ready == {"digest": D[0], "state": "Ready", "sizeBytes": 400, "downloadedBytes": 400,
                     "referenced": 2, "lastUsedTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    assert conditions(status) == {
        "Ready": ("False", "ModelsFailed"),
        "CapacityLow": ("False", "BelowHighWatermark"),
    }
    assert all(c["lastTransitionTime"] == "2026-01-01T00:00:00Z" for c in status["conditions"])
    VALIDATOR.validate({"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "NodeModelStore",
                        "metadata": {"name": "n1"}, "spec": objects.NMS_SPEC_DEFAULT,
                        "status": status})  # fmt: skip


@pytest.mark.parametrize(
    ("used", "high", "expected"),
    [(799, 80, "False"), (800, 80, "True"), (1000, 80, "True"), (700, 70, "True")],
)
def test_capacity_low_at_the_high_watermark(used: int, high: int, expected: str) -> None:
    status = status_of(full_event(used=used), watermarks={"highPercent": high})

    assert status["capacity"]["usedPercent"] == used * 100 // 1000
    assert conditions(status)["CapacityLow"][0] == expected


def test_ready_needs_a_report_and_no_failed_model() -> None:
    assert conditions(status_of(None))["Ready"] == ("Unknown", "NotReported")
    assert conditions(status_of(None))["CapacityLow"] == ("Unknown", "NotReported")
    assert conditions(status_of(full_event(failed=False)))["Ready"] == ("True", "Serving")
    assert status_of(None) == {**status_of(None), "models": [], "modelCounts": {
        "ready": 0, "downloading": 0, "failed": 0}}  # fmt: skip
    assert "capacity" not in status_of(None)


def test_an_agent_without_the_new_fields_still_gets_a_status() -> None:
    old = events.ModelsEvent(node="n1", ts=T0, models=(
        events.ModelState(model=D[0], state="ready", bytes_total=5),
        events.ModelState(model=D[0], state="ready", bytes_total=5),  # duplicate: first wins
        events.ModelState(model=D[1], state="failed", message="AccessDenied: 401"),
    ))  # fmt: skip

    status = status_of(old)

    assert status["capacity"] == {"storedBytes": 5, "stored": "5 B"}
    assert [m["digest"] for m in status["models"]] == [D[1], D[0]]
    assert status["models"][0]["message"] == "AccessDenied: 401"
    assert conditions(status)["CapacityLow"] == ("Unknown", "NotReported")
    VALIDATOR.validate({"status": status})


def test_models_are_capped_at_the_crds_max_items_but_counted() -> None:
    many = tuple(
        events.ModelState(model=f"sha256:{i:064x}", state="ready", bytes_total=1)
        for i in range(300)
    )

    status = status_of(events.ModelsEvent(node="n1", ts=T0, models=many))

    assert len(status["models"]) == storing.MAX_MODELS
    assert status["modelCounts"]["ready"] == 300
    VALIDATOR.validate({"status": status})


def observed(status: Any) -> Observed:
    return Observed(body={"metadata": {"name": "n1", "resourceVersion": "7"}, "spec": {},
                          "status": status}, resource_version="7")  # fmt: skip


def test_transition_time_moves_only_on_a_flip_and_no_change_writes_nothing() -> None:
    first = status_of(full_event(), now=T0)
    current = observed(first)

    same = Desired(spec={}, status=status_of(full_event(), now=T1))
    settled = settle_conditions(same, current)
    recovered = settle_conditions(
        Desired(spec={}, status=status_of(full_event(failed=False, used=900), now=T1)), current
    )

    assert plan(REF, settled, current) == []
    times = {c["type"]: c["lastTransitionTime"] for c in recovered.status["conditions"]}  # type: ignore[index]
    assert times == {"Ready": "2026-01-01T00:05:00Z", "CapacityLow": "2026-01-01T00:05:00Z"}
    progressed = Desired(spec={}, status=status_of(full_event(used=750), now=T1))
    (patch,) = plan(REF, settle_conditions(progressed, current), current)
    assert isinstance(patch, Patch) and patch.subresource == "status"
    assert all(c["lastTransitionTime"] == "2026-01-01T00:00:00Z"
               for c in patch.body["status"]["conditions"])  # fmt: skip


def test_settle_without_an_observed_object_keeps_now() -> None:
    desired = Desired(spec={}, status=status_of(full_event(), now=T1))

    assert settle_conditions(desired, None) == desired


def test_the_ledger_notices_a_capacity_only_change() -> None:
    ledger = Ledger()
    assert ledger.apply(full_event(used=700))
    assert not ledger.apply(full_event(used=700))
    assert ledger.apply(full_event(used=710))
    state = ledger.get("n1")
    assert state is not None and state.store == storing.StoreReport(1000, 400, 710)


def test_progress_a_person_reads() -> None:
    """Per-model progress in human units, and the summary line the Progress column shows."""
    assert storing.progress(3 << 30, 8 << 30) == "37% (3.0 GiB of 8.0 GiB)"
    assert storing.progress(5 << 20, None) == "5.0 MiB received"
    assert storing.progress(None, 10) is None
    two = events.ModelsEvent(node="n1", ts=T0, models=tuple(
        events.ModelState(model=d, digest=d, state="downloading", bytes_done=n, bytes_total=100)
        for d, n in ((D[0], 10), (D[1], 100))
    ))  # fmt: skip
    status = status_of(two)
    assert (
        status["downloading"]
        == f"{D[0][:19]} 10% (10 B of 100 B); {D[1][:19]} 100% (100 B of 100 B)"
    )
    ready_only = events.ModelsEvent(node="n1", ts=T0, models=(
        events.ModelState(model=D[0], digest=D[0], state="ready", bytes_total=4),))  # fmt: skip
    assert "downloading" not in status_of(ready_only)


def test_the_source_of_a_model_is_where_most_of_its_bytes_came_from() -> None:
    models = (
        events.ModelState(model=D[0], digest=D[0], state="ready", bytes_total=4, source="Peer"),
        events.ModelState(model=D[1], digest=D[1], state="downloading", bytes_done=1,
                          bytes_total=9, source="Hub"),
        events.ModelState(model=D[2], digest=D[2], state="failed", reason="SourceUnavailable",
                          source="Peer"),
        events.ModelState(model=D[3], digest=D[3], state="ready", bytes_total=4),  # older agent
    )  # fmt: skip
    event = events.ModelsEvent(node="n1", ts=T0, models=models)
    status = status_of(event)
    by_digest = {m["digest"]: m for m in status["models"]}
    assert by_digest[D[0]]["source"] == "Peer"
    assert by_digest[D[1]]["source"] == "Hub"
    assert "source" not in by_digest[D[2]]  # a failed model holds no bytes of anywhere
    assert "source" not in by_digest[D[3]]
    VALIDATOR.validate({"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "NodeModelStore",
                        "metadata": {"name": "n1"}, "spec": objects.NMS_SPEC_DEFAULT,
                        "status": status})  # fmt: skip
