"""This process's memory figures for the step metrics and the calibration: peak host RSS (VmHWM, the address
space's high-water mark, which Linux does not carry across exec as it does ``ru_maxrss``) and, where MindSpore
reports it, the device's peak allocation; and giving the heap a build left behind back to the system."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
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


def release_freed_memory() -> None:
    """Give the heap the full build left behind (the blocks TP/EP/FSDP cut away) back to the system. The replaced
    Parameters sit in reference cycles (cells ↔ parameters), so a full garbage collection frees them first —
    the interpreter's own generational collection may not run before the first step, and did not on
    bench/memory.py's 220M fsdp2 run (838 MiB of build weights alive through training); then glibc keeps freed
    small blocks in its arenas, and they would count in every rank's RSS. Best effort: the trim is a no-op where
    ``malloc_trim`` does not exist."""
    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
