"""The kernels a layer builds, chosen by device: one registry keyed by ``(kernel, device)``.

Today's entries are the CPU kernels of `kernels` (hand-written backwards that beat MindSpore's CPU autodiff;
mindspore-cpu.md §1) and they are the reference entries: a device without its own entry gets them (they are
plain MindSpore ops, correct everywhere). Adding a device's kernel is one `register` call, e.g. a fused
attention for Ascend: ``register("core_attention", "Ascend", FlashAttention)`` — the layers ask
`kernel("core_attention")(scale, masked)` and never name a device.
"""
from __future__ import annotations

from typing import Any, Callable

from mftk.engine.layers import kernels

REFERENCE = "CPU"
_REGISTRY: dict[tuple[str, str], Callable[..., Any]] = {
    ("rms_norm", REFERENCE): kernels.RMSNormFn,
    ("rope", REFERENCE): kernels.RopeFn,
    ("core_attention", REFERENCE): kernels.CoreAttentionFn,
    ("silu_mul", REFERENCE): kernels.SiluMulFn,
    ("gelu_mul", REFERENCE): kernels.GeluMulFn,
    ("silu", REFERENCE): kernels.SiluFn,
    ("gelu", REFERENCE): kernels.GeluFn,
    ("head_cross_entropy", REFERENCE): kernels.HeadCrossEntropyFn,
}


def register(name: str, device: str, factory: Callable[..., Any]) -> None:
    """Use ``factory`` for kernel ``name`` on ``device`` (built with the same arguments as the reference's)."""
    if (name, REFERENCE) not in _REGISTRY:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(sorted(n for n, _ in _REGISTRY))}")
    _REGISTRY[(name, device)] = factory


def current_device() -> str:
    import mindspore as ms

    return str(ms.get_context("device_target"))


def kernel(name: str, device: str | None = None) -> Callable[..., Any]:
    """The factory of kernel ``name`` for ``device`` (default: MindSpore's current one), else the reference's."""
    device = device or current_device()
    return _REGISTRY.get((name, device)) or _REGISTRY[(name, REFERENCE)]
