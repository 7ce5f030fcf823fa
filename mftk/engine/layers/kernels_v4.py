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

from .kernels import _bmm, _bmm_nt, _bmm_tn, _rowsum, _softmax, _tile

_masked_fill = ops.MaskedFill()
_exp = ops.Exp()
# primitives, not ``ops.minimum``/``ops.clip_by_value``: `ClampedSiluMulFn` calls them in its construct and its
# bprop, which fails to compile under ``mindspore.jit`` when they are Python functions (as `_table_tiler`)
_minimum = ops.Minimum()
_maximum = ops.Maximum()
MASKED = -1e30  # finite: exp(MASKED − m) is exactly 0 in fp32, and a row never turns NaN


class SinkAttentionFn(nn.Cell):
    """``softmax([scale·q·kᵀ + bias, sink])[:, :-1] · v`` with ``k = v = kv`` (one shared head): attention whose
    softmax denominator also holds ``exp(sink_h)`` of a learned per-head sink (transformers'
    ``eager_attention_forward`` with ``sinks``).

    The sink is one more key: ``q' = [scale·q | sink]``, ``k' = [k | 0]`` plus a key ``[0…0 | 1]`` whose value
    is 0, so the sink column is a plain score and one fused softmax does it all (no slice of the score
    matrix, no per-row max). ``q (B, 1, M, d)`` (M = queries × heads, any row order), ``kv (B, 1, Sk, d)``,
    ``bias (B, 1, M, Sk + 1)`` float (0 or −1e30: masked; the last column, the sink's, 0), ``sink_rows
    (B, 1, M, 1)`` each row's head sink.
    Returns ``(out, probs, v)``; all but ``out`` only carry the forward to the backward. The padding
    columns and rows of ``k'``/``v`` are constants, cached per shape (a ``zeros`` per call cost as much as a
    big op)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = float(scale)
        self._pads: dict[tuple, tuple[Tensor, Tensor, Tensor]] = {}

    def _keys(self, kv):
        b, g, sk, d = kv.shape
        key = (b, g, sk, d, kv.dtype)
        if key not in self._pads:
            sink_key = np.zeros((b, g, 1, d + 1), np.float32)
            sink_key[..., -1] = 1.0
            self._pads[key] = tuple(Tensor(a).astype(kv.dtype) for a in (np.zeros((b, g, sk, 1), np.float32),
                                                                          sink_key, np.zeros((b, g, 1, d), np.float32)))
        lane, sink_key, sink_value = self._pads[key]
        k = mint.cat((mint.cat((kv, lane), -1), sink_key), 2)  # (B, 1, Sk+1, d+1): key [0…0 | 1] for the sink
        v = mint.cat((kv, sink_value), 2)  # (B, 1, Sk+1, d): the sink adds nothing
        return k, v

    def construct(self, q, kv, bias, sink_rows):
        k, v = self._keys(kv)
        qs = mint.cat((q * self.scale, sink_rows), -1)  # (B, 1, M, d+1)
        p = _softmax(_bmm_nt(qs, k) + bias)  # (B, 1, M, Sk+1)
        return _bmm(p, v), p, v

    def bprop(self, q, kv, bias, sink_rows, out, dout):
        """Slice-free where it can be: ``ds·k'`` splits into ``ds·v`` (k' without its sink lane is v) and
        ``ds·e`` (the sink lane, a GEMV with a cached one-hot column), so neither lane of ``dq'`` is sliced;
        ``dkv`` is one row slice of ``dsᵀ·q·scale + pᵀ·do`` (strided lane slices cost ~10 ms a layer)."""
        o, p, v = out
        do = dout[0]
        c = _rowsum(do * o)  # Σ_j p_j·(do·v_j) = do·out; the sink's value is 0
        ds = (_bmm_nt(do, v) - _tile(c, (1, 1, 1, p.shape[-1]))) * p  # masked entries have p = 0
        dq = _bmm(ds, v) * self.scale  # (B, 1, M, d)
        dsink = _bmm(ds, self._sink_lane(v))  # (B, 1, M, 1)
        dkv = (_bmm_tn(ds, q) * self.scale + _bmm_tn(p, do))[:, :, :kv.shape[2]]  # (B, 1, Sk, d)
        return dq, dkv, ops.zeros_like(bias), dsink

    def _sink_lane(self, v):
        """``(B, 1, Sk + 1, 1)``: 1 on the sink key's row, the lane ``k'`` has beyond ``v``'s (cached per shape)."""
        key = ("sink_lane",) + tuple(v.shape) + (v.dtype,)
        if key not in self._pads:
            lane = np.zeros(tuple(v.shape[:-1]) + (1,), np.float32)
            lane[..., -1, :] = 1.0
            self._pads[key] = Tensor(lane).astype(v.dtype)
        return self._pads[key]


def pair_rotation(dim: int, rope_dim: int | None = None) -> np.ndarray:
    """``Rᵀ`` with ``x @ Rᵀ = rotate_pairs(x)`` on the trailing ``rope_dim`` lanes (all by default), zero on
    the others: lanes ``(2i, 2i+1) → (−x_{2i+1}, x_{2i})`` (GPT-J style)."""
    rt = np.zeros((dim, dim), np.float32)
    i = np.arange(dim - (rope_dim or dim), dim, 2)
    rt[i + 1, i] = -1.0
    rt[i, i + 1] = 1.0
    return rt


def _table_tiler():
    """A function ``(table, x) ->`` the table tiled to ``x``'s batch and heads (nothing to do when the caller
    passed it full-size). `PairRopeFn`'s forward and backward each get their own: under ``mindspore.jit``
    with parameter gradients, a cell whose ``construct`` and ``bprop`` call the same Python function fails to
    compile (``func_graph->get_return() is null``, MindSpore 2.10)."""
    def full(table, x):
        reps = (x.shape[0] // table.shape[0], 1, x.shape[2] // table.shape[2], 1)
        return table if reps == (1, 1, 1, 1) else _tile(table, reps)
    return full


_full_table, _full_table_bprop = _table_tiler(), _table_tiler()


def _rotator():
    """``(x (…, D), mat (D, D)) -> x · mat``; one for the forward and one for the backward, as `_table_tiler`."""
    def rotate(x, mat):
        d = x.shape[-1]
        return ops.matmul(x.reshape(-1, d), mat).reshape(x.shape)
    return rotate


_rotate, _rotate_bprop = _rotator(), _rotator()


class PairRopeFn(nn.Cell):
    """Interleaved-pair RoPE ``x·cos + rotate_pairs(x)·sin`` on ``x (B, S, N, D)`` with tables ``(1, S, 1, D)``
    (each angle repeated on its two lanes; cos 1 and sin 0 on lanes left alone, so a partial RoPE needs
    no slice of ``x``), or tables already tiled to ``x``'s shape (then nothing is tiled). ``rotate_pairs`` is
    a product with the constant ``Rᵀ``, so the backward is ``dout·cos + (dout·sin)·R``. Pass ``−sin`` for
    the inverse rotation."""

    def __init__(self, dim: int, rope_dim: int | None = None) -> None:
        super().__init__()
        self.rt = Tensor(pair_rotation(dim, rope_dim))
        self.r = Tensor(np.ascontiguousarray(pair_rotation(dim, rope_dim).T))

    def construct(self, x, cos, sin):
        return x * _full_table(cos, x) + _rotate(x, self.rt) * _full_table(sin, x)

    def bprop(self, x, cos, sin, out, dout):
        dx = dout * _full_table_bprop(cos, x) + _rotate_bprop(dout * _full_table_bprop(sin, x), self.r)
        return dx, ops.zeros_like(cos), ops.zeros_like(sin)


class ClampedSiluMulFn(nn.Cell):
    """``silu(min(gate, L)) · clip(up, −L, L)`` (transformers' DeepSeek-V4 experts); the clamped lanes get
    no gradient, as torch's ``clamp`` (which passes it at the bounds themselves)."""

    def __init__(self, limit: float) -> None:
        super().__init__()
        self.limit = float(limit)

    def construct(self, gate, up):
        g = _minimum(gate, self.limit)
        return mint.nn.functional.silu(g) * _minimum(_maximum(up, -self.limit), self.limit)

    def bprop(self, gate, up, out, dout):
        g = _minimum(gate, self.limit)
        u = _minimum(_maximum(up, -self.limit), self.limit)
        sg = mint.sigmoid(g)
        keep_g = (gate <= self.limit).astype(gate.dtype)
        keep_u = (ops.abs(up) <= self.limit).astype(up.dtype)
        return dout * u * (sg * (1.0 + g * (1.0 - sg))) * keep_g, dout * (g * sg) * keep_u


def sinkhorn_ops(logits, iters: int, eps: float):
    """`SinkhornFn`'s matrix in MindSpore ops on ``(N, n, n)`` (autodiff gives the backward): softmax over
    the last axis + ε, a column normalisation (axis 1), then ``iters − 1`` × (rows, columns), each
    ``x / (Σ x + ε)``. Not what the model runs (`SinkhornFn` says why, with the measured ratio): the
    candidate bench/host_roundtrips.py ``sinkhorn`` times and the plain reference its kernel test checks."""
    x = mint.softmax(logits, -1) + eps
    for axis in [1] + [2, 1] * (int(iters) - 1):
        x = x / (x.sum(axis, keepdims=True) + eps)
    return x


class SinkhornFn(nn.Cell):
    """``softmax(logits) + ε``, one column normalisation, then ``iters − 1`` × (rows, columns), each
    ``x / (Σ x + ε)``, on ``(N, n, n)``, in float32 NumPy on the host (PyNative only): the matrices are
    tiny and the ~4·iters MindSpore ops of the plain loop (and their autodiff) cost more than the math —
    measured forward + backward, n 4, 20 iterations, against `sinkhorn_ops` (bench/host_roundtrips.py
    ``sinkhorn``, 2026-12-05): 15× (N 128) and 18× (N 1024) the host's eagerly, 3.2× and 4.7× under
    ``mindspore.jit``, so it stays on the host (one read of the logits and one write each way per layer).
    The host works on the ``(n, n, N)`` layout: NumPy's sums and broadcasts over a short trailing axis are
    ~10× slower than over the long one (same additions in the same order, so the same bits).
    Returns ``(matrix, softmax)``; the softmax ``(n, n, N)`` only carries the forward to the backward, which
    replays the normalisations from it (the same ops, so the same inputs as the forward's; cheaper than
    carrying all ``2·iters`` of them to the backward as one stacked tensor) and then walks them in reverse."""

    def __init__(self, iters: int, eps: float) -> None:
        super().__init__()
        self.iters, self.eps = int(iters), np.float32(eps)
        self.axes = [0] + [1, 0] * (self.iters - 1)  # columns, then (rows, columns): axes of (n, n, N)

    def _normalise(self, p: np.ndarray, inputs: list | None = None) -> np.ndarray:
        """The normalisations from the softmax ``p``; each one's input appended to ``inputs`` when given."""
        x = p + self.eps
        for axis in self.axes:
            if inputs is not None:
                inputs.append(x)
            x = x / (x.sum(axis, keepdims=True) + self.eps)
        return x

    def construct(self, logits):
        z = np.ascontiguousarray(logits.asnumpy().transpose(1, 2, 0))  # (n, n, N)
        e = np.exp(z - z.max(1, keepdims=True))
        p = e / e.sum(1, keepdims=True)
        x = self._normalise(p)
        return Tensor(np.ascontiguousarray(x.transpose(2, 0, 1))), Tensor(p)

    def bprop(self, logits, out, dout):
        p = out[1].asnumpy()
        inputs: list = []
        self._normalise(p, inputs)
        g = np.ascontiguousarray(dout[0].asnumpy().transpose(1, 2, 0))
        for x, axis in zip(reversed(inputs), reversed(self.axes)):  # y = x / (S + ε): dx = g/(S+ε) − Σ(g·x)/(S+ε)²
            d = x.sum(axis, keepdims=True) + self.eps
            g = g / d - (g * x).sum(axis, keepdims=True) / (d * d)
        dz = p * (g - (g * p).sum(1, keepdims=True))
        return (Tensor(np.ascontiguousarray(dz.transpose(2, 0, 1)).astype(np.float32)),)
