"""Rotary position embeddings: plain RoPE and YaRN, tables built once in numpy (models.md §2.4).

Layout is NeoX (``rotate_half``); DeepSeek's interleaved rope lanes are de-interleaved first
(``deinterleave=True``), which is what both the reference and HF DeepSeek-V3 do. Following the
reference, the YaRN magnitude ratio multiplies the *angle* (``cos(θ·m)``); it equals HF's
``cos(θ)·m`` only when the ratio is 1, i.e. ``mscale == mscale_all_dim`` (true for real DeepSeek-V3).
"""
from __future__ import annotations

import math

import numpy as np
from mindspore import Tensor, ops

from .registry import current_device, kernel


def yarn_get_mscale(scale: float, mscale: float) -> float:
    """g(s, m) = 1 if s ≤ 1 else 0.1·m·ln s + 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(dim: int, theta: float) -> np.ndarray:
    """``1/θ^(2i/d)`` for i < d/2, in float64."""
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def yarn_correction_range(dim: int, theta: float, original_len: int, beta_fast: float = 32.0,
                          beta_slow: float = 1.0) -> tuple[int, float]:
    """Lanes ``[low, high]`` over which YaRN ramps from extrapolation to interpolation, clamped to [0, d−1]."""

    def corr(beta: float) -> float:  # lane whose wavelength turns ``beta`` times in the original context
        return dim * math.log(original_len / (beta * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), dim - 1)
    return low, (high + 0.001 if low == high else high)


def yarn_inv_freq(dim: int, theta: float, factor: float, original_len: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> np.ndarray:
    """YaRN frequencies: extrapolate the high-frequency lanes, interpolate (÷factor) the low ones."""
    extra = rope_inv_freq(dim, theta)
    inter = extra / factor
    low, high = yarn_correction_range(dim, theta, original_len, beta_fast, beta_slow)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1 → pure extrapolation
    return inter * (1.0 - keep) + extra * keep


class RotaryTable:
    """cos/sin tables ``(1, S, 1, D)`` for positions 0..S−1, cached per S (positions are always 0..S−1)."""

    def __init__(self, inv_freq: np.ndarray, mscale: float = 1.0) -> None:
        self.inv_freq = inv_freq
        self.mscale = float(mscale)
        self._cache: dict[int, tuple[Tensor, Tensor]] = {}

    def __call__(self, seq_len: int) -> tuple[Tensor, Tensor]:
        if seq_len not in self._cache:
            freqs = np.outer(np.arange(seq_len, dtype=np.float64), self.inv_freq) * self.mscale  # (S, D/2)
            emb = np.concatenate([freqs, freqs], -1)[None, :, None, :]  # (1, S, 1, D)
            self._cache[seq_len] = (Tensor(np.cos(emb).astype(np.float32)), Tensor(np.sin(emb).astype(np.float32)))
        return self._cache[seq_len]


def rotary_table(dim: int, theta: float, *, kind: str = "rope", factor: float = 1.0,
                 original_len: int = 4096, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 mscale: float = 1.0, mscale_all_dim: float = 1.0) -> RotaryTable:
    if kind == "yarn":
        inv = yarn_inv_freq(dim, theta, factor, original_len, beta_fast, beta_slow)
        return RotaryTable(inv, yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim))
    return RotaryTable(rope_inv_freq(dim, theta))


def deinterleave(x):
    """``[x0, x1, x2, x3, …] → [x0, x2, …, x1, x3, …]`` on the last dim."""
    d = x.shape[-1]
    return ops.swapaxes(x.reshape(*x.shape[:-1], d // 2, 2), -1, -2).reshape(x.shape)


# stateless, so one instance for every layer; chosen from the registry when this module is imported (a lookup
# inside the forward would run inside the layers `GPTModel.jit_blocks` compiles, where it cannot)
_ROPE = kernel("rope", current_device())()


def apply_rope(x, cos, sin, *, interleaved_input: bool = False):
    """Rotate ``x (B, S, N, D)`` with ``cos/sin (1, S, 1, D)``: ``x·cos + rotate_half(x)·sin``."""
    if interleaved_input:
        x = deinterleave(x)
    return _ROPE(x, cos, sin)
