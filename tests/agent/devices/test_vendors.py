"""What every library-read manufacturer must do, run against each one's simulated library.

Each row names the packaged profile and the C calls to break; the per-manufacturer files
(``test_ascend.py`` ...) check the values and unit conversions themselves.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from vendor_helpers import accelerators, rig, validate_devices, wire

from agent.devices import detection, sources, vendor
from agent.devices.hostfs import HostFS
from agent.devices.libs import clib
from agent.devices.manufacturers import MANUFACTURERS
from agent.devices.settings import DetectSettings
from agent.devices.simulation import profiles, sysfs
from agent.errors import DetectionError


@dataclass(frozen=True)
class Spec:
    key: str
    profile: str
    identify: str
    """The C call that yields the card's unique id."""
    describe: str
    """A call of the detect pass made after the card's PCI address was read."""
    measure: str
    """A call of the sample pass, and the wire field it feeds."""
    measured: str
    lost: str
    unsupported: str

    def __str__(self) -> str:
        return self.key


SPECS = [
    Spec(
        "ascend", "ascend-910b2x8", "dcmi_get_device_die_v2", "dcmi_get_device_chip_info",
        "dcmi_get_device_power_info", "powerUsage", "DEVICE_NOT_EXIST", "NOT_SUPPORT",
    ),
    Spec(
        "cambricon", "cambricon-mlu370-x8-x4", "cndevGetUUID", "cndevGetMemoryUsageV2",
        "cndevGetDevicePowerInfo", "powerUsage", "IN_PROBLEM", "NOT_SUPPORTED",
    ),
    Spec(
        "hygon", "hygon-k100-ai-x8", "rsmi_dev_unique_id_get", "rsmi_dev_name_get",
        "rsmi_dev_busy_percent_get", "coresUtilization", "FILE_ERROR", "NOT_SUPPORTED",
    ),
    Spec(
        "iluvatar", "iluvatar-bi-v150s-x2", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
        "nvmlDeviceGetTemperature", "temperature", "GPU_IS_LOST", "NOT_SUPPORTED",
    ),
    Spec(
        "metax", "metax-c500-x8", "mxSmlGetDeviceInfo", "mxSmlGetDeviceVersion",
        "mxSmlGetBoardPowerInfo", "powerUsage", "NO_DEVICE", "OPERATION_NOT_SUPPORTED",
    ),
    Spec(
        "mthreads", "mthreads-s4000-x8", "mtmlDeviceGetUUID", "mtmlDeviceGetName",
        "mtmlDeviceGetPowerUsage", "powerUsage", "DRIVER_FAILURE", "NOT_SUPPORTED",
    ),
    Spec(
        "thead", "thead-ppu-zw810e-x16", "hgmlDeviceGetUUID", "hgmlDeviceGetName",
        "hgmlDeviceGetPowerUsage", "powerUsage", "GPU_IS_LOST", "NOT_SUPPORTED",
    ),
]  # fmt: skip


@pytest.fixture(params=SPECS, ids=str)
def spec(request: pytest.FixtureRequest) -> Spec:
    result: Spec = request.param
    return result


def _cards(spec: Spec) -> int:
    return len(profiles.load(spec.profile).library_cards()[spec.key])


def test_packaged_profile_detects_every_card_and_fits_the_crd(spec: Spec, tmp_path: Path) -> None:
    r = rig(spec.key, spec.profile, tmp_path)
    groups = r.backend.detect()
    validate_devices(groups)
    found = accelerators(groups)
    assert [a["index"] for a in found] == list(range(_cards(spec)))
    assert len({a["id"] for a in found}) == len(found)
    assert all(g["simulated"] is True and g["manufacturer"] == spec.key for g in wire(groups))
    assert all(a["status"]["unhealthy"] is False for a in found)
    assert all(a["topology"]["pciBusId"] for a in found)


def test_packaged_profile_samples_every_card(spec: Spec, tmp_path: Path) -> None:
    r = rig(spec.key, spec.profile, tmp_path)
    result = detection.sample([r.backend])
    (sample,) = wire(result.items)
    assert sample["manufacturer"] == spec.key and sample["simulated"] is True
    ids = [a["id"] for a in accelerators(r.backend.detect())]
    assert [a["id"] for a in sample["accelerators"]] == ids
    for accelerator in sample["accelerators"]:
        assert accelerator["unhealthy"] is False
        assert (
            0 < accelerator["memory"] and 0 <= accelerator["memoryUsage"] <= accelerator["memory"]
        )
        assert 0 <= accelerator["memoryUtilization"] <= 100
        assert 0 < accelerator["temperature"] < 120


def test_a_card_lost_mid_read_is_reported_unhealthy_and_costs_only_itself(
    spec: Spec, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = rig(spec.key, spec.profile, tmp_path)
    r.library.faults[1][spec.describe] = r.library.CODES.by_name[spec.lost]
    found = accelerators(r.backend.detect())
    assert len(found) == _cards(spec)
    assert [a["status"]["unhealthy"] for a in found] == [i == 1 for i in range(len(found))]
    assert found[1]["topology"]["pciBusId"]  # read before the loss
    assert "is lost" in caplog.text
    calls_after_loss = [c for c in r.library.calls if c[1] == 1]
    assert calls_after_loss[-1][0] == spec.describe  # nothing more was asked of it


def test_a_lost_card_known_from_an_earlier_pass_stays_reported(spec: Spec, tmp_path: Path) -> None:
    r = rig(spec.key, spec.profile, tmp_path)
    before = accelerators(r.backend.detect())
    r.library.lose(1)
    after = accelerators(r.backend.detect())
    assert [a["id"] for a in after] == [a["id"] for a in before]
    assert [a["status"]["unhealthy"] for a in after] == [i == 1 for i in range(len(after))]
    samples = wire(r.backend.sample())
    assert [s["unhealthy"] for s in samples] == [i == 1 for i in range(len(after))]
    assert samples[1] == {"id": before[1]["id"], "unhealthy": True}


def test_a_card_lost_while_sampled_keeps_what_was_read(spec: Spec, tmp_path: Path) -> None:
    r = rig(spec.key, spec.profile, tmp_path)
    r.library.faults[0][spec.measure] = r.library.CODES.by_name[spec.lost]
    samples = wire(r.backend.sample())
    assert samples[0]["unhealthy"] is True and spec.measured not in samples[0]
    assert all(s["unhealthy"] is False for s in samples[1:])


def test_an_unidentifiable_card_is_left_out(
    spec: Spec, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = rig(spec.key, spec.profile, tmp_path)
    r.library.faults[0][spec.identify] = r.library.CODES.by_name[spec.unsupported]
    found = accelerators(r.backend.detect())
    assert [a["index"] for a in found] == list(range(1, _cards(spec)))
    assert "cannot be identified" in caplog.text


def test_an_unsupported_value_costs_only_its_field(spec: Spec, tmp_path: Path) -> None:
    r = rig(spec.key, spec.profile, tmp_path)
    r.library.faults[0][spec.measure] = r.library.CODES.by_name[spec.unsupported]
    samples = wire(r.backend.sample())
    assert spec.measured not in samples[0] and samples[0]["unhealthy"] is False
    assert spec.measured in samples[1]


def test_no_pci_device_means_the_library_is_never_opened(spec: Spec, tmp_path: Path) -> None:
    host = sysfs.materialize(profiles.load("nvidia-h200x8"), tmp_path)
    opened: list[str] = []
    backend = vendor.VendorBackend(
        spec.key, host=host, census=vendor.PciCensus(host, set()),
        library=lambda: opened.append("x"),
    )  # fmt: skip
    assert backend.detect() == [] and backend.sample() == []
    assert opened == []


def _no_library() -> object:
    raise clib.LibUnavailable("load lib", clib.LIBRARY_NOT_FOUND, "LIBRARY_NOT_FOUND", "absent")


def test_cards_without_their_library_are_one_clear_error(spec: Spec, tmp_path: Path) -> None:
    host = sysfs.materialize(profiles.load(spec.profile), tmp_path)
    backend = vendor.VendorBackend(
        spec.key, host=host, census=vendor.PciCensus(host, set()), library=_no_library
    )
    with pytest.raises(DetectionError) as raised:
        backend.detect()
    message = str(raised.value)
    assert message.startswith(f"{spec.key}: ") and "PCI devices found" in message
    assert "\n" not in message and "absent" in message


def test_without_pci_check_an_absent_library_means_none_here(
    spec: Spec, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    backend = vendor.VendorBackend(
        spec.key, host=HostFS(tmp_path), census=vendor.PciCensus(HostFS(tmp_path), set()),
        library=_no_library, pci_check=False,
    )  # fmt: skip
    assert backend.detect() == []
    assert f"{spec.key}: no library" in caplog.text


def test_a_failing_init_with_cards_on_the_bus_fails_the_manufacturer(
    spec: Spec, tmp_path: Path
) -> None:
    r = rig(spec.key, spec.profile, tmp_path)
    r.library.init_error = next(
        code for code in r.library.CODES.names if code != r.library.CODES.by_name[spec.lost]
    )
    with pytest.raises(DetectionError, match="PCI devices found but"):
        r.backend.detect()


def test_a_failed_init_is_retried_on_the_next_pass(spec: Spec, tmp_path: Path) -> None:
    r = rig(spec.key, spec.profile, tmp_path)
    r.library.init_error = next(iter(r.library.CODES.names))
    with pytest.raises(DetectionError):
        r.backend.detect()
    r.library.init_error = None
    assert len(accelerators(r.backend.detect())) == _cards(spec)
    assert r.made == 1  # the library is opened once, initialised each pass


def test_the_cli_detects_the_profile_and_lists_the_packaged_ones(spec: Spec) -> None:
    cli = [sys.executable, "-m", "gpustack_operator.main", "dm", "detect"]
    listed = subprocess.run(
        [*cli, "--simulate", "list"], check=False, capture_output=True, text=True
    )
    assert listed.returncode == 0 and spec.profile in listed.stdout.splitlines()
    done = subprocess.run(
        [*cli, "-o", "json", "--manufacturer", spec.key, "--simulate", spec.profile],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "not available" not in done.stderr and '"manufacturer": "' + spec.key in done.stdout


def test_a_profile_without_the_library_fails_that_manufacturer_only(
    spec: Spec, tmp_path: Path
) -> None:
    """Through ``open_backends``: the other manufacturers' cards are still reported."""
    text = (profiles_dir() / f"{spec.profile}.yaml").read_text()
    broken = text.replace(f"\n{spec.key}:\n", f"\n{spec.key}:\n  libraryInstalled: false\n", 1)
    nvidia = (profiles_dir() / "amd-rx7800xt-x2.yaml").read_text().split("\namd:\n", 1)[1]
    path = tmp_path / "node.yaml"
    path.write_text(broken + "amd:\n" + nvidia)
    settings = DetectSettings(manufacturers=tuple(sorted(MANUFACTURERS)), simulate=str(path))
    with sources.open_backends(settings) as backends:
        result = detection.detect(backends, fast_failed=False)
    assert [g.manufacturer for g in result.items] == ["amd"]
    (error,) = result.errors
    assert error.manufacturer == spec.key and "PCI devices found but load" in error.message


def profiles_dir() -> Path:
    return Path(profiles.__file__).parent / "builtin"


def test_the_seven_share_one_pci_scan_per_pass_and_open_nothing_on_an_nvidia_node() -> None:
    settings = DetectSettings(manufacturers=tuple(sorted(MANUFACTURERS)), simulate="nvidia-h200x8")
    with sources.open_backends(settings) as backends:
        library_read = [b for b in backends if isinstance(b, vendor.VendorBackend)]
        assert sorted(b.manufacturer for b in library_read) == sorted(vendor.READERS)
        (census,) = {id(b.census): b.census for b in library_read}.values()
        for passes in (1, 2):
            result = detection.detect(backends)
            assert census.scans == passes
        detection.sample(backends)
        assert census.scans == 3
    assert [g.manufacturer for g in result.items] == ["nvidia"]
    assert all(b._reader is None for b in library_read)  # no adapter made, no library opened


ADAPTERS = (
    "agent.devices.libs.dcmi", "agent.devices.libs.cndev", "agent.devices.libs.rocmsmi", "agent.devices.libs.ixml",
    "agent.devices.libs.hgml", "agent.devices.libs.mxsml", "agent.devices.libs.mtml", "agent.devices.libs.nvmlabi",
    "agent.devices.ascend", "agent.devices.metax", "agent.devices.simulation.fakedcmi",
)  # fmt: skip


def test_dm_detect_on_an_nvidia_node_imports_no_vendor_adapter() -> None:
    code = (
        "import sys\n"
        "from gpustack_operator.main import main\n"
        "rc = main(['dm', 'detect', '--simulate', 'nvidia-h200x8'])\n"
        f"print('LOADED', [m for m in {ADAPTERS!r} if m in sys.modules], file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stderr


def test_a_fault_naming_no_vendor_error_is_a_usage_error(tmp_path: Path) -> None:
    text = (profiles_dir() / "metax-c500-x8.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace(
            "      xcorePercent: 0\n",
            "      xcorePercent: 0\n      faults: {mxSmlGetDeviceInfo: GPU_IS_LOST}\n",
            1,
        )
    )
    cli = [sys.executable, "-m", "gpustack_operator.main", "dm", "detect", "--simulate", str(bad)]
    result = subprocess.run(cli, check=False, capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert "unknown error 'GPU_IS_LOST'" in result.stderr and "NO_DEVICE" in result.stderr
