"""The seven other manufacturers' preflight rows, planned and judged as a dry run: pure.

Groups are hand-made as detection reports them; the host's files are a dict (``View``). A dry
run judges every probe as emitted, so each row's state and depth here is exactly what
``dm preflight --dry-run`` prints for such a node.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.devices.manufacturers import MANUFACTURERS
from agent.preflight import checking, invocations, judging, staging
from agent.preflight.injection import WORK_DIR
from agent.preflight.kubeletconfig import Choice
from agent.preflight.model import Row
from bus import devices

LIB = "/var/lib/gpustack/operator/lib"
PREFIX = invocations.cli_prefix("/usr/sbin/chroot", "/host", Choice("docker"))


class View:
    """:class:`checking.HostView` over a dict of host files (a value of None: a symlink)."""

    def __init__(self, files: dict[str, str | None] | None = None, dirs: tuple[str, ...] = ()):
        self.files = files or {}
        self.dirs = dirs

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.dirs

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def is_link(self, path: str) -> bool:
        return path in self.files and self.files[path] is None


def group(
    manufacturer: str,
    *,
    cards: int = 1,
    family: str | None = None,
    runtime: str | None = None,
    cores: int | None = None,
    physical: Callable[[int], tuple[int, ...]] = lambda i: (i, 128 + i),
    partitions: int = 0,
) -> devices.DeviceGroup:
    slices = MANUFACTURERS[manufacturer].logical_slices
    status = devices.AcceleratorStatus(
        unhealthy=False,
        logical_sliced=None
        if partitions
        else devices.LogicalSliced(cores_percentage_overcommit=False, count=slices),
        physical_sliced=devices.PhysicalSliced(count=partitions) if partitions else None,
    )
    return devices.DeviceGroup(
        id=f"{manufacturer}-x",
        manufacturer=manufacturer,
        name=f"{manufacturer} X",
        memory=65536,
        cores=cores,
        family=family,
        runtime_version=runtime,
        accelerators=tuple(
            devices.Accelerator(
                id=f"{manufacturer.upper()}-{i}",
                index=i,
                physical_indexes=physical(i),
                topology=devices.Topology(pci_bus_id=f"0000:{i + 1:02x}:00.0"),
                status=status,
            )
            for i in range(cards)
        ),
    )


def dry_run(g: devices.DeviceGroup, view: View | None = None, image: str = "") -> list[Row]:
    vendor = checking.VENDORS[g.manufacturer]
    plan = checking.plan(
        vendor, [g], prefix=PREFIX, image=image, host_lib_dir=LIB, hold_s=0, view=view or View()
    )
    rows = list(plan.rows)
    for probe in plan.probes:
        rows += judging.judge(vendor, probe, None, why="this is a dry run")
    return rows


def table(rows: list[Row]) -> list[tuple[str, str, str, str]]:
    return [(r.capability, r.state, r.depth, r.reason) for r in rows]


def declared(capability: str, state: str = "ok", reason: str = "") -> tuple[str, str, str, str]:
    return (capability, state, "declared", reason)


INJECTED = [
    ("sliced-runtime-loaded", "ok", "simulated", ""),
    ("sliced-quota-in-force", "ok", "simulated", ""),
    ("sidecar-visibility", "ok", "simulated", ""),
]
"""A manufacturer judged from the allocator's injection: no container runs."""
PROBED = [*INJECTED[:2], ("co-tenancy", "ok", "simulated", ""), INJECTED[2]]
"""A manufacturer whose probes would run: the co-tenant pair too."""
NOT_ASKABLE = ("unavailable", "driver-not-askable")

ASCEND_910B = group("ascend", family="910b", runtime="8.2", physical=lambda i: (3,))
CAMBRICON = group("cambricon", physical=lambda i: (i,))
HYGON = group("hygon", cores=120)
SGPU = "/sys/bus/pci/devices/0000:01:00.0/sgpu"
WITH_SGPU = View(dirs=(SGPU, f"{SGPU}/create"))
PPU_IMAGE = "registry.local/ppu-sdk:2.0"

DRY_RUNS = {  # case: (group, host files, probe image, the rows printed)
    "iluvatar": (group("iluvatar"), View(), "", INJECTED),
    "mthreads": (group("mthreads"), View(), "", INJECTED),
    "hygon": (HYGON, View(), "", INJECTED),
    "cambricon": (CAMBRICON, View(), "", [declared("smlu-mode", *NOT_ASKABLE), *INJECTED]),
    "metax": (group("metax"), WITH_SGPU, "", [declared("sgpu-mode"), *INJECTED]),
    "ascend-910b": (ASCEND_910B, View(), "", [declared("container-share", *NOT_ASKABLE), *PROBED]),
    "thead": (
        group("thead"),
        View(),
        PPU_IMAGE,
        [declared("mig-partitioning", "not-declared"), *PROBED],
    ),
    "thead-partitioned": (
        group("thead", partitions=7),
        View(),
        PPU_IMAGE,
        [declared("mig-partitioning"), declared("sidecar-visibility")],
    ),
}


def test_every_manufacturer_has_a_preflight_vendor() -> None:
    assert sorted(checking.VENDORS) == sorted(MANUFACTURERS)


@pytest.mark.parametrize(("g", "view", "image", "expected"), DRY_RUNS.values(), ids=DRY_RUNS)
def test_dry_run_rows_per_manufacturer(
    g: devices.DeviceGroup, view: View, image: str, expected: list[tuple[str, str, str, str]]
) -> None:
    """Each row's capability, state, depth and reason, as ``dm preflight --dry-run`` prints."""
    rows = dry_run(g, view, image)
    assert table(rows) == expected
    assert all(r.command == "" for r in rows if r.depth == "declared")  # declared rows carry none


@pytest.mark.parametrize("manufacturer", ["iluvatar", "mthreads"])
def test_injection_only_manufacturers_run_no_container(manufacturer: str) -> None:
    assert all(r.command == "" for r in dry_run(group(manufacturer)))


def test_iluvatar_names_hami_core_and_the_cap() -> None:
    loaded, quota, seen = dry_run(group("iluvatar"))
    assert (
        loaded.detail
        == "the slice is enforced by /usr/local/vgpu/libvgpu.so; not run: this is a dry run"
    )
    assert quota.detail == "the injection caps memory at 32768 MiB; not run: this is a dry run"
    assert seen.detail == "a sidecar is injected IX_VISIBLE_DEVICES=0; never run"


# ------------------------------------------------------------------ Ascend


def test_ascend_dry_run_the_probe_it_would_run() -> None:
    rows = dry_run(ASCEND_910B)
    command = rows[1].command
    assert command.startswith("/usr/sbin/chroot /host docker run --rm --runtime ascend ")
    assert "-e ASCEND_VISIBLE_DEVICES=3" in command
    assert " quay.io/ascend/cann:8.2-910b sh -c " in command
    # preflight asks for half the slice tokens: 31 of 63, so 31/63 of 65536 MiB
    assert rows[2].detail.startswith("the injection caps memory at 32247 MiB")
    assert rows[4].detail == "a sidecar is injected ASCEND_VISIBLE_DEVICES=3; never run"


def test_ascend_without_a_cann_version_needs_a_probe_image() -> None:
    rows = dry_run(group("ascend", family="910b"))
    refused = [r for r in rows if r.reason == "no-injection"]
    assert {r.capability for r in refused} == {
        "sliced-runtime-loaded",
        "sliced-quota-in-force",
        "co-tenancy",
        "sidecar-visibility",
    }
    assert all("pass --probe-image" in r.detail for r in refused)
    assert dry_run(group("ascend", family="910b"), image="my/cann:1")[1].state == "ok"


RUNTIME = "/usr/local/Ascend/Ascend-Docker-Runtime"
RANKTABLE = "/etc/hccl_rootinfo.json"


@pytest.mark.parametrize(
    ("files", "dirs", "runtime", "ranktable"),
    [
        ({f"{RUNTIME}/version.info": "Version=26.0.0\n"}, (RUNTIME,), ("ok", ""), ("ok", "")),
        (
            {f"{RUNTIME}/version.info": "Version=7.1.RC1\n", RANKTABLE: '{"version": "1.0"}'},
            (RUNTIME,),
            ("unavailable", "version-unread"),
            ("unavailable", "old-ranktable"),
        ),
        (
            {f"{RUNTIME}/version.info": "Version=25.3.1", RANKTABLE: '{"version": "2.0"}'},
            (RUNTIME,),
            ("unavailable", "too-old"),
            ("ok", ""),
        ),
        ({RANKTABLE: None}, (), ("unavailable", "not-installed"), ("unavailable", "symlink")),
        (
            {RANKTABLE: "not json"},
            (),
            ("unavailable", "not-installed"),
            ("unavailable", "unparsable"),
        ),
    ],
)
def test_ascend_950_reads_its_runtime_and_ranktable(
    files: dict[str, str | None],
    dirs: tuple[str, ...],
    runtime: tuple[str, str],
    ranktable: tuple[str, str],
) -> None:
    g = group("ascend", family="950", runtime="9.0")
    rows = {r.capability: r for r in dry_run(g, View(files, dirs))}
    assert (rows["ascend-docker-runtime"].state, rows["ascend-docker-runtime"].reason) == runtime
    assert (rows["hccl-ranktable"].state, rows["hccl-ranktable"].reason) == ranktable
    assert rows["hccl-ranktable"].mode == "unnamed" and rows["hccl-ranktable"].depth == "declared"


def test_ascend_910_has_no_950_rows() -> None:
    capabilities = {r.capability for r in dry_run(group("ascend", family="910b", runtime="8.2"))}
    assert not capabilities & {"ascend-docker-runtime", "hccl-ranktable"}


def test_ascend_staging_writes_the_rendered_config_into_scratch(tmp_path: Path) -> None:
    vendor = checking.VENDORS["ascend"]
    plan = checking.plan(
        vendor, [ASCEND_910B], prefix=PREFIX, image="", host_lib_dir=LIB, hold_s=0, view=View()
    )
    sliced = next(p.injection for p in plan.probes if p.kind == "sliced")
    steps, missing = staging.plan_staging("ascend", [sliced], str(tmp_path))
    (config,) = [s for s in steps if s.content is not None]
    assert config.target.startswith(f"{WORK_DIR}/") and config.target.endswith("/npu_info.config")
    assert "physical-npu-id=3\n" in config.content
    assert config.describe() == f"write {config.target}"
    assert sorted(missing) == [
        f"{LIB}/ascend/cann-8-910b/enpu-monitor",
        f"{LIB}/ascend/cann-8-910b/ld.so.preload",
        f"{LIB}/ascend/cann-8-910b/libvruntime.so",
    ]
    root = tmp_path / "host"
    staging.apply([config], str(root))
    assert (root / config.target.lstrip("/")).read_text() == config.content


# ------------------------------------------------------------------ T-Head


def test_thead_needs_a_probe_image_and_then_probes_like_nvidia() -> None:
    rows = dry_run(group("thead"))
    assert table(rows)[0] == ("mig-partitioning", "not-declared", "declared", "")
    assert {r.reason for r in rows[1:]} == {"no-injection"}  # no default image for the PPU
    loaded = dry_run(group("thead"), image=PPU_IMAGE)[1]
    assert "--device /dev/alixpu_ppu0:/dev/alixpu_ppu0:rw" in loaded.command
    assert "-e HGGC_DEVICE_SM_LIMIT=50" in loaded.command and "--runtime" not in loaded.command
    assert "/usr/local/vppu/ppu-monitor" in loaded.command  # the reader the quota row rests on
    assert loaded.detail.startswith("the slice is enforced by /usr/local/vppu/hggc_quota.so")


def test_a_thead_card_in_partition_mode_reports_its_partition_tokens() -> None:
    mig, _ = dry_run(group("thead", partitions=7), image=PPU_IMAGE)
    assert mig.detail == "partition mode on; 7 partition tokens, profiles not reported"


# ------------------------------------------------------------------ Hygon, MetaX, Cambricon


def test_hygon_is_judged_from_its_vdev_conf() -> None:
    loaded, quota, _ = dry_run(HYGON)
    assert loaded.detail.startswith("the slice is enforced by /etc/vdev/docker (mounted)")
    assert quota.detail.startswith("the injection caps memory at 32768 MiB")  # 2 of 4 slices


def test_hygon_without_compute_units_gets_no_injection() -> None:
    rows = dry_run(group("hygon"))
    sliced = [r for r in rows if r.mode == "sliced"]
    assert {(r.state, r.reason) for r in sliced} == {("unavailable", "no-injection")}
    assert "reports no compute units to mask" in sliced[0].detail


def test_metax_reads_its_sgpu_registry() -> None:
    present = dry_run(group("metax"), WITH_SGPU)
    assert present[0].detail == f"sGPU registry at {SGPU}; subdevices can be created there"
    assert present[1].detail.startswith("the slice is enforced by metax-sgpu on METAX-0")
    absent = dry_run(group("metax"))
    assert table(absent)[0] == ("sgpu-mode", "unavailable", "declared", "no-sgpu-registry")


def test_cambricon_smlu_mode_is_not_askable_without_cndev() -> None:
    _, _, quota, seen = dry_run(CAMBRICON)
    assert quota.detail.startswith("the injection caps memory at 32768 MiB")
    assert "CAMBRICON_VISIBLE_DEVICES=0" in seen.detail
