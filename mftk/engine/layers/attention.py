"""Causal self-attention with GQA and qk-norm (Qwen3; models.md §2.8–2.9), CPU-safe ops only.

Core attention is explicit: ``softmax(scale·q·kᵀ, masked) · v`` with a hand-written backward
(`kernels.CoreAttentionFn`). Masked logits are set to a finite −1e9 so a fully masked row (a sequence
starting with the pad token) yields a uniform row instead of NaN.

`CoreAttention` is the cell the reference names ``core_attention``: with ``track_max_logits`` it keeps
``max_logits_val [nh]`` (fp32, no gradient, not trained), the running per-head max of the scaled,
masked logits — what QK-clip / Muon and `MaxLogitsMonitor` read (models.md §2.9). It starts at 0, as
the reference's, so a head whose logits are all negative reads 0.
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from .registry import kernel
from .linear import Linear
from .norm import RMSNorm
from .ops_cpu import split_last
from .rope import apply_rope

MASKED = -1e9


def causal_mask(seq_len: int) -> Tensor:
    """``(1, 1, S, S)`` bool, True = masked (key after query)."""
    return Tensor(np.triu(np.ones((seq_len, seq_len), bool), 1)[None, None])


def core_attention(q, k, v, mask, scale: float, max_logits=None, fn=None):
    """``q (B, nh, S, d)``, ``k (B, ng, S, d)``, ``v (B, ng, S, dv)``, ``mask (B|1, 1, S, S)`` → ``(B, S, nh·dv)``.

    GQA without copying kv: query heads of one group are stacked along the row axis, so query head
    h uses kv head ⌊h/r⌋ (group-major, as the reference and HF). The mask is tiled to the scores'
    shape (broadcasting is the slow path on CPU) and the softmax runs in `kernels.CoreAttentionFn`
    (``fn``; one is made when omitted). ``max_logits``: an ``(nh,)`` Parameter raised in place to the
    per-head max of the masked scaled logits (no gradient flows).
    """
    b, nh, s, _ = q.shape
    ng, sk = k.shape[1], k.shape[2]  # sk > s under context parallel: keys of the whole sequence
    r = nh // ng
    qg = q.reshape(b, ng, r * s, q.shape[-1])  # (B, ng, r·S, d)
    full = ops.tile(mask.reshape(mask.shape[0], 1, 1, s, sk), (b // mask.shape[0], ng, r, 1, 1))
    full = full.reshape(b, ng, r * s, sk)  # the scores' own shape
    if max_logits is not None:  # head h = g·r + i; masked logits (−1e9) never win against a real one
        scores = ops.stop_gradient(ops.masked_fill(mint.matmul(qg, ops.swapaxes(k, -1, -2)) * scale, full, MASKED))
        ops.assign(max_logits, ops.maximum(max_logits, scores.reshape(b, ng, r, s, sk).max(axis=(0, 3, 4)).reshape(nh)))
    out = (fn if fn is not None else kernel("core_attention")(scale, MASKED))(qg, k, v, full)[0].reshape(b, nh, s, v.shape[-1])
    return ops.transpose(out, (0, 2, 1, 3)).reshape(b, s, nh * v.shape[-1])


class CoreAttention(nn.Cell):
    """``softmax(scale·q·kᵀ, masked) · v`` as a cell, so the tracked max has the reference's name
    ``…self_attention.core_attention.max_logits_val``. Without tracking it holds no parameter."""

    def __init__(self, num_heads: int, scale: float, track_max_logits: bool = False) -> None:
        super().__init__()
        self.scale = float(scale)
        self.max_logits_val = (Parameter(Tensor(np.zeros((num_heads,), np.float32)), name="max_logits_val",
                                         requires_grad=False) if track_max_logits else None)
        self.fn = kernel("core_attention")(self.scale, MASKED)

    def construct(self, q, k, v, mask):
        return core_attention(q, k, v, mask, self.scale, self.max_logits_val, self.fn)

    def reset_max_logits(self) -> None:
        if self.max_logits_val is not None:
            # assign, not set_data: a compiled block (GPTModel.jit_blocks) keeps writing the old buffer after set_data
            ops.assign(self.max_logits_val, ops.zeros_like(self.max_logits_val))


class SelfAttention(nn.Cell):
    """GQA attention; ``linear_qkv`` rows are group-interleaved ``[q_g0..q_g(r-1) | k_g | v_g]`` per group.

    The head counts are read from the projection's output, so the same forward runs on this rank's
    heads when tensor parallel keeps a row block of ``linear_qkv`` (whole groups, because the rows are
    group-major) and the matching column block of ``linear_proj`` (`parallel.parallelize`).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_groups: int, head_dim: int, *,
                 eps: float = 1e-6, qk_layernorm: bool = True, bias: bool = False,
                 track_max_logits: bool = False) -> None:
        super().__init__()
        self.r, self.hd = num_heads // num_groups, head_dim  # query heads per group, head size
        self.linear_qkv = Linear(hidden_size, (num_heads + 2 * num_groups) * head_dim, bias=bias)
        self.linear_proj = Linear(num_heads * head_dim, hidden_size)
        self.q_layernorm = RMSNorm(head_dim, eps) if qk_layernorm else None
        self.k_layernorm = RMSNorm(head_dim, eps) if qk_layernorm else None
        self.scale = head_dim ** -0.5
        self.core_attention = CoreAttention(num_heads, self.scale, track_max_logits)

    def construct(self, x, rope, mask):
        r, hd = self.r, self.hd
        qkv = self.linear_qkv(x)
        b, s = qkv.shape[0], qkv.shape[1]
        qkv = qkv.reshape(b, s, -1, (r + 2) * hd)  # (B, S, ng, (r+2)·hd)
        q, k, v = split_last(qkv, (r * hd, hd, hd))
        q = q.reshape(b, s, -1, hd)  # (B, S, nh, hd)
        if self.q_layernorm is not None:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (ops.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # (B, heads, S, hd)
        return self.linear_proj(self.core_attention(q, k, v, mask))
