"""Constructed host roots a real ``chroot`` can enter, with recording fake container runtimes.

The system's ``/usr/bin``, ``/usr/lib`` and ``/usr/lib64`` are bind-mounted read-only into the
root (``/bin``, ``/lib``, ``/lib64`` link to them, as on a merged-usr host), so ``sh`` works inside;
``/usr/local/bin`` is the root's own and holds the fakes. Each fake appends its argv, one argument
per line, then an ``--end--`` line, to ``/tmp/calls.log`` inside the root.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

BINDS = ("usr/bin", "usr/lib", "usr/lib64")

FAKE_RUNTIME = r"""#!/bin/sh
rec=$({ printf '%s\n' "${0##*/}"; for a in "$@"; do printf '%s\n' "$a"; done; })
printf '%s\n--end--\n' "$rec" >> /tmp/calls.log  # one write: concurrent probes never interleave
sub=""
skip=0
for a in "$@"; do
  if [ $skip = 1 ]; then skip=0; continue; fi
  case "$a" in --address|--namespace) skip=1;; -*) ;; *) sub="$a"; break;; esac
done
mode=good; [ -f /etc/fake/mode ] && mode=$(cat /etc/fake/mode)
case "$sub" in
  ps) [ -e /etc/fake/ps-fail ] && { echo "cannot connect" >&2; exit 1; }
      [ -f /etc/fake/ps-ids ] && cat /etc/fake/ps-ids; exit 0;;
  rm) [ -e /etc/fake/rm-fail ] && { echo "rm refused" >&2; exit 1; }; exit 0;;
  run) ;;
  *) exit 0;;
esac
cap=""
lib=""
for a in "$@"; do
  case "$a" in
    CUDA_DEVICE_MEMORY_LIMIT_0=*) cap=${a#*=}; cap=${cap%m};;
    *:/usr/local/vgpu/libvgpu.so:ro) lib=/usr/local/vgpu/libvgpu.so;;
    *:/usr/local/vrocm/libvrocm.so:ro) lib=/usr/local/vrocm/libvrocm.so;;
  esac
done
echo gpustack-preflight-maps-begin
echo "5581d5a4e000-5581d5a50000 r--p 00000000 fc:00 1311 /usr/bin/cat"
[ -n "$lib" ] && [ "$mode" != nolib ] && echo "7f0e2c000000-7f0e2c400000 r-xp 00000000 fc:00 42 $lib"
echo "7f0e2c600000-7f0e2c628000 r--p 00000000 fc:00 77 /usr/lib/x86_64-linux-gnu/libc.so.6"
echo gpustack-preflight-maps-end
case "$*" in *gpustack-preflight-reader-begin*)
  echo gpustack-preflight-reader-begin
  if [ "$mode" = nocap ]; then echo 143771; elif [ "$mode" != silent ]; then echo "$cap"; fi
  echo gpustack-preflight-reader-end;;
esac
exit 0
"""

FAKE_NVIDIA_SMI = r"""#!/bin/sh
n=8; [ -f /etc/fake/gpus ] && n=$(cat /etc/fake/gpus)
i=0
while [ $i -lt $n ]; do echo "GPU $i: NVIDIA H200 (UUID: GPU-fake-$i)"; i=$((i+1)); done
"""


class HostRoot:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, host_path: str, text: str, mode: int = 0o644) -> Path:
        path = self.root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        return path

    def install(self, name: str, script: str) -> None:
        self.write(f"/usr/local/bin/{name}", script, 0o755)

    def fake(self, name: str, text: str = "") -> None:
        self.write(f"/etc/fake/{name}", text)

    def calls(self) -> list[list[str]]:
        log = self.root / "tmp/calls.log"
        if not log.exists():
            return []
        calls: list[list[str]] = [[]]
        for line in log.read_text().splitlines():
            if line == "--end--":
                calls.append([])
            else:
                calls[-1].append(line)
        return calls[:-1]

    def kubelet(self, pid: int, *argv: str) -> None:
        self.write(f"/proc/{pid}/cmdline", "\0".join(argv) + "\0")


def _mounted(path: Path) -> bool:
    return os.path.ismount(path)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostRoot]:
    root = tmp_path / "host"
    for d in ("etc", "proc", "tmp", "usr/local/bin", "var/lib"):
        (root / d).mkdir(parents=True)
    mounted: list[Path] = []
    try:
        for rel in BINDS:
            source = Path("/") / rel
            if not source.is_dir():
                continue
            target = root / rel
            target.mkdir(parents=True)
            subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(target)], check=True)
            mounted.append(target)
            (root / os.path.basename(rel)).symlink_to(rel)
        yield HostRoot(root)
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", str(target)], check=False)
            if _mounted(target):
                subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.fixture
def lib_source(tmp_path: Path) -> Path:
    source = tmp_path / "image-lib"
    for major in (12, 13):
        lib = source / "nvidia" / f"cuda-{major}" / "libvgpu.so"
        lib.parent.mkdir(parents=True)
        lib.write_bytes(b"\x7fELF fake libvgpu " + str(major).encode())
    (source / "nvidia" / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    amd = source / "amd"
    amd.mkdir()
    (amd / "libvrocm.so").write_bytes(b"\x7fELF fake libvrocm")
    (amd / "ld.so.preload").write_text("/usr/local/vrocm/libvrocm.so\n")
    return source
