"""This process's memory figures for the step metrics and the calibration: peak host RSS (VmHWM, the address
space's high-water mark, which Linux does not carry across exec as it does ``ru_maxrss``) and, where MindSpore
reports it, the device's peak allocation."""
from __future__ import annotations

from pathlib import Path


def status_bytes(key: str) -> int | None:
    """A figure of /proc/self/status (kB there) in bytes; None where the file or the key does not exist."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return None


def peak_rss_bytes() -> int | None:
    return status_bytes("VmHWM")


def device_peak_bytes() -> int | None:
    """The device's peak allocated bytes on an accelerator (MindSpore's runtime statistics); None on CPU."""
    import mindspore as ms

    if ms.get_context("device_target") == "CPU":
        return None
    try:
        return int(ms.runtime.max_memory_allocated())
    except (AttributeError, RuntimeError):
        return None
