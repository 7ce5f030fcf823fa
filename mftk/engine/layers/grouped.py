"""The routed experts as padded batched matmuls with a hand-written backward (`GroupedExpertsFn`).

Why: a per-expert loop (``xs[a:b] @ weight1[e]``) costs a slice of each weight per expert in the
forward and, under autodiff, a full-size zero gradient per expert slice that is then summed — E
copies of the expert tensors per MoE layer; the backward took 5× the forward on CPU
(bench/train_step.py ``--arch deepseek_v4``). Here the dispatched rows are laid out as
``(E, n_max, H)`` (each expert's rows, padded to the busiest expert's count; padding rows get
routing weight 0, so they add nothing and receive no gradient) and every product is one
``BatchMatMul``: forward ``[g | u] = x·W1``, ``y = act(g, u)·W2``; backward ``dW2 = act(g, u)ᵀ·dy``,
``dg, du = act'(g, u; dy·W2ᵀ)``, ``dW1 = xᵀ·[dg | du]``, ``dx = [dg | du]·W1ᵀ``.

`WeightedCombineFn` scatters the weighted result rows back to their tokens with its own backward (a
row gather; autodiff's masks, broadcasts and selects for ``unsorted_segment_sum`` cost ~15 ms a MoE layer).

``act(gate, up)`` is `kernels.SiluMulFn` or `kernels_v4.ClampedSiluMulFn`; their ``bprop`` gives the
activation's input gradients.
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, mint, nn, ops

_bmm = ops.BatchMatMul()
_bmm_nt = ops.BatchMatMul(transpose_b=True)
_bmm_tn = ops.BatchMatMul(transpose_a=True)
_tile = ops.Tile()
_mm = ops.MatMul()


def padded_layout(flat_ids: np.ndarray, num_experts: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """For the (token, choice) pairs in ``flat_ids`` (T·K expert ids, token-major): ``(slot_pair, slot_token,
    counts, n_max)`` — for each of the ``E·n_max`` padded slots the pair index (−1: padding) and its token
    (0 for padding), per-expert counts, and the padded width (expert order, token order kept)."""
    counts = np.bincount(flat_ids, minlength=num_experts)
    n_max = max(int(counts.max()), 1)
    order = np.argsort(flat_ids, kind="stable")  # pairs grouped by expert
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    experts = flat_ids[order]
    slots = experts * n_max + (np.arange(order.size) - starts[experts])
    slot_pair = np.full(num_experts * n_max, -1, np.int64)
    slot_pair[slots] = order
    return slot_pair, np.where(slot_pair < 0, 0, slot_pair // k), counts, n_max


def padded_layout_ops(idx, num_experts: int) -> tuple:
    """`padded_layout` in MindSpore ops from ``idx (T, K)``: ``(slot_pair, slot_token, counts, n_max)``, the
    first three tensors; ``n_max`` is still read back (one scalar: the padded width is a tensor shape). Pairs
    are grouped by expert with ``ops.sort`` of ``expert·T·K + pair``: unique keys, so the stable order
    (``ops.topk`` and MindSpore 2.10's ``ops.sort`` promise none; equal expert ids must keep token order).
    Not what the model runs: bench/host_roundtrips.py ``moe_dispatch`` measures it 27–29× the host's
    (one ``idx`` read, `padded_layout`, two index writes: ~1 ms; bench/results/2026-12-05-host_roundtrips.md)."""
    t, k = idx.shape
    flat = idx.reshape(-1)
    pos = ops.range(Tensor(0, idx.dtype), Tensor(t * k, idx.dtype), Tensor(1, idx.dtype))
    _, order = ops.sort(flat * (t * k) + pos)
    experts = ops.gather(flat, order, 0)
    counts = ops.unsorted_segment_sum(ops.ones_like(flat), flat, num_experts)
    n_max = max(int(counts.max().asnumpy()), 1)
    rank = pos - ops.gather(ops.cumsum(counts, 0) - counts, experts, 0)
    slot_pair = ops.tensor_scatter_elements(ops.full((num_experts * n_max,), -1, dtype=idx.dtype),
                                            experts * n_max + rank, order.astype(idx.dtype), axis=0)
    return slot_pair, ops.where(slot_pair >= 0, slot_pair // k, 0), counts, n_max


class GroupedExpertsFn(nn.Cell):
    """``y[e] = act(x[e]·W1[e])·W2[e]`` for ``x (E, n, H)``, ``W1 (E, H, 2F)`` = [gate | up], ``W2 (E, F, H)``.

    The gate and up lanes of ``h = x·W1`` are taken with a lane ``gather`` (a contiguous copy, ~4× faster on
    CPU than a slice, whose strided view also slows every op after it). Returns ``(y, gate, up, act)``; the
    last three only carry the forward to the backward."""

    def __init__(self, act: nn.Cell, ffn_hidden_size: int) -> None:
        super().__init__()
        self.act, self.f = act, int(ffn_hidden_size)
        lanes = np.arange(2 * self.f, dtype=np.int32)
        self._gate, self._up = Tensor(lanes[:self.f]), Tensor(lanes[self.f:])

    def construct(self, x, w1, w2):
        h = _bmm(x, w1)  # (E, n, 2F)
        gate, up = ops.gather(h, self._gate, 2), ops.gather(h, self._up, 2)  # (E, n, F) each, contiguous
        a = self.act(gate, up)
        return _bmm(a, w2), gate, up, a

    def bprop(self, x, w1, w2, out, dout):
        _, gate, up, a = out
        dy = dout[0]
        dgate, dup = self.act.bprop(gate, up, None, _bmm_nt(dy, w2))
        dh = mint.cat((dgate, dup), -1)  # (E, n, 2F)
        return _bmm_nt(dh, w1), _bmm_tn(x, dh), _bmm_tn(a, dy)


class WeightedCombineFn(nn.Cell):
    """``out[t] = Σ_{s: token[s] = t} w[s]·ys[s]`` for rows ``ys (N, H)``, weights ``w (N, 1)`` and ``token (N,)``
    int32 in ``[0, T)``; ``tokens`` is ``T`` (a Python int). Backward: ``g = dout[token]``, ``dys = w·g``,
    ``dw = Σ_h g·ys`` (a GEMV with ones); the weights are tiled, never broadcast (the slow path on CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self._ones: dict[tuple, Tensor] = {}

    def construct(self, ys, w, token, tokens: int):
        return ops.unsorted_segment_sum(ys * _tile(w, (1, ys.shape[1])), token, tokens)

    def bprop(self, ys, w, token, tokens, out, dout):
        g = ops.gather(dout, token, 0)  # (N, H)
        dw = _mm(g * ys, self._column(ys.shape[1], ys.dtype))  # (N, 1)
        return g * _tile(w, (1, ys.shape[1])), dw, ops.zeros_like(token), 0

    def _column(self, h: int, dtype) -> Tensor:
        if (h, dtype) not in self._ones:
            self._ones[(h, dtype)] = Tensor(np.ones((h, 1), np.float32)).astype(dtype)
        return self._ones[(h, dtype)]
