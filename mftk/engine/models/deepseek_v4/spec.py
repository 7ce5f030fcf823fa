"""DeepSeek-V4 spec builder: every layer a hyper-connection layer of `csa.DeepseekV4Attention` (its ratio from
``compress_ratios``) and `moe_v4.DeepseekV4MoE` (hash-routed for the first ``num_hash_layers``), the
streams collapsed by a `hyper.HyperHead`, MTP layers built like decoder layers without hash routing.
The legacy ``mla`` variant swaps the attention for DeepSeek-V3's `mla.MLASelfAttention` and its one RoPE
table in every layer (`DeepseekV4ModelConfig.plain_mla`).
"""
from __future__ import annotations

from mftk.engine.layers.csa import DeepseekV4Attention
from mftk.engine.layers.hyper import HyperConnection, HyperConnectionTransformerLayer, HyperHead
from mftk.engine.layers.moe_v4 import DeepseekV4MoE
from mftk.engine.layers.norm import RMSNorm
from mftk.engine.layers.rope_pairs import RopeSet
from mftk.engine.models.deepseek_v3.spec import mla_attention, mla_rope
from mftk.engine.spec import LayerSpec, ModelSpec, ModuleSpec


def _attention(cfg, layer_id: int) -> ModuleSpec:
    if cfg.plain_mla():
        return mla_attention(cfg)
    return ModuleSpec(DeepseekV4Attention, {
        "hidden_size": cfg.hidden_size, "num_heads": cfg.num_attention_heads, "q_lora_rank": cfg.q_lora_rank,
        "head_dim": cfg.v_head_dim, "rope_dim": cfg.qk_rope_head_dim, "o_groups": cfg.o_groups,
        "o_lora_rank": cfg.o_lora_rank, "ratio": cfg.compress_ratio(layer_id), "window": cfg.csa_window_size,
        "index_heads": cfg.index_n_heads, "index_dim": cfg.index_head_dim, "index_topk": cfg.index_topk,
        "dense": cfg.csa_dense_mode, "eps": cfg.rms_norm_eps, "indexer_loss": cfg.dsa_indexer_loss_coeff > 0})


def _moe(cfg, hash_routing: bool) -> ModuleSpec:
    return ModuleSpec(DeepseekV4MoE, {
        "hidden_size": cfg.hidden_size, "num_experts": cfg.n_routed_experts, "topk": cfg.num_experts_per_tok,
        "ffn_hidden_size": cfg.moe_intermediate_size,
        "shared_ffn_hidden_size": cfg.moe_shared_expert_intermediate_size_resolved(),
        "score_function": cfg.moe_router_score_function, "n_group": cfg.n_group or 0, "topk_group": cfg.topk_group or 0,
        "norm_topk_prob": cfg.norm_topk_prob, "scaling_factor": cfg.routed_scaling_factor,
        "enable_expert_bias": cfg.moe_router_enable_expert_bias, "aux_loss_type": cfg.moe_router_load_balancing_type,
        "aux_loss_coeff": cfg.moe_aux_loss_coeff, "hash_routing": hash_routing, "vocab_size": cfg.vocab_size,
        "clamp": cfg.activation_func_clamp_value})


def _layer(cfg, layer_id: int, hash_routing: bool, hyper: ModuleSpec, norm: ModuleSpec) -> LayerSpec:
    return LayerSpec(_attention(cfg, layer_id), _moe(cfg, hash_routing), norm, is_moe=True,
                     layer=HyperConnectionTransformerLayer, hyper=hyper)


def deepseek_v4_spec(cfg) -> ModelSpec:
    h, eps, n = cfg.hidden_size, cfg.rms_norm_eps, cfg.num_residual_streams
    norm = ModuleSpec(RMSNorm, {"dim": h, "eps": eps})
    hyper = ModuleSpec(HyperConnection, {"hidden_size": h, "streams": n, "sinkhorn_iters": cfg.mhc_sinkhorn_iterations,
                                         "hc_eps": cfg.hc_eps, "rms_eps": eps, "init_alpha": cfg.mhc_init_gating_factor})
    L, hashed = cfg.num_hidden_layers, cfg.hash_layer_pattern()
    rp = cfg.rope_params()
    return ModelSpec(
        vocab_size=cfg.vocab_size, hidden_size=h, final_norm=norm,
        layers=tuple(_layer(cfg, i, hashed[i], hyper, norm) for i in range(L)),
        mtp_layers=tuple(_layer(cfg, L + k, False, hyper, norm) for k in range(cfg.mtp_num_layers())),
        rope=mla_rope(cfg.qk_rope_head_dim, cfg.mla_rope_params()) if cfg.plain_mla() else
        lambda: RopeSet(cfg.qk_rope_head_dim, float(cfg.rope_theta), rp.rotary_base,
                        yarn=rp.position_embedding_type == "yarn", factor=rp.factor,
                        original_len=rp.original_max_position_embeddings, beta_fast=rp.beta_fast,
                        beta_slow=rp.beta_slow),
        tie_word_embeddings=cfg.tie_word_embeddings,
        mtp_loss_scaling_factor=float(cfg.mtp_loss_scaling_factor or 0.0),
        aux_loss_coeff=cfg.moe_aux_loss_coeff, bias_update_rate=cfg.moe_router_bias_update_rate,
        init_std=cfg.initializer_range, pad_token_id=cfg.pad_token_id if cfg.pad_token_id is not None else -1,
        hidden_dropout=cfg.hidden_dropout,
        hc_head=ModuleSpec(HyperHead, {"hidden_size": h, "streams": n, "hc_eps": cfg.hc_eps, "rms_eps": eps}),
        indexer_loss_coeff=cfg.dsa_indexer_loss_coeff,
    )
