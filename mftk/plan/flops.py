"""Parameter counts and training FLOPs per step — pure arithmetic on the `model:` section.

Counts follow the parameter shapes of the reference's PyNative checkpoints (models.md §3), buffers
included as `compute_parameters` counts them (`expert_bias`, `tokens_per_expert`, `max_logits_val`),
so a count here equals the number of values in the saved model file. FLOPs follow the
Megatron / MindSpore Transformers convention of models.md §5 (the `throughput` log field).
"""
from typing import Any

from mftk.config.families import MODEL_TYPES
from mftk.plan import flops_v4 as _v4

# Whether a model is MLA comes from the family table; the rest is told apart by attribute.


def _is_mla(cfg: Any) -> bool:
    """DeepSeek-V3's MLA, as the family table says (`config.families`: one owner of the fact). DeepSeek-V4 has
    its own counts, `flops_v4`, though its config carries the ``mla`` variant's ``kv_lora_rank``."""
    family = MODEL_TYPES.get(getattr(cfg, "model_type", None))
    return family is not None and family.mla


def _norm(n: int) -> int:
    return n  # one RMSNorm weight vector


def mtp_is_moe(cfg: Any) -> bool:
    """Whether the MTP layers are MoE layers: they are built like the last decoder layer."""
    pattern = cfg.moe_layer_pattern()
    return bool(pattern) and bool(pattern[-1])


def has_qk_norm(cfg: Any) -> bool:
    """Whether a GQA layer normalises q and k (Qwen3 always; a model config may say no: Llama, GPT)."""
    q = getattr(cfg, "qk_layernorm", True)
    return bool(q() if callable(q) else q)


def attention_params(cfg: Any) -> int:
    """One self-attention block: GQA + qk-norm (Qwen3), MLA (DeepSeek-V3) or, for DeepSeek-V4, its largest layer's."""
    if _v4.is_v4(cfg):
        return max(_v4.attention_params(cfg, i) for i in range(cfg.num_hidden_layers))
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    bias = bool(cfg.attention_bias)
    proj_bias = H if cfg.add_bias_linear else 0
    buffers = nh if cfg.track_max_attention_logit else 0
    if not _is_mla(cfg):
        hd, ng = cfg.kv_channels(), cfg.num_query_groups()
        qkv_out = (nh + 2 * ng) * hd
        return (qkv_out * H + (qkv_out if bias else 0)      # linear_qkv
                + (2 * _norm(hd) if has_qk_norm(cfg) else 0)  # q_layernorm, k_layernorm
                + H * nh * hd + proj_bias + buffers)         # linear_proj
    dq, rope, kv, v = cfg.q_head_dim(), cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
    q_rank = cfg.q_lora_rank if cfg.q_lora_rank else nh * dq
    qkv_out = q_rank + kv + rope
    n = qkv_out * H + (qkv_out if bias else 0)               # linear_qkv (q_a | kv_a | k_pe)
    if cfg.q_lora_rank:
        n += (_norm(q_rank) if cfg.qk_layernorm else 0)      # q_layernorm
        n += nh * dq * q_rank + (nh * dq if bias else 0)     # linear_qb
    kvb_out = nh * (cfg.qk_nope_head_dim + v)
    n += (_norm(kv) if cfg.qk_layernorm else 0)              # k_layernorm
    n += kvb_out * kv + (kvb_out if bias else 0)             # linear_kvb
    return n + H * nh * v + proj_bias + buffers              # linear_proj


def dense_mlp_params(cfg: Any, width: int) -> int:
    """SwiGLU (or plain) MLP of the given width: fc1 [2F or F, H] + fc2 [H, F] (+ biases)."""
    H = cfg.hidden_size
    fc1_out = 2 * width if cfg.gated_linear_unit else width
    bias = (fc1_out + H) if cfg.add_bias_linear else 0
    return fc1_out * H + H * width + bias


def router_buffers(cfg: Any) -> int:
    """The router's non-trainable tensors in one MoE layer (counted in `moe_params`, as `compute_parameters`
    counts them, but given no gradient or optimizer state): tokens_per_expert, [expert_bias], and with the global
    aux loss global_tokens_per_expert and ga_steps."""
    if _v4.is_v4(cfg) or not hasattr(cfg, "n_routed_experts"):
        return 0
    E = cfg.n_routed_experts
    n = 2 * E if cfg.moe_router_enable_expert_bias else E
    if getattr(cfg, "moe_router_load_balancing_type", "") == "global_aux_loss" and cfg.moe_aux_loss_coeff > 0:
        n += E + 1
    return n


def moe_params(cfg: Any) -> tuple[int, int]:
    """One MoE layer's MLP part: (total, active per token)."""
    if _v4.is_v4(cfg):
        return _v4.moe_params(cfg, hashed=False)
    H, E, K, Fm = cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
    per_expert = (2 * Fm if cfg.gated_linear_unit else Fm) * H + Fm * H     # weight1 + weight2 slices
    router = E * H + (2 * E if cfg.moe_router_enable_expert_bias else E)    # weight, [expert_bias], tokens_per_expert
    if getattr(cfg, "moe_router_load_balancing_type", "") == "global_aux_loss" and cfg.moe_aux_loss_coeff > 0:
        router += E + 1                                                     # global_tokens_per_expert, ga_steps
    Fs = cfg.moe_shared_expert_intermediate_size_resolved()
    shared = dense_mlp_params(cfg, Fs) if Fs else 0
    if Fs and getattr(cfg, "use_shared_expert_gating", False):
        shared += H
    return router + E * per_expert + shared, router + K * per_expert + shared


def param_breakdown(cfg: Any) -> dict[str, int]:
    """Parameter counts by part (total), plus `active` (what one token touches)."""
    if _v4.is_v4(cfg):
        return _v4.param_breakdown(cfg)
    H, V, L = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    attn = attention_params(cfg) + 2 * _norm(H)             # + input_layernorm, pre_mlp_layernorm
    dense_layer = attn + dense_mlp_params(cfg, cfg.ffn_hidden_size())
    pattern = cfg.moe_layer_pattern()
    n_moe = sum(pattern)
    moe_total, moe_active = moe_params(cfg) if hasattr(cfg, "n_routed_experts") else (0, 0)
    embedding = V * H
    tied = bool(cfg.tie_word_embeddings) and not _is_mla(cfg)  # the DSv3 PyNative model never ties
    output = 0 if tied else V * H
    D = cfg.mtp_num_layers()
    last_is_moe = mtp_is_moe(cfg)
    mtp_layer = (attn + moe_total) if last_is_moe else dense_layer
    mtp_layer_active = (attn + moe_active) if last_is_moe else dense_layer
    mtp_extra = 3 * _norm(H) + H * 2 * H                     # enorm, hnorm, final_layernorm, eh_proj
    b = {
        "embedding": embedding,
        "output_layer": output,
        "final_layernorm": _norm(H),
        "dense_layers": (L - n_moe) * dense_layer,
        "moe_layers": n_moe * (attn + moe_total),
        "mtp": D * (mtp_extra + mtp_layer),
    }
    b["total"] = sum(b.values())
    b["active"] = (embedding + output + _norm(H) + (L - n_moe) * dense_layer + n_moe * (attn + moe_active)
                   + D * (mtp_extra + mtp_layer_active))
    return b


def param_counts(cfg: Any) -> tuple[int, int]:
    """(total, active) parameters: active counts K routed experts per MoE layer instead of E."""
    b = param_breakdown(cfg)
    return b["total"], b["active"]


def _attention_flops_per_token(cfg: Any, S: int) -> float:
    """A of models.md §5: one layer's attention FLOPs per token, fwd+bwd (factor 6 inside)."""
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    if not _is_mla(cfg):
        hd, ng = cfg.kv_channels(), cfg.num_query_groups()
        q = hd * nh
        return 6 * (H * (q + 2 * hd * ng) + q * S + q * H)
    nope, rope, v, kv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if cfg.q_lora_rank:
        q_term = cfg.q_lora_rank * (H + nh * (nope + rope) + 1)
    else:
        q_term = H * nh * (nope + rope)
    return 6 * (q_term + kv * (H + nh * (nope + v) + 1) + H * rope + nh * v * H
                + S * nh * (nope + rope) / 2 + S * nh * v / 2)


def flops_per_step(cfg: Any, *, seq_length: int | None = None, global_batch_size: int) -> float:
    """Model FLOPs of one training step (fwd + bwd, no recompute), Megatron convention (models.md §5).

    `seq_length` defaults to `model.seq_length`, as the reference uses the config's, not the batch's.
    """
    if _v4.is_v4(cfg):
        return _v4.flops_per_step(cfg, seq_length=seq_length, global_batch_size=global_batch_size)
    S = cfg.seq_length if seq_length is None else seq_length
    H, V, L = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    f = 3 if cfg.hidden_act in ("silu", "swiglu", "fusedswiglu") else 2
    D = cfg.mtp_num_layers()
    pattern = cfg.moe_layer_pattern()
    last_moe = mtp_is_moe(cfg)
    n_moe = sum(pattern) + (D if last_moe else 0)
    n_dense = L - sum(pattern) + (0 if last_moe else D)
    mlp = cfg.ffn_hidden_size() * f * n_dense
    if n_moe:
        K = cfg.num_experts_per_tok
        mlp += (cfg.moe_intermediate_size * K * f + cfg.moe_shared_expert_intermediate_size_resolved() * f) * n_moe
    per_token = (6 * H * mlp
                 + _attention_flops_per_token(cfg, S) * (L + D)
                 + 6 * D * (3 * H + 2 * H * H)
                 + 6 * H * V * (D + 1))
    return float(global_batch_size) * S * per_token


def tflops_per_device(total_flops: float, step_time_ms: float, world_size: int) -> float:
    """The log's `throughput` (T): total_flops / (step_time_ms · 1e9 · world_size)."""
    return total_flops / (step_time_ms * 1e9 * world_size)
