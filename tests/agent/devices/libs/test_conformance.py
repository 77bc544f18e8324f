"""Our vendor-library adapters checked against bindings we did not write (the oracles).

The simulators were written by this project, so a mistake made twice (adapter and simulator)
passes every other test. Here the oracle is independent:

- **GR**: gpustack-runtime 0.2.6, GPUStack's own Python bindings (``gpustack_runtime.detector.py*``);
- **PYMTML**: mthreads-ml-py 2.4.3 (``pymtml``), Moore Threads' binding;
- **PYNVML**: nvidia-ml-py (``pynvml``), NVIDIA's binding (the NVML clones' layouts).

Checked: every ``ctypes.Structure`` we pass (size, each field's offset and width); the documented
sizes the simulators write; every C function we call (it exists in the oracle, with the same
number of arguments, pointers where the oracle passes pointers, to objects of the same size);
the library search order with its environment overrides; ids and families as GPUStack renders
them. Each case names its oracle. Units: ``test_oracle_readings.py`` (the same simulated library
read through the oracle and through us); profiles: ``test_oracle_samples.py``.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import importlib
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pymtml
import pynvml
import pytest
from gpustack_runtime.detector import ascend as gr_ascend
from gpustack_runtime.detector import (
    pycndev,
    pydcmi,
    pydmi,
    pyhgml,
    pyixml,
    pymxsml,
    pyrocmsmi,
)

from agent.devices import ascend, hygon
from agent.devices.hostfs import HostFS
from agent.devices.libs import cndev, dcmi, dmimig, ixml, mtml, mxsml, nvmlabi, rocmsmi
from agent.devices.simulation import layouts

# -- structures --------------------------------------------------------------------------------

STRUCTS: list[tuple[type[ctypes.Structure], ModuleType, str]] = [
    (cndev.CardInfo, pycndev, "c_cndevCardInfo_t"),
    (cndev.Uuid, pycndev, "c_cndevUUID_t"),
    (cndev.CardName, pycndev, "c_cndevCardName_t"),
    (cndev.MemoryInfoV2, pycndev, "c_cndevMemoryInfoV2_t"),
    (cndev.PcieInfoV2, pycndev, "c_cndevPCIeInfoV2_t"),
    (cndev.VersionInfo, pycndev, "c_cndevVersionInfo_t"),
    (cndev.UtilizationInfo, pycndev, "c_cndevUtilizationInfo_t"),
    (cndev.TemperatureInfo, pycndev, "c_cndevTemperatureInfo_t"),
    (cndev.PowerInfo, pycndev, "c_cndevDevicePowerInfo_t"),
    (dcmi.ChipInfo, pydcmi, "c_dcmi_chip_info"),
    (dcmi.ChipInfoV2, pydcmi, "c_dcmi_chip_info_v2"),
    (dcmi.DieId, pydcmi, "c_dcmi_die_id"),
    (dcmi.PcieInfoAll, pydcmi, "c_dcmi_pcie_info_all"),
    (dcmi.HbmInfo, pydcmi, "c_dcmi_hbm_info"),
    (dcmi.MemoryInfoV3, pydcmi, "c_dcmi_get_memory_info_stru"),
    (dmimig.ProfileInfo, pydmi, "_dmiGpuInstanceProfileInfo_t"),
    (mtml.PciInfo, pymtml, "c_mtmlPciInfo_t"),
    (mxsml.DeviceInfo, pymxsml, "c_mxsmlDeviceInfo_t"),
    (mxsml.MemoryInfo, pymxsml, "c_mxsmlMemoryInfo_t"),
    (mxsml.BoardWay, pymxsml, "c_mxSmlBoardWayElectricInfo_t"),
    (nvmlabi.PciInfo, pyixml, "nvmlPciInfo_t"),
    (nvmlabi.Memory, pyixml, "c_nvmlMemory_t"),
    (nvmlabi.Utilization, pyixml, "c_nvmlUtilization_t"),
    (nvmlabi.GpuInstanceProfileInfo, pyixml, "c_nvmlGpuInstanceProfileInfo_t"),
    (nvmlabi.Placement, pyixml, "c_nvmlGpuInstancePlacement_t"),
    (nvmlabi.PciInfo, pyhgml, "hgmlPciInfo_t"),
    (nvmlabi.Memory, pyhgml, "c_hgmlMemory_t"),
    (nvmlabi.Utilization, pyhgml, "c_hgmlUtilization_t"),
    (nvmlabi.GpuInstanceProfileInfo, pyhgml, "c_hgmlGpuInstanceProfileInfo_t"),
    (nvmlabi.Placement, pyhgml, "c_hgmlGpuInstancePlacement_t"),
    (nvmlabi.PciInfo, pynvml, "nvmlPciInfo_t"),
    (nvmlabi.GpuInstanceProfileInfo, pynvml, "c_nvmlGpuInstanceProfileInfo_t"),
]


def _layout(struct: type[ctypes.Structure]) -> list[tuple[str, int, int]]:
    return [
        (f[0], getattr(struct, f[0]).offset, getattr(struct, f[0]).size) for f in struct._fields_
    ]


@pytest.mark.parametrize(
    ("ours", "oracle", "name"), STRUCTS, ids=[f"{o.__name__}:{n}" for _, o, n in STRUCTS]
)
def test_each_structure_is_laid_out_as_the_oracle_binds_it(
    ours: type[ctypes.Structure], oracle: ModuleType, name: str
) -> None:
    theirs = getattr(oracle, name)
    assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), f"{oracle.__name__}.{name}"
    assert [(o, w) for _, o, w in _layout(ours)] == [(o, w) for _, o, w in _layout(theirs)]


def test_every_structure_an_adapter_defines_has_an_oracle() -> None:
    checked = {s for s, _, _ in STRUCTS}
    for module in (cndev, dcmi, dmimig, mtml, mxsml, nvmlabi):
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, ctypes.Structure) and value.__module__ == module.__name__:
                assert value in checked, f"{module.__name__}.{value.__name__} has no oracle"


DOCUMENTED = {
    "cndevCardInfo_t": (pycndev, "c_cndevCardInfo_t"),
    "cndevUUID_t": (pycndev, "c_cndevUUID_t"),
    "cndevCardName_t": (pycndev, "c_cndevCardName_t"),
    "cndevMemoryInfoV2_t": (pycndev, "c_cndevMemoryInfoV2_t"),
    "cndevPCIeInfoV2_t": (pycndev, "c_cndevPCIeInfoV2_t"),
    "cndevVersionInfo_t": (pycndev, "c_cndevVersionInfo_t"),
    "cndevUtilizationInfo_t": (pycndev, "c_cndevUtilizationInfo_t"),
    "cndevTemperatureInfo_t": (pycndev, "c_cndevTemperatureInfo_t"),
    "cndevDevicePowerInfo_t": (pycndev, "c_cndevDevicePowerInfo_t"),
    "dcmi_chip_info": (pydcmi, "c_dcmi_chip_info"),
    "dcmi_chip_info_v2": (pydcmi, "c_dcmi_chip_info_v2"),
    "dcmi_die_id": (pydcmi, "c_dcmi_die_id"),
    "dcmi_pcie_info_all": (pydcmi, "c_dcmi_pcie_info_all"),
    "dcmi_hbm_info": (pydcmi, "c_dcmi_hbm_info"),
    "dcmi_get_memory_info_stru": (pydcmi, "c_dcmi_get_memory_info_stru"),
    "MtmlPciInfo": (pymtml, "c_mtmlPciInfo_t"),
    "mxSmlDeviceInfo_t": (pymxsml, "c_mxsmlDeviceInfo_t"),
    "mxSmlMemoryInfo_t": (pymxsml, "c_mxsmlMemoryInfo_t"),
    "mxSmlBoardWayElectricInfo_t": (pymxsml, "c_mxSmlBoardWayElectricInfo_t"),
    "dmiGpuInstanceProfileInfo_t": (pydmi, "_dmiGpuInstanceProfileInfo_t"),
    "nvmlPciInfo_t": (pynvml, "nvmlPciInfo_t"),
    "nvmlMemory_t": (pynvml, "c_nvmlMemory_t"),
    "nvmlUtilization_t": (pynvml, "c_nvmlUtilization_t"),
    "nvmlGpuInstanceProfileInfo_t": (pynvml, "c_nvmlGpuInstanceProfileInfo_t"),
    "nvmlGpuInstancePlacement_t": (pynvml, "c_nvmlGpuInstancePlacement_t"),
}


@pytest.mark.parametrize("layout", sorted(layouts.SIZES))
def test_the_size_a_simulator_writes_is_the_oracles(layout: str) -> None:
    oracle, name = DOCUMENTED[layout]
    assert layouts.SIZES[layout].size == ctypes.sizeof(getattr(oracle, name)), layouts.SIZES[
        layout
    ].source


# -- C calls -----------------------------------------------------------------------------------


class Recorder:
    """A stand-in library: every attribute is a C function that records its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., int]:
        def function(*args: Any) -> int:
            self.calls.append((name, args))
            return 0

        return function


def _kind(arg: Any) -> tuple[str, int]:
    """What crosses the ABI: ``("ptr", size of the pointee)``, ``("buf", 0)`` or ``("val", 0)``."""
    if type(arg).__name__ == "CArgObject":
        if isinstance(arg._obj, ctypes.Array):
            return "buf", 0  # a pointer to a char array is the array's address
        return "ptr", ctypes.sizeof(arg._obj)
    if isinstance(arg, ctypes.Array):
        return "buf", 0
    return "val", 0


def _oracle_calls(oracle: ModuleType) -> dict[str, list[tuple[str, int]]]:
    """Each C function the oracle binds → the kinds of the arguments it passes, read from its
    source: ``fn = _…GetFunctionPointer("name")`` then ``fn(…)`` in the same function.

    A wrapper may look up two names on two branches (``nvmlDeviceGetMemoryInfo`` and its
    ``_v2``) before one call, each with its own structure: each name is paired with the locals
    as they stood when it was looked up.
    """
    tree = ast.parse(Path(inspect.getfile(oracle)).read_text())
    found: dict[str, list[tuple[str, int]]] = {}
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef):
            _bind(func, oracle, found)
    return found


def _bind(
    func: ast.FunctionDef, oracle: ModuleType, found: dict[str, list[tuple[str, int]]]
) -> None:
    made: dict[str, list[tuple[int, ast.expr]]] = {}
    pointers: dict[str, list[tuple[int, str]]] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if not isinstance(target, ast.Name):
                continue
            made.setdefault(target.id, []).append((node.lineno, value))
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id.endswith("GetFunctionPointer")
                and value.args
                and isinstance(value.args[0], ast.Constant)
            ):
                pointers.setdefault(target.id, []).append((node.lineno, str(value.args[0].value)))
    calls = sorted(
        (n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)),
        key=lambda n: n.lineno,
    )
    consumed: dict[str, int] = {}
    for call in calls:
        var = call.func.id if isinstance(call.func, ast.Name) else ""
        since = consumed.get(var, 0)
        for line, name in pointers.get(var, []):
            if since < line < call.lineno:
                at = {k: _latest(v, line, call.lineno) for k, v in made.items()}
                local = {k: e for k, e in at.items() if e is not None}
                found.setdefault(name, [_oracle_kind(a, local, oracle) for a in call.args])
        if pointers.get(var):
            consumed[var] = call.lineno


def _latest(assigned: list[tuple[int, ast.expr]], line: int, call: int) -> ast.expr | None:
    """A local's value as of ``line`` (else as of the call): the last assignment before it."""
    for limit in (line, call):
        before = [(n, e) for n, e in assigned if n <= limit]
        if before:
            return max(before, key=lambda x: x[0])[1]
    return None


def _oracle_kind(arg: ast.expr, made: dict[str, ast.expr], oracle: ModuleType) -> tuple[str, int]:
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "byref":
        inner = arg.args[0]
        if isinstance(inner, ast.Name) and inner.id in made:
            if _is_array(made[inner.id]):
                return "buf", 0
            return "ptr", _size_of(made[inner.id], oracle)
        return "ptr", -1
    if isinstance(arg, ast.Name) and arg.id in made and _is_array(made[arg.id]):
        return "buf", 0
    if isinstance(arg, ast.Name) and arg.id not in made:
        return "any", 0  # the wrapper's own parameter, passed through: its caller decides
    return "val", 0


def _is_array(made: ast.expr) -> bool:
    """``create_string_buffer(n)`` or ``(c_type * n)()``."""
    if not isinstance(made, ast.Call):
        return False
    if isinstance(made.func, ast.Name):
        return made.func.id == "create_string_buffer"
    return isinstance(made.func, ast.BinOp)


def _size_of(made: ast.expr, oracle: ModuleType) -> int:
    """``sizeof`` of what ``made`` constructs (``c_uint()``, ``c_cndevUUID_t()``), -1 unknown."""
    if isinstance(made, ast.Call) and isinstance(made.func, ast.Name):
        kind = getattr(oracle, made.func.id, None) or getattr(ctypes, made.func.id, None)
        if isinstance(kind, type) and issubclass(kind, ctypes._SimpleCData | ctypes.Structure):
            return ctypes.sizeof(kind)
    return -1


def _ours(build: Callable[[Recorder], Any], steps: list[Callable[[Any], Any]]) -> Recorder:
    recorder = Recorder()
    binding = build(recorder)
    for step in steps:
        with contextlib.suppress(Exception):  # a zeroed answer may be refused; it is recorded
            step(binding)
    return recorder


def _cndev_steps() -> list[Callable[[Any], Any]]:
    return [
        lambda b: b.init(), lambda b: b.device_count(), lambda b: b.handle(0), lambda b: b.uuid(1),
        lambda b: b.pci_bus_id(1), lambda b: b.driver_version(1), lambda b: b.memory(1),
        lambda b: b.utilization(1), lambda b: b.temperature(1), lambda b: b.power(1),
        lambda b: b.release(),
    ]  # fmt: skip


def _dcmi_steps(v2: bool) -> list[Callable[[Any], Any]]:
    def mode(b: Any) -> None:
        b.v2 = v2

    return [
        mode, lambda b: b.driver_version(), lambda b: b.card_list(), lambda b: b.device_count(0),
        lambda b: b.unit_type(0, 0), lambda b: b.logic_id(0, 0), lambda b: b.physical_id(0),
        lambda b: b.chip_info(0, 0), lambda b: b.die_id(0, 0), lambda b: b.pci_bus_id(0, 0),
        lambda b: b.memory(0, 0), lambda b: b.aicore_utilization(0, 0),
        lambda b: b.temperature(0, 0), lambda b: b.power_deciwatts(0, 0),
        lambda b: b.card_device_of(0), lambda b: b.share_enabled(0, 0),
    ]  # fmt: skip


def _rocm_steps() -> list[Callable[[Any], Any]]:
    return [
        lambda b: b.init(), lambda b: b.device_count(), lambda b: b.unique_id(0),
        lambda b: b.pci_bus_id(0), lambda b: b.name(0), lambda b: b.memory(0),
        lambda b: b.busy_percent(0), lambda b: b.temperature_mc(0), lambda b: b.power_uw(0),
    ]  # fmt: skip


def _mtml_steps() -> list[Callable[[Any], Any]]:
    def walk(b: Any) -> None:
        b.init()
        b.driver_version()
        b.device_count()
        device = b.device(0)
        for read in (b.uuid, b.name, b.pci_bus_id, b.gpu_cores, b.power_mw, b.memory, b.gpu):
            read(device)
        b.free_device(device)
        b.shutdown()

    return [walk]


def _mxsml_steps() -> list[Callable[[Any], Any]]:
    return [
        lambda b: b.init(), lambda b: b.maca_version(), lambda b: b.device_info(0),
        lambda b: b.driver_version(0), lambda b: b.memory(0), lambda b: b.temperature(0),
        lambda b: b.power_mw(0), lambda b: b.utilization(0, mxsml.BRAND_N),
    ]  # fmt: skip


def _mig_steps() -> list[Callable[[Any], Any]]:
    return [lambda b: b.mig_mode(), lambda b: b.profiles("0000:1d:00.0")]


ELSEWHERE = {
    "dcmi_get_device_share_enable": "dcmi_interface_api.h; the reference's binding/dcmi",
    "dcmi_set_device_share_enable": "dcmi_interface_api.h; the reference's binding/dcmi",
}
"""Calls no installed oracle binds, and the source that documents each (checked by hand)."""

CALLS: list[tuple[str, Callable[[Recorder], Any], list[Callable[[Any], Any]], ModuleType]] = [
    ("cndev", cndev.Cndev, _cndev_steps(), pycndev),
    ("dcmi-v1", dcmi.Dcmi, _dcmi_steps(False), pydcmi),
    ("dcmi-v2", dcmi.Dcmi, _dcmi_steps(True), pydcmi),
    ("rocm-smi", rocmsmi.RocmSmi, _rocm_steps(), pyrocmsmi),
    ("mtml", mtml.Mtml, _mtml_steps(), pymtml),
    ("mxsml", mxsml.Mxsml, _mxsml_steps(), pymxsml),
    ("dmi-mig", dmimig.DmiMig, _mig_steps(), pydmi),
]


@pytest.mark.parametrize(
    ("label", "build", "steps", "oracle"), CALLS, ids=[f"{c[0]}:{c[3].__name__}" for c in CALLS]
)
def test_every_c_call_exists_in_the_oracle_with_the_same_arguments(
    label: str,
    build: Callable[[Recorder], Any],
    steps: list[Callable[[Any], Any]],
    oracle: ModuleType,
) -> None:
    bound = _oracle_calls(oracle)
    recorded = _ours(build, steps).calls
    assert recorded, label
    for name, args in recorded:
        if name not in ELSEWHERE:
            _same_call(name, args, bound, oracle)


def _same_call(
    name: str, args: tuple[Any, ...], bound: dict[str, list[tuple[str, int]]], oracle: ModuleType
) -> None:
    """Our call ``name(*args)`` is one the oracle makes: same count, pointers where it passes
    pointers, to objects of the size it passes (where its source says)."""
    assert name in bound, f"{name}: not bound by {oracle.__name__}"
    theirs, ours = bound[name], [_kind(a) for a in args]
    assert len(ours) == len(theirs), (
        f"{name}: {len(ours)} arguments, {oracle.__name__} passes {len(theirs)}"
    )
    for position, (mine, their) in enumerate(zip(ours, theirs, strict=True)):
        where = f"{name} argument {position} vs {oracle.__name__}"
        if their[0] == "any":
            continue
        assert (mine[0] == "ptr") == (their[0] == "ptr"), where
        if their[0] == "ptr" and their[1] > 0:
            assert mine[1] == their[1], f"{where}: pointee {mine[1]} bytes, oracle {their[1]}"


def test_the_nvml_clones_call_what_pyixml_and_pyhgml_bind() -> None:
    """The NVML-shaped calls, as the other adapters', in IXML (pyixml) and HGML (pyhgml)."""
    for prefix, cuda, oracle in (("nvml", "Cuda", pyixml), ("hgml", "Hggc", pyhgml)):
        recorder = Recorder()
        binding = nvmlabi.NvmlAbi(recorder, prefix=prefix, cuda=cuda)
        for name, method in inspect.getmembers(binding, inspect.ismethod):
            if name.startswith("_") or name in {"call", "value", "function"}:
                continue
            arity = len(inspect.signature(method).parameters)
            with contextlib.suppress(Exception):  # a zeroed answer may be refused
                method(*([0] * arity))
        bound = _oracle_calls(oracle)
        assert recorder.calls
        for called, args in recorder.calls:
            _same_call(called, args, bound, oracle)


# -- library search order ----------------------------------------------------------------------


def _gr_rocm_smi(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Where GR's pyrocmsmi (module-level, so reloaded) decides the library is, under ``env``."""
    for key in ("ROCM_SMI_LIB_PATH", "ROCM_HOME", "ROCM_PATH"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return str(importlib.reload(pyrocmsmi).rocmsmi_lib_loc)


def _scenarios(root: Path) -> Iterator[tuple[dict[str, str], list[str]]]:
    a, b, c = root / "a", root / "b", root / "c"
    yield {"ROCM_SMI_LIB_PATH": str(a)}, [f"{a}/librocm_smi64.so", f"{b}/lib/librocm_smi64.so"]
    yield {"ROCM_HOME": str(b), "ROCM_PATH": str(c)}, [f"{c}/lib/librocm_smi64.so",
                                                       f"{b}/rocm_smi/lib/librocm_smi64.so"]  # fmt: skip
    yield {"ROCM_PATH": str(c)}, [f"{c}/lib/librocm_smi64.so", f"{c}/rocm_smi/lib/librocm_smi64.so"]
    yield {"ROCM_PATH": str(c)}, [f"{c}/rocm_smi/lib/librocm_smi64.so"]
    yield {"ROCM_HOME": str(b)}, [f"{b}/lib/librocm_smi64.so", f"{b}/rocm_smi/lib/librocm_smi64.so"]


def test_rocm_smi_is_searched_in_gpustack_runtimes_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Oracle: GR pyrocmsmi. Under each environment, the first of our candidates that exists is
    the library GR loads; and with nothing set, ``/opt/rocm`` is GR's home too."""
    try:
        for n, (env, present) in enumerate(_scenarios(tmp_path / "s")):
            root = tmp_path / f"case{n}"
            env = {k: v.replace(str(tmp_path / "s"), str(root)) for k, v in env.items()}
            for path in present:
                file = Path(path.replace(str(tmp_path / "s"), str(root)))
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_bytes(b"")
            theirs = _gr_rocm_smi(env, monkeypatch)
            ours = next(c for c in rocmsmi.candidates(env) if os.path.exists(c))
            assert ours == theirs, env
        assert rocmsmi.candidates({})[:2] == (
            "/opt/rocm/lib/librocm_smi64.so",
            "/opt/rocm/rocm_smi/lib/librocm_smi64.so",
        )
        assert _gr_rocm_smi({}, monkeypatch) in rocmsmi.candidates({})[:2]
    finally:
        monkeypatch.undo()
        importlib.reload(pyrocmsmi)


def test_rocm_smi_falls_back_to_the_hygon_trees_in_order() -> None:
    """After GR's candidates: hyhal, then DTK's ``.hyhal/rocm_smi`` (where DTK 24+ keeps it;
    GR names it as a ``ROCM_SMI_LIB_PATH`` example), bare and ``.so.1`` sonames."""
    found = rocmsmi.candidates({})
    assert found.index("/opt/hyhal/lib/librocm_smi64.so") < found.index(
        "/opt/dtk/.hyhal/rocm_smi/lib/librocm_smi64.so"
    )
    assert "/opt/hyhal/lib/librocm_smi64.so.1" in found


def _attempts(
    load: Callable[[], Any], oracle: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    tried: list[str] = []

    def refuse(path: str, *args: Any, **kwargs: Any) -> Any:
        tried.append(str(path))
        raise OSError(path)

    monkeypatch.setattr(oracle, "CDLL", refuse)
    with contextlib.suppress(Exception):  # nothing loads: that is the point
        load()
    return tried


def test_dcmi_cndev_and_dmi_mig_candidates_are_the_oracles_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Oracle: the paths GR's loaders try, recorded by refusing each (pydcmi, pycndev, pydmi)."""
    monkeypatch.delenv("NEUWARE_HOME", raising=False)
    assert _attempts(pydcmi._LoadDcmiLibrary, pydcmi, monkeypatch) == list(dcmi.CANDIDATES)
    assert _attempts(pycndev._LoadCndevLibrary, pycndev, monkeypatch) == list(cndev.CANDIDATES)
    assert _attempts(pydmi._LoadDmiLibrary, pydmi, monkeypatch) == list(dmimig.CANDIDATES)
    monkeypatch.setenv("NEUWARE_HOME", "/srv/neuware")
    assert _attempts(pycndev._LoadCndevLibrary, pycndev, monkeypatch) == list(
        cndev.candidates({"NEUWARE_HOME": "/srv/neuware"})
    )


def test_ixml_candidates_are_pyixmls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: GR pyixml's loader, recorded by refusing each path, with ``COREX_HOME`` set."""
    monkeypatch.setenv("COREX_HOME", str(tmp_path))
    tried = _attempts(pyixml._LoadNvmlLibrary, pyixml, monkeypatch)
    assert tried == list(ixml.candidates({"COREX_HOME": str(tmp_path)}))


def test_mxsml_candidates_are_pymxsmls_fixed_paths_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Oracle: GR pymxsml's search, recorded; its walk of ``/opt`` is left out on purpose."""
    checked: list[str] = []

    def isfile(path: str) -> bool:
        checked.append(path)
        return False

    with monkeypatch.context() as patched:  # os.path is shared: patched for this call only
        patched.setattr(pymxsml.os.path, "isfile", isfile)
        patched.setattr(pymxsml.os, "walk", lambda *a, **k: iter(()))
        assert pymxsml._searchMxsmlLibrary() is None
    assert (
        list(mxsml.CANDIDATES[: len(checked)])
        == checked
        == [c for c in mxsml.CANDIDATES if os.path.isabs(c)]
    )


def test_mtml_candidates_are_pymtmls() -> None:
    """Oracle: PYMTML's loader names ``libmtml.so.2`` then ``libmtml.so`` (loader path only)."""
    source = Path(inspect.getfile(pymtml)).read_text()
    assert source.index('"libmtml.so.2"') < source.index('"libmtml.so"')
    assert mtml.CANDIDATES == ("libmtml.so.2", "libmtml.so")


# -- ids as GPUStack writes them -----------------------------------------------------------------


def test_the_hygon_id_is_gpustack_runtimes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: GR's ``rsmi_dev_unique_id_get`` answer, prefixed as GR's ``hygon.py`` does."""
    value = 0x0000F95CEE823041

    def unique_id(index: int, out: Any) -> int:
        out._obj.value = value
        return 0

    monkeypatch.setattr(pyrocmsmi, "_rocmsmiGetFunctionPointer", lambda name: unique_id)
    monkeypatch.setattr(pyrocmsmi, "_rocmsmiCheckReturn", lambda status: status)
    theirs = f"GPU-{pyrocmsmi.rsmi_dev_unique_id_get(0)[2:]}"
    reader = hygon.HygonReader(rocmsmi.RocmSmi(Recorder()), HostFS(Path("/nonexistent")), None)
    monkeypatch.setattr(reader.smi, "unique_id", lambda index: value)
    assert reader.identify(0)[1] == theirs


def test_the_ascend_id_names_the_die_gpustack_runtime_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Oracle: GR's ``dcmi_get_device_die_v2`` rendering, upper-cased by its detector. Ours is
    the same five words, zero-padded and dash-joined (docs/detection.md says why)."""
    words = (0x7281A664, 0xC0C977, 0x2879FD72, 0xB9D00485, 0x104301E3)

    def die(card: int, device: int, kind: int, out: Any) -> int:
        for i, word in enumerate(words):
            out._obj.soc_die[i] = word
        return 0

    monkeypatch.setattr(pydcmi, "_dcmiGetFunctionPointer", lambda name: die)
    theirs = pydcmi.dcmi_get_device_die_v2(0, 0, pydcmi.DCMI_DIE_TYPE_VDIE).upper()
    assert theirs == "7281A664 C0C977 2879FD72 B9D00485 104301E3"
    ours = ascend.uuid(words)
    assert ours.startswith("NPU-")
    assert [int(w, 16) for w in ours[4:].split("-")] == [int(w, 16) for w in theirs.split()]


@pytest.mark.parametrize(
    ("chip", "theirs", "ours"),
    [("910B2", "Ascend910B2", "910B"), ("310P3", "Ascend310P3", "310P"),
     ("Ascend950PR", "Ascend950", "950"), ("910_9391", "Ascend910_9391", "910C")],
)  # fmt: skip
def test_the_ascend_family_is_the_soc_line_gr_guesses(chip: str, theirs: str, ours: str) -> None:
    """Oracle: GR's ``_guess_soc_name_from_dev_name`` (its ``arch_family``); ours is that SoC's
    line, the A3 (``910_93xx``) named 910C as GPUStack's docs name it."""
    assert gr_ascend._guess_soc_name_from_dev_name(chip) == theirs
    assert ascend.family(chip) == ours
