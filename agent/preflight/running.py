"""The ``dm preflight`` one-shot: plan every row, then act (or, with ``--dry-run``, only print).

Order of a real pass: resolve the runtime and detect (reads); plan rows and probes (pure); take
the lock; sweep stale preflight containers; per manufacturer stage the preload tree and run the
probes; judge. The document is printed whatever happened, and the exit code is non-zero iff some
accelerator row is ``unavailable``.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, cast

from agent.devices import detection, sources
from agent.devices.manufacturers import WITH_BACKEND
from agent.devices.settings import DetectSettings, manufacturers_from, simulate_from
from agent.errors import DetectionError, ProfileError
from agent.preflight import checking, invocations, judging, kubeletconfig, staging
from agent.preflight.checking import Plan, Result
from agent.preflight.host import Host, RootedView
from agent.preflight.model import (
    Detection,
    Document,
    Group,
    HostCheck,
    Row,
    Runtime,
    Topology,
    exit_code,
    render,
)
from agent.preflight.settings import HOST_LIB_DIR, PreflightSettings
from bus import devices
from kit.options import Flags, Options

log = logging.getLogger(__name__)

EXIT_USAGE = 2
_ORDER = (
    "mig-partitioning",
    "cu-mask-topology",
    "container-share",
    "smlu-mode",
    "sgpu-mode",
    "ascend-docker-runtime",
    "hccl-ranktable",
    "sliced-runtime-loaded",
    "sliced-quota-in-force",
    "co-tenancy",
    "sidecar-visibility",
    "stale-container-sweep",
)


class PreflightFlags(Flags, frozen=True, kw_only=True):
    """The flags of ``dm preflight``."""

    manufacturer: str
    dry_run: bool
    probe_image: str
    host_root: str
    runtime: str
    no_pci_check: bool
    output: str
    simulate: str


def settings_from(options: Options) -> PreflightSettings:
    """The settings of ``dm preflight``, from its flags (the process edge)."""
    flags = options.read_flags(PreflightFlags)
    manufacturers, explicit = manufacturers_from(flags.manufacturer)
    optional: dict[str, Any] = {}
    if options.env.get("GPUSTACK_PREFLIGHT_LIB_SOURCE"):
        optional["lib_source"] = options.env["GPUSTACK_PREFLIGHT_LIB_SOURCE"]
    return PreflightSettings(
        manufacturers=manufacturers,
        explicit_manufacturers=explicit,
        dry_run=flags.dry_run,
        probe_image=flags.probe_image,
        host_root=flags.host_root,
        runtime=cast(Any, flags.runtime),
        pci_check=not flags.no_pci_check,
        simulate=simulate_from(flags.simulate),
        output=cast(Any, flags.output),
        **optional,
    )


def preflight_command(settings: PreflightSettings) -> int:
    """Print the preflight document for this node; non-zero iff some row is unavailable."""
    try:
        document = run(settings)
    except ProfileError as e:
        sys.stderr.write(f"--simulate: {e}\n")
        return EXIT_USAGE
    sys.stdout.write(render(document, settings.output))
    sys.stdout.flush()
    return exit_code(document)


@dataclass
class _Pass:
    """One manufacturer's plan and what became of it."""

    manufacturer: str
    groups: list[devices.DeviceGroup]
    detection: Detection
    plan: Plan = field(default_factory=lambda: Plan((), ()))
    results: dict[int, list[Result]] = field(default_factory=dict)
    why: str = ""
    blocked: str = ""
    extra: list[Row] = field(default_factory=list)
    staging: list[str] = field(default_factory=list)
    note: str = ""


def run(settings: PreflightSettings) -> Document:
    """The whole pass. :raises ProfileError: for a bad ``--simulate`` profile."""
    host = Host(settings)
    files = kubeletconfig.HostFiles(settings.host_root)
    srcs, proc_visible = kubeletconfig.kubelet_sources(files)
    invalid = host.valid()
    if invalid:
        choice = kubeletconfig.Choice("docker", why_not=invalid)
    else:
        choice = kubeletconfig.choose(
            srcs, settings.runtime, host.has_command, lambda s: os.path.exists(files.path(s))
        )
    runtime = _runtime(choice, host.shares_network())
    stamp = detection.rfc3339_nano()
    passes = _detect(settings, host)
    prefix = invocations.cli_prefix(settings.chroot, settings.host_root, choice)
    for p in passes:
        vendor = checking.VENDORS.get(p.manufacturer)
        if vendor and p.detection.state == "ok":
            p.plan = checking.plan(
                vendor,
                p.groups,
                prefix=prefix,
                image=settings.probe_image,
                host_lib_dir=HOST_LIB_DIR,
                hold_s=settings.hold_s,
                view=RootedView(settings.host_root),
            )
    why = "this is a dry run" if settings.dry_run else choice.why_not
    if why:
        for p in passes:
            _stage(p, settings, apply=False)
            p.why = why
    else:
        _execute(passes, settings, host, prefix)
    policy, source, note = kubeletconfig.topology_policy(srcs, proc_visible)
    return Document(
        accelerators=tuple(_group(p, stamp) for p in passes),
        runtime=runtime,
        topology=Topology(timestamp=stamp, policy=cast(Any, policy), source=source, note=note),
    )


def _runtime(choice: kubeletconfig.Choice, network: bool | None) -> Runtime:
    notes = [choice.why_not] if choice.why_not else []
    if network is False:
        notes.append(
            "this container is not in the host's network namespace (run it with "
            "--network=host): image pulls by the host runtime will fail"
        )
    elif network is None:
        notes.append(
            "could not tell whether this container shares the host's network "
            "(no readable <host-root>/proc/1/ns/net); without it image pulls fail"
        )
    for n in notes[1 if choice.why_not else 0 :]:
        log.warning("%s", n)
    return Runtime(
        name=choice.dialect,
        driven=choice.driven,
        endpoint=choice.endpoint,
        source=choice.source,
        host_network=network,
        note="; ".join(notes),
    )


def _detect(settings: PreflightSettings, host: Host) -> list[_Pass]:
    detect_settings = DetectSettings(
        manufacturers=settings.manufacturers,
        explicit_manufacturers=True,
        pci_check=settings.pci_check,
        fast_failed=False,
        host_root=settings.host_root,
        simulate=settings.simulate,
    )
    with sources.open_backends(detect_settings) as backends:
        result = detection.detect(backends, fast_failed=False)
    failed = {e.manufacturer: e for e in result.errors}
    passes = []
    for key in settings.manufacturers:
        groups = [g for g in result.items if g.manufacturer == key]
        found = _detection(key, groups, failed.get(key), host, settings.simulate is not None)
        passes.append(_Pass(key, groups, found))
    return passes


def _detection(
    key: str,
    groups: list[devices.DeviceGroup],
    error: DetectionError | None,
    host: Host,
    simulated: bool,
) -> Detection:
    if key not in WITH_BACKEND:
        return Detection(
            state="unavailable",
            reason="no-backend",
            detail=f"this build detects only {', '.join(WITH_BACKEND)}",
        )
    vendor = checking.VENDORS[key]
    check = _host_check(host, vendor) if vendor.host_cli else None
    count = sum(len(g.accelerators) for g in groups)
    if error is not None:
        return Detection(
            state="unavailable", reason="detection-failed", detail=error.message, host=check
        )
    seen = check.accelerators if check is not None else None
    if seen is not None and seen != count and not simulated:
        return Detection(
            state="unavailable",
            reason="host-disagrees",
            accelerators=count,
            detail=f"detection found {count}, the host's CLI counts {seen}",
            host=check,
        )
    if count == 0:
        return Detection(state="not-declared", detail=f"no {key} accelerator found", host=check)
    names = ", ".join(sorted({g.name for g in groups}))
    return Detection(state="ok", accelerators=count, detail=names, host=check)


def _host_check(host: Host, vendor: checking.Vendor) -> HostCheck:
    argv = host.argv(*vendor.host_cli)
    command = invocations.render(argv)
    result = host.run(argv)
    if result.code != 0:
        last = (result.output.strip().splitlines() or [""])[-1]
        return HostCheck(command=command, reason=f"exit {result.code}", detail=last)
    return HostCheck(command=command, accelerators=vendor.host_counts(result.output))


def _stage(p: _Pass, settings: PreflightSettings, *, apply: bool) -> bool:
    """Plan (and with ``apply``, do) the staging; False when probes cannot run after it."""
    injections = [pr.injection for pr in p.plan.probes if pr.kind != "visibility"]
    if not injections:
        return True
    steps, missing = staging.plan_staging(p.manufacturer, injections, settings.lib_source)
    verb = "" if apply else "would "
    p.staging = [verb + s.describe() for s in steps] + [
        f"missing from {settings.lib_source}: {m}" for m in missing
    ]
    driver = sorted({d for i in injections for d in i.steps})
    p.staging += [f"driver step the device plugin takes (not preflight): {d.describe()}"
                  for d in driver]  # fmt: skip
    if missing:
        p.why = f"staging failed: this image carries no {', '.join(missing)}"
        return False
    if apply:
        try:
            staging.apply(steps, settings.host_root)
        except staging.StagingError as e:
            p.why = f"staging failed: {e}"
            return False
    return True


def _execute(
    passes: list[_Pass], settings: PreflightSettings, host: Host, prefix: list[str]
) -> None:
    try:
        with staging.locked(settings.host_root):
            swept = _sweep(host, prefix)
            for p in passes:
                if swept:
                    p.why, p.blocked = (
                        f"the stale-container sweep failed: {swept}",
                        "stale-container-sweep",
                    )
                    p.extra = [_sweep_row(acc, swept) for g in p.groups for acc in g.accelerators]
                    continue
                unprobed = _unprobed(p, prefix)
                if unprobed:  # listed as it would be staged; the reason stays this one
                    _stage(p, settings, apply=False)
                    p.why = unprobed
                elif _stage(p, settings, apply=True):
                    _probe(p, settings, host)
    except (staging.Locked, staging.StagingError) as e:
        for p in passes:
            p.why, p.blocked = str(e), "preflight-locked"


def _unprobed(p: _Pass, prefix: list[str]) -> str:
    """Why no probe container runs for ``p``'s manufacturer here; empty when they run."""
    vendor = checking.VENDORS.get(p.manufacturer)
    if vendor is not None and not vendor.probes:
        return (
            f"preflight judges {p.manufacturer} from the allocator's injection: no probe "
            "container runs for it"
        )
    if p.manufacturer == "ascend" and prefix[2:3] == ["nerdctl"]:
        return "nerdctl cannot hand a container to the Ascend runtime; run it with docker"
    return ""


def _sweep(host: Host, prefix: list[str]) -> str:
    """Remove every labelled container; empty on success, else what failed."""
    listed = host.run(invocations.list_argv(prefix))
    if listed.code != 0:
        return f"listing exited {listed.code}: {listed.output.strip()[-200:]}"
    ids = listed.output.split()
    if ids:
        removed = host.run(invocations.remove_argv(prefix, ids))
        if removed.code != 0:
            return (
                f"removing {' '.join(ids)} exited {removed.code}: {removed.output.strip()[-200:]}"
            )
    return ""


def _sweep_row(acc: devices.Accelerator, why: str) -> Row:
    return Row(
        accelerator=acc.id,
        capability="stale-container-sweep",
        mode="unnamed",
        state="unavailable",
        depth="simulated",
        reason="stale-container-sweep",
        detail=why,
    )


def _probe(p: _Pass, settings: PreflightSettings, host: Host) -> None:
    for n, probe in enumerate(p.plan.probes):
        if probe.kind == "sliced":
            p.results[n] = [host.run(probe.argv, settings.probe_timeout_s)]
        elif probe.kind == "pair":
            p.results[n] = host.run_many([probe.argv, probe.argv], settings.probe_timeout_s)


def _group(p: _Pass, stamp: str) -> Group:
    vendor = checking.VENDORS.get(p.manufacturer)
    rows = list(p.plan.rows) + p.extra
    for n, probe in enumerate(p.plan.probes):
        assert vendor is not None  # probes exist only for vendors
        results = p.results.get(n)
        why = (
            "a sidecar's visibility is judged from the injection alone"
            if (probe.kind == "visibility" and not p.blocked)
            else p.why
        )
        rows += judging.judge(vendor, probe, results, why=why, blocked=p.blocked)
    if p.blocked == "preflight-locked":
        rows = [_locked(r, p.why) for r in rows]
    order = {acc.id: acc.index for g in p.groups for acc in g.accelerators}
    rows.sort(
        key=lambda r: (
            order.get(r.accelerator, -1),
            _ORDER.index(r.capability) if r.capability in _ORDER else len(_ORDER),
        )
    )
    return Group(
        manufacturer=p.manufacturer,
        timestamp=stamp,
        detection=p.detection,
        checks=tuple(rows),
        staging=tuple(p.staging),
        note=_note(p, vendor),
    )


def _locked(row: Row, why: str) -> Row:
    return judging._set(row, state="unavailable", reason="preflight-locked", detail=why)


def _note(p: _Pass, vendor: checking.Vendor | None) -> str:
    if vendor is None:
        return f"preflight cannot probe {p.manufacturer} in this build"
    if p.detection.state != "ok":
        return "detection did not establish accelerators, so no capability was checked"
    if p.why == "this is a dry run":
        return (
            "this is a dry run: nothing was written or started; each command needs the "
            "staging listed to exist first"
        )
    return p.why
