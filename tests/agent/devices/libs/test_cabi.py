"""The adapters through the real ``ctypes`` C calling path, against small C libraries.

The simulators answer in Python; here a C stand-in for the vendor library, written from the
documented header layouts, is compiled and loaded with :func:`agent.devices.libs.clib.load`, so
argument passing (``byref`` outputs, by-value ``uint64``, output-first pointers, returned
values and ``char*``) and structure layouts cross a real ABI boundary. Needs a C compiler.

Every output structure an adapter passes is also handed to a C stand-in that writes the size the
vendor's header documents (``agent.devices.simulation.layouts``, held to independent bindings by
``test_conformance.py``), with our structure placed right before a guard region the test checks:
an adapter structure shorter than the library's fails here instead of overrunning a node's heap.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.devices.libs import clib, cndev, dcmi, dmimig, hgml, mtml, mxsml, nvmlabi, rocmsmi
from agent.devices.simulation import layouts

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")

DCMI_C = r"""
#include <string.h>
struct chip { char type[32]; char name[32]; char ver[32]; unsigned aicore; };
struct die { unsigned w[5]; };
struct pcie { unsigned v, sv, d, sd; int domain; unsigned bus, dev, fn; char r[32]; };
struct hbm { unsigned long long size; unsigned freq; unsigned long long usage; int temp;
             unsigned bw; };
int dcmi_init(void) { return 0; }
int dcmi_get_driver_version(char *buf, int len) { strncpy(buf, "25.2.0", len); return 0; }
int dcmi_get_card_list(int *num, int *list, int len) { list[0] = 4; list[1] = 7; *num = 2;
                                                     return 0; }
int dcmi_get_device_num_in_card(int card, int *num) { *num = card == 4 ? 2 : 1; return 0; }
int dcmi_get_device_type(int card, int dev, unsigned *t) { *t = 0; return 0; }
int dcmi_get_device_logic_id(unsigned *logic, int card, int dev) { *logic = card * 10 + dev;
                                                                   return 0; }
int dcmi_get_device_phyid_from_logicid(unsigned logic, unsigned *phy) { *phy = logic + 100;
                                                                       return 0; }
int dcmi_get_device_chip_info(int card, int dev, struct chip *c) {
  strcpy(c->name, "910B2"); c->aicore = 24; return 0; }
int dcmi_get_device_die_v2(int card, int dev, int kind, struct die *d) {
  if (kind != 1) return -8001;
  for (int i = 0; i < 5; i++) d->w[i] = 0x10u * (i + 1) + card + dev; return 0; }
int dcmi_get_device_pcie_info_v2(int card, int dev, struct pcie *p) {
  p->domain = 1; p->bus = 0xc1; p->dev = 0; p->fn = dev; return 0; }
int dcmi_get_device_hbm_info(int card, int dev, struct hbm *h) {
  h->size = 65536; h->usage = 3392; return 0; }
int dcmi_get_device_power_info(int card, int dev, int *p) { if (card == 7) return -8255;
                                                            *p = 1003; return 0; }
"""

MXSML_C = r"""
#include <string.h>
struct info { unsigned id; int type; char bdf[32]; unsigned gpu, node; char uuid[96];
              int brand, mode; char name[32]; };
struct mem { unsigned long vt, vu, t, u, xt, xu; };
struct way { unsigned mv, ma, mw; };
int mxSmlInit(void) { return 0; }
unsigned mxSmlGetDeviceCount(void) { return 3; }
int mxSmlGetDeviceInfo(unsigned id, struct info *i) {
  strcpy(i->bdf, "0000:0F:00.0"); strcpy(i->uuid, "GPU-x"); strcpy(i->name, "MXC500");
  i->brand = 2; return 0; }
int mxSmlGetMemoryInfo(unsigned id, struct mem *m) { m->t = 67108864; m->u = 878592;
                                                     return 0; }
int mxSmlGetTemperatureInfo(unsigned id, int sensor, int *v) { *v = 3788; return 0; }
int mxSmlGetBoardPowerInfo(unsigned id, unsigned *size, struct way *ways) {
  if (!ways || *size < 2) { *size = 2; return 10; }
  ways[0].mw = 33870; ways[1].mw = 35411; *size = 2; return 0; }
"""

CNDEV_C = r"""
#include <string.h>
struct card_info { int version; unsigned number; };
struct uuid { int version; char uuid[37]; unsigned long long ncs; };
int cndevInit(int reserved) { return 0; }
int cndevGetDeviceCount(struct card_info *c) { if (c->version != 6) return 3; c->number = 1;
                                               return 0; }
int cndevGetDeviceHandleByIndex(int index, int *h) { *h = index + 100; return 0; }
int cndevGetUUID(struct uuid *u, int h) { if (u->version != 6 || h != 100) return 3;
                                          strcpy(u->uuid, "20a1b3c4"); return 0; }
const char *cndevGetCardNameStringByDevId(int h) { return h == 100 ? "MLU370-X8" : ""; }
"""


HGML_C = r"""
#include <string.h>
struct dev { int index; };
static struct dev devs[2] = {{0}, {1}};
struct pci { char legacy[16]; unsigned domain, bus, device, did, sid; char busid[32]; };
struct mem { unsigned long long total, free, used; };
int hgmlInitWithFlags(unsigned flags) { return 0; }
int hgmlShutdown(void) { return 0; }
int hgmlSystemGetHggcDriverVersion(int *v) { *v = 12030; return 0; }
int hgmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
int hgmlDeviceGetHandleByIndex_v2(unsigned i, struct dev **h) { *h = &devs[i]; return 0; }
int hgmlDeviceGetUUID(struct dev *h, char *buf, unsigned len) {
  if (h->index == 1) return 15; strncpy(buf, "GPU-011ef111", len); return 0; }
int hgmlDeviceGetPciInfo_v3(struct dev *h, struct pci *p) {
  strcpy(p->legacy, "0000:0B:00.0"); return 0; }
int hgmlDeviceGetMemoryInfo(struct dev *h, struct mem *m) {
  m->total = 97920ULL << 20; m->used = 1ULL << 30; return 0; }
int hgmlDeviceGetHggcComputeCapability(struct dev *h, int *major, int *minor) {
  *major = 8; *minor = 0; return 0; }
"""

MTML_C = r"""
#include <stdlib.h>
#include <string.h>
struct lib { int magic; }; struct dev { int index; }; struct mem { struct dev *d; };
static int live = 0;
int mtmlLibraryInit(struct lib **l) { *l = malloc(sizeof **l); (*l)->magic = 42; live++;
                                      return 0; }
int mtmlLibraryShutDown(struct lib *l) { if (l->magic != 42) return 3; free(l); live--;
                                         return 0; }
int mtmlLibraryCountDevice(struct lib *l, unsigned *n) { *n = l->magic == 42 ? 1 : 0;
                                                          return 0; }
int mtmlLibraryInitDeviceByIndex(struct lib *l, unsigned i, struct dev **d) {
  *d = malloc(sizeof **d); (*d)->index = i; live++; return 0; }
int mtmlLibraryFreeDevice(struct dev *d) { free(d); live--; return 0; }
int mtmlDeviceInitMemory(struct dev *d, struct mem **m) { *m = malloc(sizeof **m);
                                                         (*m)->d = d; live++; return 0; }
int mtmlDeviceFreeMemory(struct mem *m) { free(m); live--; return 0; }
int mtmlMemoryGetTotal(struct mem *m, unsigned long long *v) { *v = 49152ULL << 20; return 0; }
int mtmlMemoryGetUsed(struct mem *m, unsigned long long *v) { *v = 512ULL << 20; return 0; }
int live_handles(void) { return live; }
"""

ROCMSMI_C = r"""
#include <stdint.h>
int rsmi_init(uint64_t flags) { return flags == 0 ? 0 : 1; }
int rsmi_dev_unique_id_get(uint32_t i, uint64_t *v) { *v = 0x0000f95cee823041ULL; return 0; }
int rsmi_dev_pci_id_get(uint32_t i, uint64_t *v) {
  *v = (1ULL << 32) | (1ULL << 28) | (0x9c << 8) | (3 << 3) | 1; return 0; }
int rsmi_dev_temp_metric_get(uint32_t i, uint32_t sensor, int metric, int64_t *v) {
  if (sensor == 0) return 2; *v = 64500; return 0; }
int rsmi_dev_power_ave_get(uint32_t i, uint32_t sensor, uint64_t *v) {
  *v = 110000000ULL; return 0; }
"""


def _build(tmp_path: Path, name: str, source: str) -> str:
    c_file = tmp_path / f"{name}.c"
    c_file.write_text(source)
    library = tmp_path / f"{name}.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O0", "-o", str(library), str(c_file)],
        check=True,
        capture_output=True,
    )
    return str(library)


def test_dcmi_through_the_c_abi(tmp_path: Path) -> None:
    path = _build(tmp_path, "libdcmi", DCMI_C)
    lib = dcmi.Dcmi(clib.load("DCMI", [str(tmp_path / "absent.so"), path], dcmi.CODES))
    lib.init()
    assert lib.driver_version() == "25.2.0"
    assert lib.card_list() == [4, 7]
    assert [lib.device_count(4), lib.device_count(7)] == [2, 1]
    assert lib.logic_id(4, 1) == 41 and lib.physical_id(41) == 141  # output pointer first
    assert lib.chip_info(4, 0) == ("910B2", 24)
    assert lib.die_id(4, 1) == (0x15, 0x25, 0x35, 0x45, 0x55)
    assert lib.pci_bus_id(4, 1) == "0001:c1:00.1"
    assert lib.memory(4, 0) == (65536, 3392)
    assert lib.power_deciwatts(4, 0) == 1003
    with pytest.raises(clib.LibUnsupported):
        lib.power_deciwatts(7, 0)
    with pytest.raises(clib.LibUnsupported, match="dcmi_get_device_temperature"):
        lib.temperature(4, 0)  # not exported by this library


def test_mxsml_through_the_c_abi(tmp_path: Path) -> None:
    lib = mxsml.Mxsml(clib.load("MXSML", [_build(tmp_path, "libmxsml", MXSML_C)], mxsml.CODES))
    lib.init()
    assert lib.device_count() == 3  # a return value, not a status
    assert lib.device_info(0) == ("GPU-x", "MXC500", "0000:0f:00.0", 2)
    assert lib.memory(0) == (65536, 858)
    assert lib.temperature(0) == 37
    assert lib.power_mw(0) == 69281


def test_cndev_through_the_c_abi(tmp_path: Path) -> None:
    lib = cndev.Cndev(clib.load("CNDev", [_build(tmp_path, "libcndev", CNDEV_C)], cndev.CODES))
    lib.init()
    assert lib.device_count() == 1  # the version stamp reached C
    handle = lib.handle(0)
    assert handle == 100
    assert lib.uuid(handle) == "MLU-20a1b3c4"
    assert lib.name(handle) == "MLU370-X8"  # a char* return, through restype


def test_a_library_no_candidate_loads_names_every_path(tmp_path: Path) -> None:
    with pytest.raises(clib.LibUnavailable) as raised:
        clib.load("X", ["libno-such-vendor.so", str(tmp_path / "nope.so")], dcmi.CODES)
    assert (
        "libno-such-vendor.so" in raised.value.detail and "nope.so: absent" in raised.value.detail
    )


def test_hgml_handles_are_pointers_passed_back_by_value(tmp_path: Path) -> None:
    lib = hgml.binding(clib.load("HGML", [_build(tmp_path, "libhgml", HGML_C)], nvmlabi.CODES))
    lib.init()
    assert lib.device_count() == 2 and lib.runtime_version() == 12030
    first = lib.handle(0)
    assert lib.uuid(first) == "GPU-011ef111"
    assert lib.pci_bus_id(first) == "0000:0b:00.0"
    assert lib.memory(first) == (97920 << 20, 1 << 30)
    assert lib.compute_capability(first) == (8, 0)
    with pytest.raises(clib.LibLost):
        lib.uuid(lib.handle(1))


def test_mtml_objects_are_opened_and_freed_through_c(tmp_path: Path) -> None:
    raw = clib.load("MTML", [_build(tmp_path, "libmtml", MTML_C)], mtml.CODES)
    lib = mtml.Mtml(raw)
    lib.init()
    assert lib.device_count() == 1  # the library handle reached C intact
    device = lib.device(0)
    assert lib.memory(device) == (49152 << 20, 512 << 20)
    assert raw.live_handles() == 2  # library + device; the memory handle is already freed
    lib.free_device(device)
    lib.shutdown()
    assert raw.live_handles() == 0


def test_rocm_smi_through_the_c_abi(tmp_path: Path) -> None:
    lib = rocmsmi.RocmSmi(
        clib.load("ROCm SMI", [_build(tmp_path, "librsmi", ROCMSMI_C)], rocmsmi.CODES)
    )
    lib.init()  # a uint64 flag of 0
    assert lib.unique_id(0) == 0x0000F95CEE823041
    assert lib.pci_bus_id(0) == "0001:9c:03.1"  # partition bit 28 dropped
    assert lib.temperature_mc(0) == 64500  # sensor 0 unsupported, sensor 1 answers
    assert lib.power_uw(0) == 110_000_000


FULL_SIZE_C = r"""
#include <string.h>
/* Each writes the whole structure the vendor header documents, reserved tail included, as the
   real library does: cndevMemoryInfoV2_t 176, cndevPCIeInfoV2_t 64 (cndev.h), MtmlPciInfo 104
   (mtml.h); the sizes are checked against pycndev and pymtml in test_conformance.py. */
int cndevGetMemoryUsageV2(void *info, int dev) {
  memset(info, 0x5a, 176); ((long long *)info)[0] = 49152; ((long long *)info)[1] = 1024;
  return 0; }
int cndevGetPCIeInfoV2(void *info, int dev) {
  memset(info, 0, 64); unsigned *u = info; u[3] = 0; u[4] = 0x3b; u[5] = 0; u[6] = 0;
  return 0; }
int mtmlDeviceGetPciInfo(void *dev, void *info) {
  memset(info, 0, 104); strcpy(info, "00000000:5f:00.0"); return 0; }
"""

GUARD = b"\xee" * 4096
"""Larger than any structure here, so a write past ours lands in it, never in the heap."""


def _guarded(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[bytearray]:
    """Replace ``module.name`` by a factory placing each instance right before a guard region."""
    struct = getattr(module, name)
    arenas: list[bytearray] = []

    def make() -> object:
        arena = bytearray(ctypes.sizeof(struct)) + bytearray(GUARD)
        arenas.append(arena)
        return struct.from_buffer(arena)

    monkeypatch.setattr(module, name, make)
    return arenas


def test_c_stand_ins_writing_the_documented_size_stay_inside_our_structures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the old 48/32/80-byte structures the stand-ins overwrite the guard region."""
    path = _build(tmp_path, "libfullsize", FULL_SIZE_C)
    watched = [
        _guarded(monkeypatch, cndev, "MemoryInfoV2"),
        _guarded(monkeypatch, cndev, "PcieInfoV2"),
        _guarded(monkeypatch, mtml, "PciInfo"),
    ]
    library = clib.load("stand-in", [path], cndev.CODES)
    assert cndev.Cndev(library).memory(100) == (49152, 1024)
    assert cndev.Cndev(library).pci_bus_id(100) == "0000:3b:00.0"
    assert mtml.Mtml(library).pci_bus_id(ctypes.c_void_p(None)) == "0000:5f:00.0"
    arenas = [arena for made in watched for arena in made]
    assert len(arenas) == 3
    for arena in arenas:
        assert bytes(arena[-len(GUARD) :]) == GUARD, "the library wrote past our structure"


# Every output structure an adapter passes, written in full by a C stand-in: (C function, which
# argument is the structure, the documented layout, our class as module and attribute).
WRITES: list[tuple[str, int, str, object, str]] = [
    ("cndevGetDeviceCount", 0, "cndevCardInfo_t", cndev, "CardInfo"),
    ("cndevGetUUID", 0, "cndevUUID_t", cndev, "Uuid"),
    ("cndevGetPCIeInfoV2", 0, "cndevPCIeInfoV2_t", cndev, "PcieInfoV2"),
    ("cndevGetVersionInfo", 0, "cndevVersionInfo_t", cndev, "VersionInfo"),
    ("cndevGetMemoryUsageV2", 0, "cndevMemoryInfoV2_t", cndev, "MemoryInfoV2"),
    ("cndevGetDeviceUtilizationInfo", 0, "cndevUtilizationInfo_t", cndev, "UtilizationInfo"),
    ("cndevGetTemperatureInfo", 0, "cndevTemperatureInfo_t", cndev, "TemperatureInfo"),
    ("cndevGetDevicePowerInfo", 0, "cndevDevicePowerInfo_t", cndev, "PowerInfo"),
    ("dcmi_get_device_chip_info", 2, "dcmi_chip_info", dcmi, "ChipInfo"),
    ("dcmi_get_device_die_v2", 3, "dcmi_die_id", dcmi, "DieId"),
    ("dcmi_get_device_pcie_info_v2", 2, "dcmi_pcie_info_all", dcmi, "PcieInfoAll"),
    ("dcmi_get_device_hbm_info", 2, "dcmi_hbm_info", dcmi, "HbmInfo"),
    ("dcmi_get_device_memory_info_v3", 2, "dcmi_get_memory_info_stru", dcmi, "MemoryInfoV3"),
    ("dcmiv2_get_device_chip_info", 1, "dcmi_chip_info_v2", dcmi, "ChipInfoV2"),
    ("mtmlDeviceGetPciInfo", 1, "MtmlPciInfo", mtml, "PciInfo"),
    ("mxSmlGetDeviceInfo", 1, "mxSmlDeviceInfo_t", mxsml, "DeviceInfo"),
    ("mxSmlGetMemoryInfo", 1, "mxSmlMemoryInfo_t", mxsml, "MemoryInfo"),
    ("hgmlDeviceGetPciInfo_v3", 1, "nvmlPciInfo_t", nvmlabi, "PciInfo"),
    ("hgmlDeviceGetMemoryInfo", 1, "nvmlMemory_t", nvmlabi, "Memory"),
    ("hgmlDeviceGetUtilizationRates", 1, "nvmlUtilization_t", nvmlabi, "Utilization"),
    ("hgmlDeviceGetGpuInstanceProfileInfo", 2, "nvmlGpuInstanceProfileInfo_t", nvmlabi,
     "GpuInstanceProfileInfo"),
    ("nvmlDeviceGetGpuInstanceProfileInfo", 2, "dmiGpuInstanceProfileInfo_t", dmimig,
     "ProfileInfo"),
]  # fmt: skip
QUIET = ("dcmiv2_init", "hgmlDeviceGetGpuInstancePossiblePlacements_v2")
"""Called on the way, writing nothing (the placement count stays 0)."""


def _full_size_source() -> str:
    """One C function per entry of :data:`WRITES`, zeroing the documented size (from
    ``layouts.SIZES``, which the conformance suite holds to the oracles, never from our class)."""
    lines = ["#include <string.h>"]
    for name, position, layout, _, _ in WRITES:
        size = layouts.SIZES[layout].size
        lines.append(
            f"int {name}(void *a0, void *a1, void *a2, void *a3) "
            f"{{ memset(a{position}, 0, {size}); return 0; }}"
        )
    lines += [f"int {name}(void) {{ return 0; }}" for name in QUIET]
    lines.append("int nvmlDeviceGetHandleByPciBusId(char *bus, void **h) { *h = 0; return 0; }")
    return "\n".join(lines) + "\n"


def test_no_adapter_structure_is_smaller_than_the_library_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each adapter call is made against a stand-in writing the structure's full documented
    size, into our structure placed before a guard region; no guard may be touched."""
    arenas = {(m, a): _guarded(monkeypatch, m, a) for _, _, _, m, a in WRITES}
    library = clib.load("full-size", [_build(tmp_path, "libfull", _full_size_source())], dcmi.CODES)
    c = cndev.Cndev(library)
    for read in (c.device_count, lambda: c.uuid(1), lambda: c.pci_bus_id(1),
                 lambda: c.driver_version(1), lambda: c.memory(1), lambda: c.utilization(1),
                 lambda: c.temperature(1), lambda: c.power(1)):  # fmt: skip
        read()
    d = dcmi.Dcmi(library)
    d.chip_info(0, 0), d.die_id(0, 0), d.pci_bus_id(0, 0), d.memory(0, 0)  # HBM 0 → v3 too
    d.v2 = True
    d.chip_info(0, 0)
    mtml.Mtml(library).pci_bus_id(ctypes.c_void_p(None))
    m = mxsml.Mxsml(library)
    m.device_info(0), m.memory(0)
    h = nvmlabi.NvmlAbi(library, prefix="hgml", cuda="Hggc")
    h.pci_bus_id(None), h.memory(None), h.utilization(None), h.gpu_instance_profiles(None)
    assert dmimig.DmiMig(library).profiles("0000:1d:00.0")  # four zeroed profiles, all kept
    for (_, attr), made in arenas.items():
        assert made, f"{attr}: never passed to the stand-in"
        for arena in made:
            assert bytes(arena[-len(GUARD) :]) == GUARD, f"the library wrote past {attr}"
