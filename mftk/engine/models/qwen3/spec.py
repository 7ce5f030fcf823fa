"""Qwen3 spec builder: GQA attention with qk-norm (always on), the MLP ``hidden_act`` / ``gated_linear_unit`` name
(SwiGLU by default; GeGLU, or non-gated GELU/SiLU for a GPT-style model), RMSNorm, plain RoPE."""
from __future__ import annotations

from mftk.engine.layers.attention import SelfAttention
from mftk.engine.layers.mlp import MLP
from mftk.engine.layers.norm import RMSNorm
from mftk.engine.layers.rope import rotary_table
from mftk.engine.spec import LayerSpec, ModelSpec, ModuleSpec, mlp_params


def qwen3_spec(cfg) -> ModelSpec:
    h, eps = cfg.hidden_size, cfg.rms_norm_eps
    hd = cfg.kv_channels()
    norm = ModuleSpec(RMSNorm, {"dim": h, "eps": eps})
    layer = LayerSpec(
        attention=ModuleSpec(SelfAttention, {"hidden_size": h, "num_heads": cfg.num_attention_heads,
                                             "num_groups": cfg.num_query_groups(), "head_dim": hd, "eps": eps,
                                             "qk_layernorm": True, "bias": cfg.attention_bias,
                                             "track_max_logits": bool(cfg.track_max_attention_logit)}),
        mlp=ModuleSpec(MLP, {"hidden_size": h, "ffn_hidden_size": cfg.ffn_hidden_size(), **mlp_params(cfg)}),
        norm=norm,
    )
    return ModelSpec(
        vocab_size=cfg.vocab_size, hidden_size=h, layers=(layer,) * cfg.num_hidden_layers, final_norm=norm,
        rope=lambda: rotary_table(hd, float(cfg.rope_theta)), tie_word_embeddings=cfg.tie_word_embeddings,
        init_std=cfg.initializer_range, pad_token_id=cfg.pad_token_id if cfg.pad_token_id is not None else 0,
        hidden_dropout=cfg.hidden_dropout,
    )
