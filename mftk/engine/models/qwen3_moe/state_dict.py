"""Qwen3-MoE: HF hub names ↔ reference-style names, numpy only (mindformers-2.1.md §6.2–§6.3).

Attention is Qwen3's (`qwen3.state_dict.attention_to_mf`: group-interleaved ``linear_qkv``); dense layers as Qwen3's;
MoE layers: ``mlp.gate.weight`` ↔ ``mlp.router.weight``, per-expert ``gate_proj``/``up_proj``/``down_proj``
(the hub layout; transformers packs them at load) ↔ ``experts.weight1 [E, H, 2F]`` = ``[gateᵀ | upᵀ]``,
``weight2 [E, F, H]`` = ``downᵀ``; ``tokens_per_expert`` has no HF counterpart (zeros on import).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.engine.models.convert import Source, deinterleave_rows, interleave_rows
from mftk.engine.models.qwen3.state_dict import attention_to_hf, attention_to_mf


def hf_to_mf(hf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """HF ``Qwen3MoeForCausalLM`` hub tensors → reference-style names; raises CheckpointError on any mismatch."""
    src, out = Source(hf, "HF"), {}
    out["embedding.word_embeddings.weight"] = src.take("model.embed_tokens.weight")
    out["decoder.final_layernorm.weight"] = src.take("model.norm.weight")
    if cfg.tie_word_embeddings:
        src.skip("lm_head.weight")
    else:
        out["output_layer.weight"] = src.take("lm_head.weight")
    for i, moe in enumerate(cfg.moe_layer_pattern()):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention_to_mf(src, p, m, cfg, out)
        if not moe:
            g, u = src.take(p + "mlp.gate_proj.weight"), src.take(p + "mlp.up_proj.weight")
            out[m + "mlp.linear_fc2.weight"] = src.take(p + "mlp.down_proj.weight")
            if g is not None and u is not None:
                out[m + "mlp.linear_fc1.weight"] = interleave_rows(g, u)
            continue
        out[m + "mlp.router.weight"] = src.take(p + "mlp.gate.weight")
        w1, w2 = [], []
        for e in range(cfg.num_experts):
            g, u, d = (src.take(p + f"mlp.experts.{e}.{x}_proj.weight") for x in ("gate", "up", "down"))
            if g is not None and u is not None and d is not None:
                w1.append(np.concatenate([g.T, u.T], 1))
                w2.append(d.T)
        if len(w1) == cfg.num_experts:
            out[m + "mlp.experts.weight1"], out[m + "mlp.experts.weight2"] = np.stack(w1), np.stack(w2)
        out[m + "mlp.tokens_per_expert"] = np.zeros((cfg.num_experts,), np.float32)
    src.check()
    return {k: v for k, v in out.items() if v is not None}


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference-style names → HF ``Qwen3MoeForCausalLM`` hub names (the inverse of ``hf_to_mf``)."""
    src, out = Source(mf, "mftk"), {}
    out["model.embed_tokens.weight"] = src.take("embedding.word_embeddings.weight")
    out["model.norm.weight"] = src.take("decoder.final_layernorm.weight")
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = src.take("output_layer.weight")
    f = cfg.moe_intermediate_size
    for i, moe in enumerate(cfg.moe_layer_pattern()):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention_to_hf(src, p, m, cfg, out)
        if not moe:
            fc1 = src.take(m + "mlp.linear_fc1.weight")
            out[p + "mlp.down_proj.weight"] = src.take(m + "mlp.linear_fc2.weight")
            if fc1 is not None:
                out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = deinterleave_rows(fc1)
            continue
        out[p + "mlp.gate.weight"] = src.take(m + "mlp.router.weight")
        w1, w2 = src.take(m + "mlp.experts.weight1"), src.take(m + "mlp.experts.weight2")
        if w1 is not None and w2 is not None:
            for e in range(cfg.num_experts):
                out[p + f"mlp.experts.{e}.gate_proj.weight"] = w1[e, :, :f].T.copy()
                out[p + f"mlp.experts.{e}.up_proj.weight"] = w1[e, :, f:].T.copy()
                out[p + f"mlp.experts.{e}.down_proj.weight"] = w2[e].T.copy()
        src.skip(m + "mlp.tokens_per_expert")
    src.check()
    return {k: v for k, v in out.items() if v is not None}
