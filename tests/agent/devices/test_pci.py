"""The PCI check and the helpers every backend shares (addresses, CPU lists, bitmasks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.devices import pci
from agent.devices.hostfs import HostFS


def _function(root: Path, chain: list[str], vendor: str, cls: str, **attrs: str) -> None:
    """Lay one PCI function out as the kernel does: a device dir plus a relative bus link."""
    device = root / "sys/devices/pci0000:00" / "/".join(chain)
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(cls + "\n")
    (device / "device").write_text("0x2335\n")
    for name, value in attrs.items():
        (device / name).write_text(value + "\n")
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(device, links)
    (links / chain[-1]).symlink_to(target)


def test_scan_keeps_only_the_vendors_accelerator_functions(tmp_path: Path) -> None:
    _function(
        tmp_path,
        ["0000:17:00.0", "0000:18:00.0"],
        "0x10de",
        "0x030200",
        numa_node="1",
        local_cpulist="48-95",
    )
    _function(tmp_path, ["0000:18:00.1"], "0x10de", "0x040300")  # HDMI audio
    _function(tmp_path, ["0000:05:00.0"], "0x10de", "0x068000")  # NVSwitch bridge
    _function(tmp_path, ["0000:06:00.0"], "0x1002", "0x030000")  # another vendor
    _function(tmp_path, ["0000:07:00.0"], "0x10de", "0x120000", numa_node="-1")

    found = pci.scan(HostFS(tmp_path), 0x10DE)

    assert [f.bdf for f in found] == ["0000:07:00.0", "0000:18:00.0"]
    gpu = found[1]
    assert (gpu.vendor, gpu.device, gpu.pci_class) == (0x10DE, 0x2335, 0x030200)
    assert gpu.numa_node == 1 and gpu.cpu_list == "48-95"
    assert gpu.bridges == ("0000:17:00.0",)
    assert found[0].numa_node is None, "numa_node -1 means no NUMA information"


def test_scan_of_a_machine_without_pci_sysfs_is_empty(tmp_path: Path) -> None:
    assert pci.scan(HostFS(tmp_path), 0x10DE) == []


def test_bridges_are_outermost_first_and_absolute_links_stay_inside_the_root(
    tmp_path: Path,
) -> None:
    device = tmp_path / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0"
    device.mkdir(parents=True)
    links = tmp_path / "sys/bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:02:00.0").symlink_to(
        "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0"
    )
    assert pci.bridges_of(HostFS(tmp_path), "0000:02:00.0") == ("0000:00:01.0", "0000:01:00.0")


@pytest.mark.parametrize(
    ("cls", "accelerator"),
    [
        (0x030000, True),
        (0x030200, True),
        (0x038000, True),
        (0x120000, True),
        (0x0B4000, True),
        (0x068000, False),
        (0x040300, False),
        (0x0C0330, False),
        (0x020000, False),
    ],
)
def test_accelerator_classes(cls: int, accelerator: bool) -> None:
    assert pci.is_accelerator_class(cls) is accelerator


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("0000:AB:00.0", "0000:ab:00.0"),
        ("00000001:04:00.0", "0001:04:00.0"),
        ("18:00.0", "0000:18:00.0"),
    ],
)
def test_normalize_bdf(raw: str, normal: str) -> None:
    assert pci.normalize_bdf(raw) == normal


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ([], ""),
        ([0], "0"),
        ([0, 1, 2, 3], "0-3"),
        ([3, 1, 0, 2, 8, 10, 11], "0-3,8,10-11"),
        ([5, 5, 6], "5-6"),
    ],
)
def test_format_cpu_list(cpus: list[int], text: str) -> None:
    assert pci.format_cpu_list(cpus) == text


def test_bits_to_numbers_spans_words() -> None:
    assert pci.bits_to_numbers([0b1011, 1 << 63, 1]) == [0, 1, 3, 127, 128]


def test_hostfs_reads_under_its_root(tmp_path: Path) -> None:
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.16.13\n")
    (tmp_path / "hex").write_text("0x1002")
    (tmp_path / "junk").write_text("zz")
    host = HostFS(tmp_path)
    assert host.read_text("/proc/sys/kernel/osrelease") == "6.16.13"
    assert host.read_text("/absent") is None
    assert host.read_int("/hex") == 0x1002
    assert host.read_int("/junk") is None
    assert host.list_dir("/proc/sys") == ["kernel"]
    assert host.list_dir("/nothing") == []


def test_scan_vendors_covers_several_vendors_in_one_pass(tmp_path: Path) -> None:
    _function(tmp_path, ["0000:05:00.0"], "0x19e5", "0x120000")  # an Ascend NPU
    _function(tmp_path, ["0000:06:00.0"], "0x1d94", "0x038000")  # a Hygon DCU
    _function(tmp_path, ["0000:07:00.0"], "0x19e5", "0x020000")  # the same vendor's NIC
    found = pci.scan_vendors(HostFS(tmp_path), {0x19E5, 0x1D94, 0xCABC})
    assert {v: [f.bdf for f in fs] for v, fs in found.items()} == {
        0x19E5: ["0000:05:00.0"],
        0x1D94: ["0000:06:00.0"],
    }
