"""DeepSeek-V4's hot functions with a hand-written backward (``nn.Cell.bprop``), for the same reasons
as `kernels.py` (MindSpore CPU autodiff of the plain formulas is slow; same-shape ops, ``tile`` and
GEMMs are fast): attention with a per-head sink, interleaved-pair RoPE, the clamped SwiGLU and the
mHC Sinkhorn projection.

tests/engine/test_deepseek_v4.py checks each forward against a float64 NumPy transcription and
each backward against finite differences.
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, mint, nn, ops

from .kernels import _bmm, _bmm_nt, _bmm_tn, _rowsum, _tile

_masked_fill = ops.MaskedFill()
_exp = ops.Exp()
MASKED = -1e30  # finite: exp(MASKED − m) is exactly 0 in fp32, and a row never turns NaN


class SinkAttentionFn(nn.Cell):
    """``softmax([scale·q·kᵀ (masked), sink])[:, :-1] · v``: attention whose softmax denominator also holds
    ``exp(sink_h)`` of a learned per-head sink (transformers' ``eager_attention_forward`` with ``sinks``).

    ``q (B, G, M, d)`` with rows head-major (row = h·S + s), ``k (B, G, Sk, d)``, ``v (B, G, Sk, dv)``,
    ``mask (B, G, M, Sk)`` bool (True = masked), ``sink_rows (B, G, M, 1)`` the sink of each row's head.
    Returns ``(out, probs, sink_probs)``; the last two only carry the forward's probabilities to the
    backward (callers ignore them)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = float(scale)

    def construct(self, q, k, v, mask, sink_rows):
        s = _masked_fill(_bmm_nt(q * self.scale, k), mask, MASKED)  # (B, G, M, Sk)
        m = ops.maximum(s.max(axis=-1, keepdims=True), sink_rows)  # (B, G, M, 1): the sink takes part in the max
        e = _exp(s - _tile(m, (1, 1, 1, s.shape[-1])))
        es = _exp(sink_rows - m)
        z = _rowsum(e) + es
        p = e / _tile(z, (1, 1, 1, s.shape[-1]))
        return _bmm(p, v), p, es / z

    def bprop(self, q, k, v, mask, sink_rows, out, dout):
        p, ps, dout = out[1], out[2], dout[0]
        dp = _bmm_nt(dout, v)  # (B, G, M, Sk)
        c = _rowsum(dp * p)  # (B, G, M, 1); the sink column adds nothing to the output
        ds = _masked_fill((dp - _tile(c, (1, 1, 1, p.shape[-1]))) * p, mask, 0.0)
        return (_bmm(ds, k) * self.scale, _bmm_tn(ds, q) * self.scale, _bmm_tn(p, dout), ops.zeros_like(mask),
                -ps * c)


def pair_rotation(dim: int) -> np.ndarray:
    """``Rᵀ`` with ``x @ Rᵀ = rotate_pairs(x)``: lanes ``(2i, 2i+1) → (−x_{2i+1}, x_{2i})`` (GPT-J style)."""
    rt = np.zeros((dim, dim), np.float32)
    i = np.arange(0, dim, 2)
    rt[i + 1, i] = -1.0
    rt[i, i + 1] = 1.0
    return rt


class PairRopeFn(nn.Cell):
    """Interleaved-pair RoPE ``x·cos + rotate_pairs(x)·sin`` on ``x (B, S, N, D)`` with tables ``(1, S, 1, D)``
    (each angle repeated on its two lanes). ``rotate_pairs`` is a product with the constant ``Rᵀ``, so
    the backward is ``dout·cos + (dout·sin)·R``. Pass ``−sin`` for the inverse rotation."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.rt = Tensor(pair_rotation(dim))
        self.r = Tensor(np.ascontiguousarray(pair_rotation(dim).T))

    def _rot(self, x, mat):
        d = x.shape[-1]
        return ops.matmul(x.reshape(-1, d), mat).reshape(x.shape)

    def construct(self, x, cos, sin):
        reps = (x.shape[0], 1, x.shape[2], 1)
        return x * _tile(cos, reps) + self._rot(x, self.rt) * _tile(sin, reps)

    def bprop(self, x, cos, sin, out, dout):
        reps = (x.shape[0], 1, x.shape[2], 1)
        return dout * _tile(cos, reps) + self._rot(dout * _tile(sin, reps), self.r), ops.zeros_like(cos), \
            ops.zeros_like(sin)


class ClampedSiluMulFn(nn.Cell):
    """``silu(min(gate, L)) · clip(up, −L, L)`` (transformers' DeepSeek-V4 experts); the clamped lanes get
    no gradient, as torch's ``clamp`` (which passes it at the bounds themselves)."""

    def __init__(self, limit: float) -> None:
        super().__init__()
        self.limit = float(limit)

    def construct(self, gate, up):
        g = ops.minimum(gate, self.limit)
        return mint.nn.functional.silu(g) * ops.clip_by_value(up, -self.limit, self.limit)

    def bprop(self, gate, up, out, dout):
        g = ops.minimum(gate, self.limit)
        u = ops.clip_by_value(up, -self.limit, self.limit)
        sg = mint.sigmoid(g)
        keep_g = (gate <= self.limit).astype(gate.dtype)
        keep_u = (ops.abs(up) <= self.limit).astype(up.dtype)
        return dout * u * (sg * (1.0 + g * (1.0 - sg))) * keep_g, dout * (g * sg) * keep_u


class SinkhornFn(nn.Cell):
    """``softmax(logits) + ε``, one column normalisation, then ``iters − 1`` × (rows, columns), each
    ``x / (Σ x + ε)``, on ``(N, n, n)``, in float32 NumPy on the host (PyNative only): the matrices are
    tiny and the ~4·iters MindSpore ops of the plain loop (and their autodiff) cost more than the math.
    The backward replays the normalisations in reverse from the kept intermediates."""

    def __init__(self, iters: int, eps: float) -> None:
        super().__init__()
        self.iters, self.eps = int(iters), np.float32(eps)

    def _forward(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, int]]]:
        e = np.exp(z - z.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        x, steps = p + self.eps, []
        for axis in [-2] + [-1, -2] * (self.iters - 1):
            steps.append((x, axis))
            x = x / (x.sum(axis, keepdims=True) + self.eps)
        return x, p, steps

    def construct(self, logits):
        return Tensor(self._forward(logits.asnumpy())[0])

    def bprop(self, logits, out, dout):
        _, p, steps = self._forward(logits.asnumpy())
        g = dout.asnumpy()
        for x, axis in reversed(steps):  # y = x / (S + ε): dx = g/(S+ε) − Σ(g·x)/(S+ε)²
            d = x.sum(axis, keepdims=True) + self.eps
            g = g / d - (g * x).sum(axis, keepdims=True) / (d * d)
        return (Tensor((p * (g - (g * p).sum(-1, keepdims=True))).astype(np.float32)),)
