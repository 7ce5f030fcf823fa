"""The device a run computes on, and the collective backend that goes with it.

``context.device_target`` (CPU, GPU or Ascend; ``--device`` on ``train``/``resume`` overrides it) names it;
when the YAML does not write it, the device MindSpore finds (Ascend, then GPU, then CPU). A device written
that MindSpore cannot use here is an error naming it and ``--device`` — never a silent CPU run. One process
and every msrun worker set the same device (the parent resolves it and hands it to the workers in
``MFTK_DEVICE``) before ``communication.init()``, which then picks the device's backend (`BACKENDS`).
"""
from __future__ import annotations

import os

from mftk.config.sections import DEVICE_TARGETS as DEVICES
from mftk.errors import ConfigError, Problem

BACKENDS = {"CPU": "mccl", "GPU": "nccl", "Ascend": "hccl"}  # what communication.init() uses per device
ENV = "MFTK_DEVICE"  # the parent's resolved device, for msrun workers


def available(device: str) -> bool:
    """Whether MindSpore can run on ``device`` in this process (its plugin loads and a device is present)."""
    import mindspore as ms

    if device == "CPU":
        return True
    ctx = getattr(ms.device_context, device.lower(), None)
    try:
        return bool(ctx is not None and ctx.is_available())
    except (RuntimeError, OSError, AttributeError):
        return False


def found() -> str:
    """The device MindSpore finds here: Ascend, then GPU, then CPU."""
    return next(d for d in ("Ascend", "GPU", "CPU") if available(d))


def select(written: str | None) -> str:
    """The run's device: ``written`` (``context.device_target``, already overridden by ``--device``) when
    MindSpore can use it, else an error; None: `found`."""
    if written is None:
        return found()
    name = next((d for d in DEVICES if d.lower() == str(written).lower()), None)
    if name is None or not available(name):
        here = [d for d in DEVICES if available(d)]
        why = "is not one of " + ", ".join(DEVICES) if name is None else "is not available on this machine"
        raise ConfigError(message=f"context.device_target {written!r} {why} (MindSpore finds: {', '.join(here)})",
                          problems=[Problem(path="context.device_target", message=f"device {written!r} {why}",
                                            value=written)],
                          hint=f"pass --device {here[0]} (or write context.device_target: {here[0]}, or leave it "
                               "out to use the device MindSpore finds)")
    return name


def apply(device: str) -> None:
    """PyNative on ``device``; synchronous launches on CPU (faster there and errors at the failing call)."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target=device)
    if device == "CPU":
        ms.runtime.launch_blocking()


def worker_device() -> str:
    """An msrun worker's device: the parent's (``MFTK_DEVICE``), CPU when launched without one."""
    return os.environ.get(ENV) or "CPU"
