"""DeepSeek-V3: HF checkpoint names ↔ reference (MindSpore Transformers PyNative) names, numpy only.

Derived from models.md §3.3. HF uses per-expert tensors (``mlp.experts.{e}.gate_proj.weight``, as in
the published checkpoints; ``transformers`` packs them at load time) and keeps the MTP module as
decoder layer ``L`` (``model.layers.{L}.enorm`` …). Reference layouts:
- ``linear_qkv`` = rows ``[q_a_proj (or q_proj) ; kv_a_proj_with_mqa]``;
- dense / shared ``linear_fc1`` = row-interleaved gate/up;
- ``experts.weight1 [E, H, 2Fm]`` = ``[gateᵀ | upᵀ]``, ``weight2 [E, Fm, H]`` = ``downᵀ``;
- ``mlp.tokens_per_expert`` has no HF counterpart (zeros on import, dropped on export).
One table (`table`) holds every tensor; both directions read it.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.ckpt.hf.convert import Rule, apply_table, deinterleave_rows, experts_rule, interleave_rows, rename

_RENAMES = (
    ("input_layernorm.weight", "input_layernorm.weight"),
    ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
    ("self_attn.q_a_layernorm.weight", "self_attention.q_layernorm.weight"),
    ("self_attn.q_b_proj.weight", "self_attention.linear_qb.weight"),
    ("self_attn.kv_a_layernorm.weight", "self_attention.k_layernorm.weight"),
    ("self_attn.kv_b_proj.weight", "self_attention.linear_kvb.weight"),
    ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
)
_MOE_RENAMES = (("mlp.gate.weight", "mlp.router.weight"), ("mlp.gate.e_score_correction_bias", "mlp.expert_bias"),
                ("mlp.shared_experts.down_proj.weight", "mlp.shared_experts.linear_fc2.weight"))
_MTP_RENAMES = (("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"),
                ("eh_proj.weight", "eh_proj.weight"), ("shared_head.norm.weight", "final_layernorm.weight"))


def _renames(cfg: Any, moe: bool) -> list[tuple[str, str]]:
    r = list(_RENAMES)
    if not cfg.q_lora_rank:
        r = [x for x in r if not x[0].startswith(("self_attn.q_a_", "self_attn.q_b_"))]
    if not cfg.qk_layernorm:  # no latent norms in the model (HF always has them: reported as unexpected)
        r = [x for x in r if not x[0].endswith(("q_a_layernorm.weight", "kv_a_layernorm.weight"))]
    if moe:
        r += [x for x in _MOE_RENAMES if cfg.moe_router_enable_expert_bias or "bias" not in x[0]]
        if not cfg.moe_shared_expert_intermediate_size_resolved():
            r = [x for x in r if "shared_experts" not in x[0]]
    else:
        r.append(("mlp.down_proj.weight", "mlp.linear_fc2.weight"))
    return r


def _layer_table(p: str, m: str, cfg: Any, moe: bool) -> list[Rule]:
    """One decoder (or MTP transformer) layer: HF prefix ``p`` ↔ reference prefix ``m``."""
    rows = [Rule((), (m + "self_attention.core_attention.max_logits_val",), to_mf=None, to_hf=None)]  # no HF twin
    rows += [rename(p + a, m + b) for a, b in _renames(cfg, moe)]
    q_rank = cfg.q_lora_rank or cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    rows.append(Rule((p + ("self_attn.q_a_proj.weight" if cfg.q_lora_rank else "self_attn.q_proj.weight"),
                      p + "self_attn.kv_a_proj_with_mqa.weight"), (m + "self_attention.linear_qkv.weight",),
                     to_mf=lambda qa, kva: (np.concatenate([qa, kva], 0),),
                     to_hf=lambda qkv: (qkv[:q_rank].copy(), qkv[q_rank:].copy())))
    if not moe:
        rows.append(Rule((p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"), (m + "mlp.linear_fc1.weight",),
                         to_mf=lambda g, u: (interleave_rows(g, u),), to_hf=deinterleave_rows))
        return rows
    e_n = cfg.n_routed_experts
    rows.append(experts_rule(lambda e, x: p + f"mlp.experts.{e}.{x}_proj.weight", e_n, ("gate", "up", "down"),
                             m + "mlp.experts.weight1", m + "mlp.experts.weight2"))
    if cfg.moe_shared_expert_intermediate_size_resolved():
        rows.append(Rule((p + "mlp.shared_experts.gate_proj.weight", p + "mlp.shared_experts.up_proj.weight"),
                         (m + "mlp.shared_experts.linear_fc1.weight",),
                         to_mf=lambda g, u: (interleave_rows(g, u),), to_hf=deinterleave_rows))
    if not cfg.moe_router_enable_expert_bias:  # HF always has the buffer: dropped on import, zeros on export
        rows.append(Rule((p + "mlp.gate.e_score_correction_bias",), (), to_mf=None,
                         to_hf=lambda: (np.zeros((e_n,), np.float32),)))
    rows.append(Rule((), (m + "mlp.tokens_per_expert",), to_mf=lambda: (np.zeros((e_n,), np.float32),), to_hf=None))
    return rows


def table(cfg: Any) -> list[Rule]:
    """Every tensor of the HF DeepSeek-V3 checkpoint (per-expert names, MTP as layer L) ↔ reference names: both
    directions read it. The MTP layer's ``embed_tokens`` and ``shared_head.head`` are the main embedding and LM
    head (dropped on import, written from them on export)."""
    L, pattern = cfg.num_hidden_layers, cfg.moe_layer_pattern()
    rows = [rename("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
            rename("model.norm.weight", "decoder.final_layernorm.weight"),
            rename("lm_head.weight", "output_layer.weight")]
    for i in range(L):
        rows += _layer_table(f"model.layers.{i}.", f"decoder.layers.{i}.", cfg, pattern[i])
    for k in range(cfg.num_nextn_predict_layers or 0):
        p, m = f"model.layers.{L + k}.", f"mtp.layers.{k}."
        rows += [rename(p + a, m + b) for a, b in _MTP_RENAMES]
        rows += _layer_table(p, m + "transformer_layer.", cfg, pattern[-1])
        rows += [Rule((p + "embed_tokens.weight",), ("embedding.word_embeddings.weight",), to_mf=None),
                 Rule((p + "shared_head.head.weight",), ("output_layer.weight",), to_mf=None)]
    return rows


def hf_to_mf(hf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """HF DeepSeek-V3 state dict (per-expert names, MTP as layer L) → reference names."""
    L, d = cfg.num_hidden_layers, cfg.num_nextn_predict_layers or 0
    # MTP layers the config turns off
    return apply_table(table(cfg), hf, "mf", ignore_prefixes=tuple(f"model.layers.{L + k}." for k in range(d, 4)))


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference names → HF DeepSeek-V3 checkpoint names (MTP written as layer L with its shared tensors)."""
    return apply_table(table(cfg), mf, "hf", ignore_prefixes=("mtp.",) if not cfg.num_nextn_predict_layers else ())
