"""DeepSeek-V3: HF checkpoint names ↔ reference (MindSpore Transformers PyNative) names, numpy only.

Derived from models.md §3.3. HF uses per-expert tensors (``mlp.experts.{e}.gate_proj.weight``, as in
the published checkpoints; ``transformers`` packs them at load time) and keeps the MTP module as
decoder layer ``L`` (``model.layers.{L}.enorm`` …). Reference layouts:
- ``linear_qkv`` = rows ``[q_a_proj (or q_proj) ; kv_a_proj_with_mqa]``;
- dense / shared ``linear_fc1`` = row-interleaved gate/up;
- ``experts.weight1 [E, H, 2Fm]`` = ``[gateᵀ | upᵀ]``, ``weight2 [E, Fm, H]`` = ``downᵀ``;
- ``mlp.tokens_per_expert`` has no HF counterpart (zeros on import, dropped on export).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.ckpt.hf.convert import Source, deinterleave_rows, interleave_rows

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


def _layer_to_mf(src: Source, p: str, m: str, cfg: Any, moe: bool, out: dict) -> None:
    for a, b in _renames(cfg, moe):
        out[m + b] = src.take(p + a)
    qa = src.take(p + ("self_attn.q_a_proj.weight" if cfg.q_lora_rank else "self_attn.q_proj.weight"))
    kva = src.take(p + "self_attn.kv_a_proj_with_mqa.weight")
    if qa is not None and kva is not None:
        out[m + "self_attention.linear_qkv.weight"] = np.concatenate([qa, kva], 0)
    if not moe:
        g, u = src.take(p + "mlp.gate_proj.weight"), src.take(p + "mlp.up_proj.weight")
        if g is not None and u is not None:
            out[m + "mlp.linear_fc1.weight"] = interleave_rows(g, u)
        return
    e_n = cfg.n_routed_experts
    w1, w2 = [], []
    for e in range(e_n):
        g, u, d = (src.take(p + f"mlp.experts.{e}.{x}_proj.weight") for x in ("gate", "up", "down"))
        if g is not None and u is not None and d is not None:
            w1.append(np.concatenate([g.T, u.T], 1))
            w2.append(d.T)
    if len(w1) == e_n:
        out[m + "mlp.experts.weight1"], out[m + "mlp.experts.weight2"] = np.stack(w1), np.stack(w2)
    if cfg.moe_shared_expert_intermediate_size_resolved():
        g, u = src.take(p + "mlp.shared_experts.gate_proj.weight"), src.take(p + "mlp.shared_experts.up_proj.weight")
        if g is not None and u is not None:
            out[m + "mlp.shared_experts.linear_fc1.weight"] = interleave_rows(g, u)
    if not cfg.moe_router_enable_expert_bias:
        src.skip(p + "mlp.gate.e_score_correction_bias")
    out[m + "mlp.tokens_per_expert"] = np.zeros((e_n,), np.float32)


def hf_to_mf(hf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """HF DeepSeek-V3 state dict (per-expert names, MTP as layer L) → reference names."""
    src, out = Source(hf, "HF"), {}
    L, pattern = cfg.num_hidden_layers, cfg.moe_layer_pattern()
    out["embedding.word_embeddings.weight"] = src.take("model.embed_tokens.weight")
    out["decoder.final_layernorm.weight"] = src.take("model.norm.weight")
    out["output_layer.weight"] = src.take("lm_head.weight")
    for i in range(L):
        _layer_to_mf(src, f"model.layers.{i}.", f"decoder.layers.{i}.", cfg, pattern[i], out)
    for k in range(cfg.num_nextn_predict_layers or 0):
        p, m = f"model.layers.{L + k}.", f"mtp.layers.{k}."
        for a, b in _MTP_RENAMES:
            out[m + b] = src.take(p + a)
        _layer_to_mf(src, p, m + "transformer_layer.", cfg, pattern[-1], out)
        src.skip(p + "embed_tokens.weight")  # shared with the main embedding / LM head
        src.skip(p + "shared_head.head.weight")
    d = cfg.num_nextn_predict_layers or 0
    src.check(ignore_prefixes=tuple(f"model.layers.{L + k}." for k in range(d, 4)))  # MTP layers the config turns off
    return {k: v for k, v in out.items() if v is not None}


def _layer_to_hf(src: Source, p: str, m: str, cfg: Any, moe: bool, out: dict) -> None:
    src.skip(m + "self_attention.core_attention.max_logits_val")  # max-logit tracking: no HF counterpart
    for a, b in _renames(cfg, moe):
        out[p + a] = src.take(m + b)
    qkv = src.take(m + "self_attention.linear_qkv.weight")
    if qkv is not None:
        q_rank = cfg.q_lora_rank or cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
        out[p + ("self_attn.q_a_proj.weight" if cfg.q_lora_rank else "self_attn.q_proj.weight")] = qkv[:q_rank].copy()
        out[p + "self_attn.kv_a_proj_with_mqa.weight"] = qkv[q_rank:].copy()
    if not moe:
        fc1 = src.take(m + "mlp.linear_fc1.weight")
        if fc1 is not None:
            out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = deinterleave_rows(fc1)
        return
    w1, w2, fm = src.take(m + "mlp.experts.weight1"), src.take(m + "mlp.experts.weight2"), cfg.moe_intermediate_size
    if w1 is not None and w2 is not None:
        for e in range(cfg.n_routed_experts):
            out[p + f"mlp.experts.{e}.gate_proj.weight"] = w1[e, :, :fm].T.copy()
            out[p + f"mlp.experts.{e}.up_proj.weight"] = w1[e, :, fm:].T.copy()
            out[p + f"mlp.experts.{e}.down_proj.weight"] = w2[e].T.copy()
    if cfg.moe_shared_expert_intermediate_size_resolved():
        fc1 = src.take(m + "mlp.shared_experts.linear_fc1.weight")
        if fc1 is not None:
            g, u = deinterleave_rows(fc1)
            out[p + "mlp.shared_experts.gate_proj.weight"], out[p + "mlp.shared_experts.up_proj.weight"] = g, u
    if not cfg.moe_router_enable_expert_bias:  # HF always has the buffer
        out[p + "mlp.gate.e_score_correction_bias"] = np.zeros((cfg.n_routed_experts,), np.float32)
    src.skip(m + "mlp.tokens_per_expert")


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference names → HF DeepSeek-V3 checkpoint names (MTP written as layer L with its shared tensors)."""
    src, out = Source(mf, "mftk"), {}
    L, pattern = cfg.num_hidden_layers, cfg.moe_layer_pattern()
    out["model.embed_tokens.weight"] = src.take("embedding.word_embeddings.weight")
    out["model.norm.weight"] = src.take("decoder.final_layernorm.weight")
    out["lm_head.weight"] = src.take("output_layer.weight")
    for i in range(L):
        _layer_to_hf(src, f"model.layers.{i}.", f"decoder.layers.{i}.", cfg, pattern[i], out)
    for k in range(cfg.num_nextn_predict_layers or 0):
        p, m = f"model.layers.{L + k}.", f"mtp.layers.{k}."
        for a, b in _MTP_RENAMES:
            out[p + a] = src.take(m + b)
        _layer_to_hf(src, p, m + "transformer_layer.", cfg, pattern[-1], out)
        out[p + "embed_tokens.weight"] = out["model.embed_tokens.weight"]
        out[p + "shared_head.head.weight"] = out["lm_head.weight"]
    src.check(ignore_prefixes=("mtp.",) if not cfg.num_nextn_predict_layers else ())
    return {k: v for k, v in out.items() if v is not None}
