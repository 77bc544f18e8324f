"""NVML's return codes and error type as the simulator raises them (pynvml-compatible).

The codes are NVML's own numbers, so the adapter maps simulated and real failures identically;
a test compares them with the installed nvidia-ml-py.
"""

from __future__ import annotations

ERROR_CODES: dict[str, int] = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "IN_USE": 19,
    "INSUFFICIENT_RESOURCES": 23,
    "UNKNOWN": 999,
}

_MESSAGES = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    19: "Resource in use",
    23: "Insufficient resources",
    999: "Unknown Error",
}

UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
TIMEOUT = 10
GPU_IS_LOST = 15


class NVMLError(Exception):
    """Shaped like pynvml's: an int ``.value`` and NVML's message as ``str()``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")
