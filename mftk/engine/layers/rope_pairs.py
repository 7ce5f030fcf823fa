"""DeepSeek-V4's rotary embeddings: interleaved pairs on the trailing ``rope_dim`` lanes of a head, two tables.

``main`` (plain RoPE, base ``rope_theta``) serves the sliding-window layers; ``compress`` (YaRN, base
``compress_rope_theta``, magnitude 1) the compressed layers, their compressors and indexers
(mindformers-2.1.md §5.4 step 5; transformers' ``DeepseekV4RotaryEmbedding`` with ``main`` /
``compress``). Positions are 0..S−1; a compressed entry ``j`` of ratio ``r`` sits at ``j·r``.
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

from .kernels_v4 import PairRopeFn
from .rope import rope_inv_freq, yarn_inv_freq


class PairRotaryTable:
    """cos/sin ``(1, P, 1, D)`` for positions ``0, r, 2r, …`` (each angle on its two lanes), cached."""

    def __init__(self, inv_freq: np.ndarray) -> None:
        self.inv_freq = inv_freq
        self._cache: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}

    def __call__(self, n: int, stride: int = 1) -> tuple[Tensor, Tensor]:
        key = (n, stride)
        if key not in self._cache:
            pos = np.arange(n, dtype=np.float64) * stride
            ang = np.repeat(np.outer(pos, self.inv_freq), 2, axis=-1)[None, :, None, :]  # (1, n, 1, D)
            self._cache[key] = (Tensor(np.cos(ang).astype(np.float32)), Tensor(np.sin(ang).astype(np.float32)))
        return self._cache[key]


class RopeSet:
    """The two tables of a model; ``rope(S)`` (what `GPTModel` hands every layer) returns ``(self, S)``."""

    def __init__(self, dim: int, theta: float, compress_theta: float, *, yarn: bool, factor: float,
                 original_len: int, beta_fast: float, beta_slow: float) -> None:
        self.dim = dim
        self.main = PairRotaryTable(rope_inv_freq(dim, theta))
        inv = yarn_inv_freq(dim, compress_theta, factor, original_len, beta_fast, beta_slow) if yarn and factor > 1 \
            else rope_inv_freq(dim, compress_theta)
        self.compress = PairRotaryTable(inv)

    def __call__(self, seq_len: int) -> tuple["RopeSet", int]:
        return self, seq_len


class PartialPairRope:
    """Rotates the trailing ``dim`` lanes of ``x (B, S, N, D)`` and leaves the leading ``D − dim`` alone: the
    tables are widened with cos 1 / sin 0 on those lanes, so ``x`` is never sliced (a lane slice is a
    strided copy, slow on CPU, and so is its gradient), and tiled to ``x``'s batch and heads, so
    `PairRopeFn` tiles nothing in its forward or backward (both cached: the tables are constants)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._fns: dict[int, PairRopeFn] = {}
        self._tables: dict[tuple[int, int, bool, int, int], tuple[Tensor, Tensor, Tensor]] = {}

    def __call__(self, x, cos, sin, *, inverse: bool = False):
        b, _, heads, d = x.shape
        return self.fn(d)(x, *self.tables(cos, sin, d, b, heads, inverse=inverse))

    def fn(self, d: int) -> PairRopeFn:
        """The rotation kernel for heads of width ``d`` (one per width)."""
        if d not in self._fns:
            self._fns[d] = PairRopeFn(d, self.dim)
        return self._fns[d]

    def tables(self, cos, sin, d: int, b: int, heads: int, *, inverse: bool = False) -> tuple[Tensor, Tensor]:
        """cos/sin widened to ``d`` lanes and tiled to ``(b, S, heads, d)`` (``−sin`` for the inverse), cached."""
        key = (id(cos), d, inverse, b, heads)
        if key not in self._tables:
            c, s_ = cos.asnumpy(), sin.asnumpy() * (-1.0 if inverse else 1.0)
            pad = c.shape[:-1] + (d - self.dim,)
            reps = (b, 1, heads, 1)
            self._tables[key] = (cos, Tensor(np.tile(np.concatenate([np.ones(pad, np.float32), c], -1), reps)),
                                 Tensor(np.tile(np.concatenate([np.zeros(pad, np.float32), s_], -1), reps)))
            # cos kept: its id stays
        return self._tables[key][1:]
