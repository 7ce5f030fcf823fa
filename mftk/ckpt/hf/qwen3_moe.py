"""Qwen3-MoE: HF hub names ↔ reference-style names, numpy only (mindformers-2.1.md §6.2–§6.3).

Attention is Qwen3's (`qwen3.state_dict.attention_to_mf`: group-interleaved ``linear_qkv``); dense layers as Qwen3's;
MoE layers: ``mlp.gate.weight`` ↔ ``mlp.router.weight``, per-expert ``gate_proj``/``up_proj``/``down_proj``
(the hub layout; transformers packs them at load) ↔ ``experts.weight1 [E, H, 2F]`` = ``[gateᵀ | upᵀ]``,
``weight2 [E, F, H]`` = ``downᵀ``; ``tokens_per_expert`` has no HF counterpart (zeros on import).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.ckpt.hf.convert import Source, ends_to_hf, ends_to_mf, dense_mlp_to_hf, dense_mlp_to_mf, stack_experts, unstack_experts
from mftk.ckpt.hf.qwen3 import attention_to_hf, attention_to_mf

_NAMES = ("gate", "up", "down")  # per-expert projections
_ENDS = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")  # HF embedding, final norm, output layer


def hf_to_mf(hf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """HF ``Qwen3MoeForCausalLM`` hub tensors → reference-style names; raises CheckpointError on any mismatch."""
    src, out = Source(hf, "HF"), {}
    ends_to_mf(src, out, cfg.tie_word_embeddings, _ENDS)
    for i, moe in enumerate(cfg.moe_layer_pattern()):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention_to_mf(src, p, m, cfg, out)
        if not moe:
            dense_mlp_to_mf(src, p, m, out)
            continue
        out[m + "mlp.router.weight"] = src.take(p + "mlp.gate.weight")
        w = stack_experts(src, lambda e, x: p + f"mlp.experts.{e}.{x}_proj.weight", cfg.num_experts, _NAMES)
        if w is not None:
            out[m + "mlp.experts.weight1"], out[m + "mlp.experts.weight2"] = w
        out[m + "mlp.tokens_per_expert"] = np.zeros((cfg.num_experts,), np.float32)
    src.check()
    return {k: v for k, v in out.items() if v is not None}


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference-style names → HF ``Qwen3MoeForCausalLM`` hub names (the inverse of ``hf_to_mf``)."""
    src, out = Source(mf, "mftk"), {}
    ends_to_hf(src, out, cfg.tie_word_embeddings, _ENDS)
    for i, moe in enumerate(cfg.moe_layer_pattern()):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention_to_hf(src, p, m, cfg, out)
        if not moe:
            dense_mlp_to_hf(src, p, m, out)
            continue
        out[p + "mlp.gate.weight"] = src.take(m + "mlp.router.weight")
        w1, w2 = src.take(m + "mlp.experts.weight1"), src.take(m + "mlp.experts.weight2")
        if w1 is not None and w2 is not None:
            unstack_experts(w1, w2, lambda e, x: p + f"mlp.experts.{e}.{x}_proj.weight", _NAMES, out)
        src.skip(m + "mlp.tokens_per_expert")
    src.check()
    return {k: v for k, v in out.items() if v is not None}
