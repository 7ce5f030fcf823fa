"""Qwen3-MoE spec builder: Qwen3's attention (GQA + qk-norm) and the shared MoE parts (softmax router, no
shared experts, no expert bias); dense SwiGLU layers where ``decoder_sparse_step`` / ``mlp_only_layers`` say.
No new layer code: the point of the spec mechanism."""
from __future__ import annotations

from mftk.engine.layers.attention import SelfAttention
from mftk.engine.layers.mlp import MLP
from mftk.engine.layers.moe import MoELayer
from mftk.engine.layers.norm import RMSNorm
from mftk.engine.layers.rope import rotary_table
from mftk.engine.spec import LayerSpec, ModelSpec, ModuleSpec, mlp_params


def qwen3_moe_spec(cfg) -> ModelSpec:
    h, eps, hd = cfg.hidden_size, cfg.rms_norm_eps, cfg.kv_channels()
    norm = ModuleSpec(RMSNorm, {"dim": h, "eps": eps})
    attention = ModuleSpec(SelfAttention, {"hidden_size": h, "num_heads": cfg.num_attention_heads,
                                           "num_groups": cfg.num_query_groups(), "head_dim": hd, "eps": eps,
                                           "qk_layernorm": True, "bias": cfg.attention_bias,
                                           "track_max_logits": bool(cfg.track_max_attention_logit)})
    dense = LayerSpec(attention, ModuleSpec(MLP, {"hidden_size": h, "ffn_hidden_size": cfg.intermediate_size,
                                                        **mlp_params(cfg, gated_only=True)}), norm)
    moe = LayerSpec(attention, ModuleSpec(MoELayer, {
        "hidden_size": h, "num_experts": cfg.num_experts, "topk": cfg.num_experts_per_tok,
        "ffn_hidden_size": cfg.moe_intermediate_size, "score_function": "softmax", "norm_topk_prob": cfg.norm_topk_prob,
        "scaling_factor": cfg.routed_scaling_factor, "aux_loss_type": cfg.moe_router_load_balancing_type,
        "aux_loss_coeff": cfg.moe_aux_loss_coeff, **mlp_params(cfg, gated_only=True)}), norm, is_moe=True)
    return ModelSpec(
        vocab_size=cfg.vocab_size, hidden_size=h, layers=tuple(moe if m else dense for m in cfg.moe_layer_pattern()),
        final_norm=norm, rope=lambda: rotary_table(hd, float(cfg.rope_theta)), tie_word_embeddings=cfg.tie_word_embeddings,
        aux_loss_coeff=cfg.moe_aux_loss_coeff, init_std=cfg.initializer_range,
        pad_token_id=cfg.pad_token_id if cfg.pad_token_id is not None else -1, hidden_dropout=cfg.hidden_dropout,
    )
