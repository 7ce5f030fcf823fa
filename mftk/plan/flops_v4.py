"""DeepSeek-V4 parameter counts and training FLOPs — pure arithmetic on the `model:` section.

Counts follow the reference's parameter shapes (mindformers-2.1.md §5.8) with its buffers (frozen
``rms_weight``/``q_rms_gamma``, ``expert_bias``, ``tokens_per_expert``, ``tid2eid``), so the total equals
the number of values mftk saves. FLOPs use the Megatron convention of `flops.py` (6 × matmul
parameters per token, plus attention): the core attention of a layer costs ``12·nh·d`` per key a
query sees — the window (``min(w, p+1)`` on average over positions) plus the compressed entries
(half of ``S/r`` on average; CSA at most ``index_topk``) — and CSA layers add the indexer's scoring.
"""
from typing import Any


def is_v4(cfg: Any) -> bool:
    return hasattr(cfg, "num_residual_streams")


def _compressor(H: int, d: int, r: int) -> int:
    c = 2 if r == 4 else 1
    return 2 * c * d * H + r * c * d + d  # linear_wkv, linear_wgate, ape, norm


def _plain_mla(cfg: Any) -> bool:
    return getattr(cfg, "experimental_attention_variant", "dsv4_hybrid") == "mla"


def _mla_params(cfg: Any) -> int:
    """The legacy ``mla`` variant's attention: DeepSeek-V3's MLA with Q LoRA and both latent norms."""
    H, nh, rq, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.q_lora_rank, cfg.kv_lora_rank
    nope, rope, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    bias = bool(cfg.attention_bias)
    out = rq + kv + rope
    n = out * H + (out if bias else 0) + rq + kv                        # linear_qkv, q/k layernorms
    n += nh * (nope + rope) * rq + (nh * (nope + rope) if bias else 0)  # linear_qb
    n += nh * (nope + v) * kv + (nh * (nope + v) if bias else 0)        # linear_kvb
    return n + H * nh * v + (nh if cfg.track_max_attention_logit else 0)  # linear_proj, max-logit buffer


def attention_params(cfg: Any, layer_id: int) -> int:
    """One DeepSeek-V4 ``self_attention`` (with its compressor and indexer) at global layer ``layer_id``."""
    if _plain_mla(cfg):
        return _mla_params(cfg)
    H, nh, d, rq, g, ro = (cfg.hidden_size, cfg.num_attention_heads, cfg.v_head_dim, cfg.q_lora_rank, cfg.o_groups,
                           cfg.o_lora_rank)
    n = rq * H + rq + nh * d * rq + d                       # q down, q_layernorm, q up, q_rms_gamma
    n += d * H + d                                          # linear_kv_proj, kv_layernorm
    n += g * ro * (nh * d // g) + H * g * ro + nh           # linear_o_group_proj, linear_proj, attn_sink
    r = cfg.compress_ratio(layer_id)
    if r > 0:
        n += _compressor(H, d, r)
    if r == 4 and not cfg.csa_dense_mode:
        nI, dI = cfg.index_n_heads, cfg.index_head_dim
        n += nI * dI * rq + nI * H + _compressor(H, dI, 4)  # linear_wq_b, linear_weights_proj, its compressor
    return n


def hyper_params(cfg: Any) -> int:
    """One hyper-connection (attn_hc or ffn_hc): mapping weight and bias, three alphas, frozen rms_weight."""
    n, H = cfg.num_residual_streams, cfg.hidden_size
    m = (2 + n) * n
    return m * n * H + m + 3 + n * H


def head_params(cfg: Any) -> int:
    n = cfg.num_residual_streams
    return n * n * cfg.hidden_size + n + 1  # hc_fn, hc_base, hc_scale


def moe_params(cfg: Any, hashed: bool) -> tuple[int, int]:
    """One layer's MoE: (total, active per token)."""
    H, E, K, F = cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
    per_expert = 3 * F * H
    router = E * H + E                                                   # weight, tokens_per_expert
    router += cfg.vocab_size * K if hashed else (E if cfg.moe_router_enable_expert_bias else 0)
    if cfg.moe_router_load_balancing_type == "global_aux_loss" and cfg.moe_aux_loss_coeff > 0:
        router += E + 1
    Fs = cfg.moe_shared_expert_intermediate_size_resolved()
    shared = 3 * Fs * H
    return router + E * per_expert + shared, router + K * per_expert + shared


def layer_params(cfg: Any, layer_id: int, hashed: bool) -> tuple[int, int]:
    base = attention_params(cfg, layer_id) + 2 * hyper_params(cfg) + 2 * cfg.hidden_size  # + the two RMSNorms
    total, active = moe_params(cfg, hashed)
    return base + total, base + active


def param_breakdown(cfg: Any) -> dict[str, int]:
    H, V, L = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    hashed = cfg.hash_layer_pattern()
    layers = [layer_params(cfg, i, hashed[i]) for i in range(L)]
    mtp = [layer_params(cfg, L + k, False) for k in range(cfg.mtp_num_layers())]
    mtp_extra = 3 * H + 2 * H * H + head_params(cfg)         # enorm, hnorm, final_layernorm, eh_proj, hc_head
    b = {"embedding": V * H, "output_layer": 0 if cfg.tie_word_embeddings else V * H,
         "final_layernorm": H + head_params(cfg), "dense_layers": 0, "moe_layers": sum(t for t, _ in layers),
         "mtp": sum(t + mtp_extra for t, _ in mtp)}
    b["total"] = sum(b.values())
    b["active"] = (b["embedding"] + b["output_layer"] + b["final_layernorm"] + sum(a for _, a in layers)
                   + sum(a + mtp_extra for _, a in mtp))
    return b


def _keys_per_query(cfg: Any, S: int, r: int) -> float:
    """Average number of keys a query attends to: window part plus visible (CSA: selected) compressed entries."""
    w = min(cfg.csa_window_size, S)
    window = w - w * (w - 1) / (2 * S)  # mean over p of min(w, p + 1)
    if r == 0:
        return window
    visible = (S // r) / 2
    if r == 4 and not cfg.csa_dense_mode:
        visible = min(visible, cfg.index_topk)
    return window + visible


def _layer_flops_per_token(cfg: Any, layer_id: int, S: int, moe_active_matmul: int) -> float:
    H, nh, d = cfg.hidden_size, cfg.num_attention_heads, cfg.v_head_dim
    n = cfg.num_residual_streams
    matmul = attention_params(cfg, layer_id) + 2 * (2 + n) * n * n * H + moe_active_matmul
    if _plain_mla(cfg):  # causal attention over S keys: q·k on nope+rope lanes, p·v on v lanes (mean S/2 keys)
        return 6 * matmul + 6 * nh * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + d) * S / 2
    r = cfg.compress_ratio(layer_id)
    core = 12 * nh * d * _keys_per_query(cfg, S, r)
    if r == 4 and not cfg.csa_dense_mode:
        core += 6 * cfg.index_n_heads * cfg.index_head_dim * (S // r) / 2  # index scores over the causal entries
    return 6 * matmul + core


def flops_per_step(cfg: Any, *, seq_length: int | None = None, global_batch_size: int) -> float:
    S = cfg.seq_length if seq_length is None else seq_length
    H, V, L, K, F = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers, cfg.num_experts_per_tok, \
        cfg.moe_intermediate_size
    moe = K * 3 * F * H + 3 * cfg.moe_shared_expert_intermediate_size_resolved() * H + cfg.n_routed_experts * H
    D = cfg.mtp_num_layers()
    per_token = sum(_layer_flops_per_token(cfg, i, S, moe) for i in range(L + D))
    per_token += 6 * D * 2 * H * H + 6 * H * V * (D + 1)      # eh_proj, output layer (main + MTP)
    return float(global_batch_size) * S * per_token
