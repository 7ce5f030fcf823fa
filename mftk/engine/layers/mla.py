"""Multi-head latent attention (DeepSeek-V3; models.md §2.10).

``linear_qkv`` fuses HF's ``q_a_proj`` (or ``q_proj`` without Q LoRA) and ``kv_a_proj_with_mqa``:
output lanes ``[q_a | compressed_kv | k_pe]``. The softmax scale follows the reference:
``g(rotary_scaling_factor, mscale)² / √(nope + rope)`` — it uses ``mscale`` (HF: ``mscale_all_dim``).

The head count is read from the up-projections' outputs, so the same forward runs on this rank's heads
when tensor parallel keeps a row block of ``linear_qb``/``linear_kvb`` and a column block of
``linear_proj`` (the latent ``linear_qkv`` and its norms stay whole; `parallel.parallelize`).
"""
from __future__ import annotations

from mindspore import mint, nn, ops

from .attention import CoreAttention
from .linear import Linear
from .norm import RMSNorm
from .ops_cpu import split_last
from .rope import apply_rope


class MLASelfAttention(nn.Cell):
    def __init__(self, hidden_size: int, num_heads: int, *, q_lora_rank: int | None, kv_lora_rank: int,
                 qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int, softmax_scale: float,
                 eps: float = 1e-6, qk_layernorm: bool = True, bias: bool = False,
                 track_max_logits: bool = False) -> None:
        super().__init__()
        self.nope, self.rope_dim, self.vd = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.dq = qk_nope_head_dim + qk_rope_head_dim
        self.q_rank = q_lora_rank if q_lora_rank else num_heads * self.dq
        self.kv_rank = kv_lora_rank
        self.has_q_lora = bool(q_lora_rank)
        self.linear_qkv = Linear(hidden_size, self.q_rank + kv_lora_rank + qk_rope_head_dim, bias=bias)
        if self.has_q_lora:
            self.q_layernorm = RMSNorm(q_lora_rank, eps) if qk_layernorm else None
            self.linear_qb = Linear(q_lora_rank, num_heads * self.dq)
        self.k_layernorm = RMSNorm(kv_lora_rank, eps) if qk_layernorm else None
        self.linear_kvb = Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim))
        self.linear_proj = Linear(num_heads * v_head_dim, hidden_size)
        self.scale = float(softmax_scale)
        self.core_attention = CoreAttention(num_heads, self.scale, track_max_logits)

    def construct(self, x, rope, mask):
        cos, sin = rope
        latent = self.linear_qkv(x)
        b, s = latent.shape[0], latent.shape[1]  # the whole sequence (tensor parallel gathers it first)
        q_a, ckv, k_pe = split_last(latent, (self.q_rank, self.kv_rank, self.rope_dim))
        if self.has_q_lora:
            if self.q_layernorm is not None:
                q_a = self.q_layernorm(q_a)
            q_a = self.linear_qb(q_a)
        q = q_a.reshape(b, s, -1, self.dq)  # (B, S, nh, nope+rope)
        q_nope, q_pe = split_last(q, (self.nope, self.rope_dim))
        q = mint.cat((q_nope, apply_rope(q_pe, cos, sin, interleaved_input=True)), -1)
        if self.k_layernorm is not None:
            ckv = self.k_layernorm(ckv)
        kv = self.linear_kvb(ckv).reshape(b, s, -1, self.nope + self.vd)  # (B, S, nh, nope+v)
        k_nope, v = split_last(kv, (self.nope, self.vd))
        k_pe = apply_rope(k_pe.reshape(b, s, 1, self.rope_dim), cos, sin, interleaved_input=True)
        k = mint.cat((k_nope, ops.broadcast_to(k_pe, (b, s, kv.shape[2], self.rope_dim))), -1)
        q, k, v = (ops.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # (B, nh, S, ·)
        return self.linear_proj(self.core_attention(q, k, v, mask))
