"""``dm serve`` hands MIG actuation the NVIDIA backend's own NVML adapter."""

from __future__ import annotations

from agent.deviceplugin import partitioning
from agent.devices import sources
from agent.devices.settings import DetectSettings
from agent.serve import running


def test_mig_control_uses_the_detecting_adapter() -> None:
    settings = DetectSettings(manufacturers=("amd", "nvidia"), simulate="nvidia-h100x8-mig")
    with sources.open_backends(settings) as backends:
        control = running.mig_control(backends)
        assert isinstance(control, partitioning.NvmlMig)
        (nvidia,) = [b for b in backends if b.manufacturer == "nvidia"]
        assert control.nvml is nvidia.nvml  # type: ignore[attr-defined]


def test_no_nvidia_backend_means_no_mig_control() -> None:
    settings = DetectSettings(manufacturers=("amd",), simulate="amd-rx7800xt-x2")
    with sources.open_backends(settings) as backends:
        assert running.mig_control(backends) is None
