"""Verdicts: a probe (its injection, and what its containers printed, if they ran) into rows. Pure.

Three situations per probe: it ran (``results``), it was only emitted (``why`` says why: a dry
run, a runtime that cannot be driven, staging that failed: ``ok`` at depth ``simulated``, because
the allocator's intent is proven and nothing contradicts it), or it was blocked by a failure of
this pass (the lock, the sweep: ``unavailable``). Whatever the injection itself lacks (no preload
library, no cap) is ``unavailable`` in all three.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from agent.preflight.checking import Probe, Result, Vendor
from agent.preflight.injection import Mount
from agent.preflight.invocations import (
    MAPS_BEGIN,
    MAPS_END,
    READER_BEGIN,
    READER_END,
    block,
    render,
)
from agent.preflight.model import Row

_INTEGER = re.compile(r"\b(\d+)\b")
_MAPS_LINE = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S{4} [0-9a-f]+ \S+ \d+\s+(\S.*)$")
"""``/proc/<pid>/maps``: address range, perms, offset, device, inode, then the path."""
_TAIL_LINES = 20


def judge(
    vendor: Vendor,
    probe: Probe,
    results: Sequence[Result] | None,
    *,
    why: str = "",
    blocked: str = "",
) -> list[Row]:
    """Rows for ``probe``: ran (``results``), emitted (``why``) or blocked (reason ``blocked``)."""
    command = render(probe.argv) if probe.argv else ""
    base = {"accelerator": probe.accelerator, "command": command}
    if probe.kind == "visibility":
        return [_visibility(base, probe)]
    if probe.kind == "pair":
        row = Row(**base, capability="co-tenancy", mode="sliced", state="ok", depth="simulated")
        return [_not_run(row, why, blocked) if results is None else _pair(row, probe, results)]
    return _sliced(vendor, probe, results, base, why=why, blocked=blocked)


def _visibility(base: dict[str, str], probe: Probe) -> Row:
    """A step of its own: a visibility probe is never run, so its row only names the sidecar's
    environment."""
    envs = ", ".join(f"{k}={v}" for k, v in sorted(probe.injection.envs.items()))
    return Row(
        **base,
        capability="sidecar-visibility",
        mode="visibility",
        state="ok",
        depth="simulated",
        detail=f"a sidecar is injected {envs}; never run",
    )


def _sliced(
    vendor: Vendor,
    probe: Probe,
    results: Sequence[Result] | None,
    base: dict[str, str],
    *,
    why: str,
    blocked: str,
) -> list[Row]:
    """A step of its own: a sliced probe answers two questions, each judged by its own step:
    is the slicing runtime loaded, and is the memory cap in force."""
    loaded = Row(
        **base, capability="sliced-runtime-loaded", mode="sliced", state="ok", depth="simulated"
    )
    quota = Row(
        **base, capability="sliced-quota-in-force", mode="sliced", state="ok", depth="simulated"
    )
    libraries = probe.injection.library_mounts()
    enforcer = vendor.enforcer(probe.injection)
    cap = vendor.cap(probe.injection)
    return [
        _runtime_loaded(loaded, enforcer, libraries, results, why=why, blocked=blocked),
        _quota_in_force(quota, vendor, cap, results, why=why, blocked=blocked),
    ]


def _runtime_loaded(
    row: Row,
    enforcer: str,
    libraries: Sequence[Mount],
    results: Sequence[Result] | None,
    *,
    why: str,
    blocked: str,
) -> Row:
    """A step of its own: the runtime verdict, unavailable without an enforcer whether or not
    the probe ran."""
    if not enforcer:
        return _set(
            row,
            state="unavailable",
            reason="no-preload-library",
            detail="the sliced injection carries nothing that enforces a slice",
        )
    if results is None or not libraries:
        return _not_run(row, why, blocked, f"the slice is enforced by {enforcer}")
    return _loaded(row, libraries[0].container_path, results[0])


def _quota_in_force(
    row: Row,
    vendor: Vendor,
    cap: int | None,
    results: Sequence[Result] | None,
    *,
    why: str,
    blocked: str,
) -> Row:
    """A step of its own: the quota verdict, unavailable without a cap whether or not the probe
    ran."""
    if cap is None:
        return _set(
            row,
            state="unavailable",
            reason="no-cap",
            detail=f"the sliced injection sets no {vendor.cap_source}",
        )
    if results is None:
        return _not_run(row, why, blocked, f"the injection caps memory at {cap} MiB")
    return _quota(row, cap, results[0])


def _set(row: Row, **changes: str) -> Row:
    return msgspec.structs.replace(row, **changes)


def _not_run(row: Row, why: str, blocked: str, what: str = "") -> Row:
    said = f"{what}; not run: {why}" if what else f"not run: {why}"
    if blocked:
        return _set(row, state="unavailable", reason=blocked, detail=said)
    return _set(row, detail=said)


def _loaded(row: Row, library: str, result: Result) -> Row:
    maps = block(result.output, MAPS_BEGIN, MAPS_END)
    if result.code != 0 or maps is None:
        return _failed(row, result)
    hits = _mapped(maps, library)
    if not hits:
        return _set(
            row,
            state="unavailable",
            depth="measured",
            reason="library-not-mapped",
            detail=f"{library} is not in the probe's /proc/self/maps",
            evidence="\n".join([MAPS_BEGIN, *maps]) + "\n",
        )
    return _set(
        row,
        depth="measured",
        detail="the slicing runtime the injection mounts is loaded in the container",
        evidence="\n".join([MAPS_BEGIN, "…", *hits]) + "\n",
    )


def _quota(row: Row, cap: int, result: Result) -> Row:
    if result.code != 0 or block(result.output, MAPS_BEGIN, MAPS_END) is None:
        return _failed(row, result)
    reader = block(result.output, READER_BEGIN, READER_END) or []
    seen = [int(m.group(1)) for line in reader for m in [_INTEGER.search(line)] if m]
    if not seen:
        return _set(
            row,
            detail=f"the injection caps memory at {cap} MiB; the reader reported "
            "nothing, so no container was observed under the cap",
        )
    evidence = "\n".join([READER_BEGIN, *reader]) + "\n"
    if seen[0] != cap:
        return _set(
            row,
            state="unavailable",
            depth="measured",
            reason="cap-not-in-force",
            detail=f"the reader sees {seen[0]} MiB; the injection caps {cap} MiB",
            evidence=evidence,
        )
    return _set(
        row,
        depth="measured",
        evidence=evidence,
        detail=f"the reader in the container sees the {cap} MiB cap",
    )


def _pair(row: Row, probe: Probe, results: Sequence[Result]) -> Row:
    libraries = probe.injection.library_mounts()
    evidence: list[str] = []
    good = len(results) == 2
    for n, result in enumerate(results, 1):
        maps = block(result.output, MAPS_BEGIN, MAPS_END)
        hits = _mapped(maps or [], libraries[0].container_path) if libraries else []
        good = good and result.code == 0 and maps is not None and (bool(hits) or not libraries)
        evidence += [f"probe {n}: exit {result.code}", *(hits or _tail(result.output))]
    text = "\n".join(evidence) + "\n"
    if not good:
        return _set(
            row,
            state="unavailable",
            depth="measured",
            reason="co-tenant-failed",
            detail="two probes started on one card at once and not both ran sliced",
            evidence=text,
        )
    return _set(
        row,
        depth="measured",
        evidence=text,
        detail="two sliced probes ran on one card at once, each with the runtime loaded",
    )


def _mapped(maps: Sequence[str], library: str) -> list[str]:
    """The mapping lines whose path is ``library``: a log line naming it does not count."""
    hits = []
    for line in maps:
        match = _MAPS_LINE.match(line.rstrip())
        if match and match.group(1).removesuffix(" (deleted)") == library:
            hits.append(line)
    return hits


def _failed(row: Row, result: Result) -> Row:
    return _set(
        row,
        state="unavailable",
        reason="probe-failed",
        detail=f"the probe exited {result.code} before printing its mappings",
        evidence="\n".join(_tail(result.output)) + "\n",
    )


def _tail(output: str) -> list[str]:
    return output.splitlines()[-_TAIL_LINES:]
