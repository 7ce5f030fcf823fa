"""Hot-path functions with a hand-written backward (``nn.Cell.bprop``): RMSNorm, RoPE, causal core
attention, SiLU·up (GELU·up, and the plain SiLU and GELU of a non-gated MLP) and the fused LM-head
cross-entropy.

Why: on MindSpore 2.10 CPU the *kernels* are fine (GEMM as fast as torch's MKL) but autodiff of the
obvious formulas is not. Broadcasting elementwise ops run 15–25× slower than same-shape ones, row
reductions of 4-D tensors 10×, ``SoftmaxGrad`` ~20× slower than torch, strided slices and ``stack``
5–20× (mindspore-cpu.md §1; bench/train_step.py). Each function here computes its forward and its
backward from same-shape ops, ``tile`` (fast, unlike broadcasting), row sums as a matmul with ones,
and GEMMs; cheap intermediates are recomputed, expensive ones (attention and vocabulary probabilities)
ride along as an extra output the callers ignore. Measured f+b on the 29 M benchmark shapes (eager):
RMSNorm 38 → 13 ms, RoPE 26 → 14 ms, core attention 176–250 → 60 ms, MLP 154 → 102 ms, LM head + CE
1050 → 740–900 ms.

The math is the textbook one; tests/engine/test_kernels.py compares each forward and backward with
MindSpore's own autodiff of the plain formula (eager and under ``ms.jit``) and the fused head with
finite differences. Inputs that need no gradient (tables, masks, labels, weights) get zeros.
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, mint, nn, ops

_bmm = ops.BatchMatMul()
_bmm_nt = ops.BatchMatMul(transpose_b=True)  # a @ bᵀ
_bmm_tn = ops.BatchMatMul(transpose_a=True)  # aᵀ @ b
_mm = ops.MatMul()
_mm_nt = ops.MatMul(transpose_b=True)
_mm_tn = ops.MatMul(transpose_a=True)
# primitives, not the functional ``ops.tile``/``ops.softmax``/``ops.masked_fill``: those fail to compile
# inside a bprop under ``ms.jit`` ("func_graph->get_return() is null"), and GPTModel.jit_blocks compiles these
_tile = ops.Tile()
_softmax = ops.Softmax(-1)
_masked_fill = ops.MaskedFill()
_argmax = ops.ArgMaxWithValue(axis=-1)


def _col(c, width: int):
    """``(N, 1)`` → ``(N, width)`` by tile (broadcasting multiplies are the slow path on CPU)."""
    return _tile(c, (1, width))


def _rowsum(x):
    """Last-dim sum of ``(..., K)`` as a batched matmul with ones, ``(..., 1)`` (10× a ReduceSum on CPU)."""
    ones = ops.ones(x.shape[:-2] + (x.shape[-1], 1), x.dtype)
    return (_bmm if x.ndim > 2 else _mm)(x, ones)


class RMSNormFn(nn.Cell):
    """``y = x · rsqrt(mean(x²) + eps) · w`` over the last dim; call ``fn(x, weight)``."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = float(eps)

    def _normed(self, x2):
        h = x2.shape[1]
        rt = _col(mint.rsqrt(mint.mean(x2 * x2, -1, keepdim=True) + self.eps), h)
        return x2 * rt, rt

    def construct(self, x, w):
        h = x.shape[-1]
        x2 = x.reshape(-1, h)
        xn, _ = self._normed(x2)
        return (xn * _tile(w.reshape(1, h), (x2.shape[0], 1))).reshape(x.shape)

    def bprop(self, x, w, out, dout):
        h = x.shape[-1]
        x2 = x.reshape(-1, h)
        xn, rt = self._normed(x2)
        d = dout.reshape(-1, h)
        dw = (d * xn).sum(0)
        dxn = d * _tile(w.reshape(1, h), (x2.shape[0], 1))
        c = mint.mean(dxn * xn, -1, keepdim=True)
        return ((dxn - xn * _col(c, h)) * rt).reshape(x.shape), dw


def _rotate_half(x):
    h = x.shape[-1] // 2
    return mint.cat((-x[..., h:], x[..., :h]), -1)


def _rotate_half_t(z):
    """Transpose of ``rotate_half`` (its adjoint): ``[z1, z2] → [z2, −z1]``."""
    h = z.shape[-1] // 2
    return mint.cat((z[..., h:], -z[..., :h]), -1)


class RopeFn(nn.Cell):
    """NeoX rotary ``x·cos + rotate_half(x)·sin``; ``x (B, S, N, D)``, tables ``(1, S, 1, D)``."""

    def construct(self, x, cos, sin):
        reps = (x.shape[0], 1, x.shape[2], 1)
        return x * _tile(cos, reps) + _rotate_half(x) * _tile(sin, reps)

    def bprop(self, x, cos, sin, out, dout):
        reps = (x.shape[0], 1, x.shape[2], 1)
        dx = dout * _tile(cos, reps) + _rotate_half_t(dout * _tile(sin, reps))
        return dx, ops.zeros_like(cos), ops.zeros_like(sin)


class CoreAttentionFn(nn.Cell):
    """``softmax(scale·q·kᵀ masked to −1e9)·v`` for ``q (B, G, M, d)``, ``k (B, G, Sk, d)``,
    ``v (B, G, Sk, dv)`` and a bool ``mask (B, G, M, Sk)`` of the scores' own shape (True = masked).
    Masked logits are exactly −1e9 (a fully masked row is uniform) and get no gradient.

    Returns ``(out, probs)``: the probabilities ride along as a second output only so the backward
    gets them without recomputing ``q·kᵀ`` and the softmax (callers ignore it; its gradient is zero).
    The scale multiplies ``q`` and the ``(…, d)``-sized gradients, not the 8× larger score matrices."""

    def __init__(self, scale: float, masked_value: float = -1e9) -> None:
        super().__init__()
        self.scale, self.masked_value = float(scale), float(masked_value)

    def construct(self, q, k, v, mask):
        p = _softmax(_masked_fill(_bmm_nt(q * self.scale, k), mask, self.masked_value))
        return _bmm(p, v), p

    def bprop(self, q, k, v, mask, out, dout):
        p, dout = out[1], dout[0]
        dp = _bmm_nt(dout, v)
        c = _rowsum(dp * p)
        ds = _masked_fill((dp - _tile(c, (1, 1, 1, p.shape[-1]))) * p, mask, 0.0)
        return _bmm(ds, k) * self.scale, _bmm_tn(ds, q) * self.scale, _bmm_tn(p, dout), ops.zeros_like(mask)


class SiluMulFn(nn.Cell):
    """SwiGLU's ``silu(gate) · up`` on same-shape inputs."""

    def construct(self, gate, up):
        return mint.nn.functional.silu(gate) * up

    def bprop(self, gate, up, out, dout):
        sg = mint.sigmoid(gate)
        return dout * up * (sg * (1.0 + gate * (1.0 - sg))), dout * (gate * sg)


# primitives, so a bprop compiles under ``ms.jit`` (see `_tile`); not ``ops.GeLU()``, which is the tanh approximation
_erf, _exp = ops.Erf(), ops.Exp()
_SQRT_HALF, _INV_SQRT_2PI = 0.7071067811865476, 0.3989422804014327


def _gelu(x):
    """The exact GELU ``x·Φ(x)``, ``Φ(x) = (1 + erf(x/√2))/2``."""
    return 0.5 * x * (1.0 + _erf(x * _SQRT_HALF))


def _gelu_grad(x):
    """``GELU'(x) = Φ(x) + x·φ(x)`` of the exact (erf) GELU."""
    return 0.5 * (1.0 + _erf(x * _SQRT_HALF)) + x * (_exp(-0.5 * x * x) * _INV_SQRT_2PI)


class GeluMulFn(nn.Cell):
    """GeGLU's ``gelu(gate) · up`` (exact erf GELU: the reference's ``GELU(approximate='none')``, the default
    its MLP builds — mindformers 2.1.0 pynative/layers/activation.py ``get_activation``)."""

    def construct(self, gate, up):
        return _gelu(gate) * up

    def bprop(self, gate, up, out, dout):
        return dout * up * _gelu_grad(gate), dout * _gelu(gate)


class GeluFn(nn.Cell):
    """A non-gated MLP's exact (erf) ``gelu(h)``; ``bprop`` like `GeluMulFn`'s gate lane."""

    def construct(self, h):
        return _gelu(h)

    def bprop(self, h, out, dout):
        return (dout * _gelu_grad(h),)


class SiluFn(nn.Cell):
    """A non-gated MLP's ``silu(h) = h·σ(h)``."""

    def construct(self, h):
        return mint.nn.functional.silu(h)

    def bprop(self, h, out, dout):
        sg = mint.sigmoid(h)
        return (dout * (sg * (1.0 + h * (1.0 - sg))),)


class HeadCrossEntropyFn(nn.Cell):
    """``Σᵢ wᵢ·(logsumexp(zᵢ) − zᵢ[yᵢ])`` with ``z = h·Wᵀ``: the LM head and the token losses in one
    function, so the backward never builds ``softmax − onehot`` over the vocabulary:

        dh = w ⊙ (P·W − W[y])          dW = Pᵀ·(w ⊙ h) − scatter_y(w ⊙ h)

    ``h (N, H)``, ``weight (V, H)``, ``labels (N,)`` int32 in range, ``wts (N,)`` the per-token weights
    (mask / count). Returns ``(loss, probs)``; the second output only carries ``P`` to the backward, and
    callers ignore it.

    The forward takes one softmax pass (``mint.softmax``, ~2× ``LogSoftmax`` here) and takes each token's
    loss as ``−log P[y]``; a token whose ``P[y]`` fell below ``UNDERFLOW`` (a loss above ~69, where the
    float32 probability loses digits) gets the exact ``logsumexp(z) − z[y]`` instead, with ``logsumexp(z) =
    z[t] − log P[t]`` at the row's most probable ``t`` (one arg-max pass). All on the device: nothing crosses
    the host (it used to read ``P[y]`` and the weights back and write the losses; bench/host_roundtrips.py,
    f+b of the bench's head, V = 32000, loaded machine: device/host 1.006 at N = 1024, 0.96–1.03 at N = 256).
    A weight-0 token adds 0 (its loss is finite either way).
    """

    UNDERFLOW = 1e-30

    def construct(self, h, weight, labels, wts):
        z = _mm_nt(h, weight)
        p = mint.softmax(z, -1)
        lab = labels.reshape(-1, 1)
        py = ops.gather_elements(p, 1, lab).reshape(-1)
        top, p_top = _argmax(p)  # P at the row's best never underflows (≥ 1/V): logsumexp(z) = z[top] − log P[top]
        exact = ops.gather_elements(z, 1, top.reshape(-1, 1)).reshape(-1) - ops.log(p_top) \
            - ops.gather_elements(z, 1, lab).reshape(-1)
        ce = ops.where(py >= self.UNDERFLOW, -ops.log(ops.maximum(py, self.UNDERFLOW)), exact)
        return (ce * wts).sum(), p

    def bprop(self, h, weight, labels, wts, out, dout):
        p = out[1]
        sw = _col((wts * dout[0]).reshape(-1, 1), h.shape[1])  # (N, H)
        hw = h * sw
        dweight = ops.index_add(_mm_tn(p, hw), labels, -hw, 0)
        dh = (_mm(p, weight) - ops.gather(weight, labels, 0)) * sw
        return dh, dweight, ops.zeros_like(labels), ops.zeros_like(wts)
