"""``dm preflight`` is a one-shot: it asks the device plugin's responders without the gRPC stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SERVICE_STACKS = ("kubernetes_asyncio", "nats", "grpclib", "aiohttp", "prometheus_client")
GENERATED = ("betterproto", "proto.deviceplugin.v1beta1")


def test_preflight_dry_run_imports_none_of_the_service_stacks(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from gpustack_operator.main import main\n"
        "rc = main(['dm', 'preflight', '--dry-run', '--simulate', 'nvidia-h200x8',"
        f" '--host-root', {str(tmp_path)!r}])\n"
        f"loaded = [m for m in {SERVICE_STACKS + GENERATED!r} if m in sys.modules]\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
        "print('RESPONDERS', 'agent.deviceplugin.responders' in sys.modules, file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )

    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stderr
    # the rows came from the plugin's own responders, not from a copy of them
    assert "RESPONDERS True" in result.stderr
    assert "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/cudevshr.cache" in result.stdout
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing under the host root
