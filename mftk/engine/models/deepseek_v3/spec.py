"""DeepSeek-V3 spec builder: MLA attention, dense MLP for the first k layers then MoE, YaRN, MTP.

The MTP layer reuses the *last* decoder layer's spec (MoE for DeepSeek-V3), as the reference does.
"""
from __future__ import annotations

from mftk.engine.layers.mla import MLASelfAttention
from mftk.engine.layers.mlp import MLP
from mftk.engine.layers.moe import MoELayer
from mftk.engine.layers.norm import RMSNorm
from mftk.engine.layers.rope import rotary_table
from mftk.engine.spec import LayerSpec, ModelSpec, ModuleSpec, mlp_params


def _moe_spec(cfg) -> ModuleSpec:
    return ModuleSpec(MoELayer, {
        "hidden_size": cfg.hidden_size, "num_experts": cfg.n_routed_experts, "topk": cfg.num_experts_per_tok,
        "ffn_hidden_size": cfg.moe_intermediate_size,
        "shared_ffn_hidden_size": cfg.moe_shared_expert_intermediate_size_resolved(),
        "shared_gate": cfg.use_shared_expert_gating, "score_function": cfg.moe_router_score_function,
        "n_group": cfg.n_group or 0, "topk_group": cfg.topk_group or 0, "norm_topk_prob": cfg.norm_topk_prob,
        "scaling_factor": cfg.routed_scaling_factor, "enable_expert_bias": cfg.moe_router_enable_expert_bias,
        "aux_loss_type": cfg.moe_router_load_balancing_type, "aux_loss_coeff": cfg.moe_aux_loss_coeff,
        **mlp_params(cfg, gated_only=True),
    })


def mla_attention(cfg) -> ModuleSpec:
    """DeepSeek-V3's MLA attention (also DeepSeek-V4's legacy ``mla`` variant)."""
    return ModuleSpec(MLASelfAttention, {
        "hidden_size": cfg.hidden_size, "num_heads": cfg.num_attention_heads, "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank, "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim,
        "softmax_scale": cfg.mla_softmax_scale(), "eps": cfg.rms_norm_eps, "qk_layernorm": cfg.qk_layernorm,
        "bias": cfg.attention_bias, "track_max_logits": bool(cfg.track_max_attention_logit)})


def mla_rope(dim: int, rp):
    """The MLA models' one RoPE table (YaRN or plain) from `RopeParams` ``rp``."""
    kind = "yarn" if rp.position_embedding_type == "yarn" else "rope"
    return lambda: rotary_table(dim, rp.rotary_base, kind=kind, factor=rp.factor,
                                original_len=rp.original_max_position_embeddings, beta_fast=rp.beta_fast,
                                beta_slow=rp.beta_slow, mscale=rp.mscale, mscale_all_dim=rp.mscale_all_dim)


def deepseek_v3_spec(cfg) -> ModelSpec:
    h, eps = cfg.hidden_size, cfg.rms_norm_eps
    norm = ModuleSpec(RMSNorm, {"dim": h, "eps": eps})
    attention = mla_attention(cfg)
    dense = LayerSpec(attention, ModuleSpec(MLP, {"hidden_size": h, "ffn_hidden_size": cfg.ffn_hidden_size(),
                                                    **mlp_params(cfg, gated_only=True)}), norm)
    moe = LayerSpec(attention, _moe_spec(cfg), norm, is_moe=True)
    layers = tuple(moe if is_moe else dense for is_moe in cfg.moe_layer_pattern())
    d = cfg.num_nextn_predict_layers or 0
    return ModelSpec(
        vocab_size=cfg.vocab_size, hidden_size=h, layers=layers, final_norm=norm,
        rope=mla_rope(cfg.qk_rope_head_dim, cfg.rope_params()),
        tie_word_embeddings=False,  # the reference's DeepSeek-V3 never ties
        mtp_layers=(layers[-1],) * d, mtp_loss_scaling_factor=float(cfg.mtp_loss_scaling_factor or 0.0),
        aux_loss_coeff=cfg.moe_aux_loss_coeff, bias_update_rate=cfg.moe_router_bias_update_rate,
        init_std=cfg.initializer_range, pad_token_id=cfg.pad_token_id if cfg.pad_token_id is not None else 0,
        hidden_dropout=cfg.hidden_dropout,
    )
