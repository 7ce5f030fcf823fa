"""Qwen3-MoE: HF hub names ↔ reference-style names, numpy only (mindformers-2.1.md §6.2–§6.3).

Attention is Qwen3's (`qwen3.attention_table`: group-interleaved ``linear_qkv``); dense layers as Qwen3's;
MoE layers: ``mlp.gate.weight`` ↔ ``mlp.router.weight``, per-expert ``gate_proj``/``up_proj``/``down_proj``
(the hub layout; transformers packs them at load) ↔ ``experts.weight1 [E, H, 2F]`` = ``[gateᵀ | upᵀ]``,
``weight2 [E, F, H]`` = ``downᵀ``; ``tokens_per_expert`` has no HF counterpart (zeros on import).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.ckpt.hf.convert import Rule, apply_table, dense_mlp_table, ends_table, experts_rule, rename
from mftk.ckpt.hf.qwen3 import attention_table

_NAMES = ("gate", "up", "down")  # per-expert projections
_ENDS = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")  # HF embedding, final norm, output layer


def table(cfg: Any) -> list[Rule]:
    """Every tensor of ``Qwen3MoeForCausalLM`` (hub layout), HF ↔ reference: both directions read it."""
    rows = ends_table(cfg.tie_word_embeddings, _ENDS)
    for i, moe in enumerate(cfg.moe_layer_pattern()):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        rows += attention_table(p, m, cfg)
        if not moe:
            rows += dense_mlp_table(p, m)
            continue
        e = cfg.num_experts
        rows += [rename(p + "mlp.gate.weight", m + "mlp.router.weight"),
                 experts_rule(lambda j, x, p=p: p + f"mlp.experts.{j}.{x}_proj.weight", e, _NAMES,
                              m + "mlp.experts.weight1", m + "mlp.experts.weight2"),
                 Rule((), (m + "mlp.tokens_per_expert",), to_mf=lambda e=e: (np.zeros((e,), np.float32),),
                      to_hf=None)]
    return rows


def hf_to_mf(hf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """HF ``Qwen3MoeForCausalLM`` hub tensors → reference-style names; raises CheckpointError on any mismatch."""
    return apply_table(table(cfg), hf, "mf")


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference-style names → HF ``Qwen3MoeForCausalLM`` hub names (the inverse of ``hf_to_mf``)."""
    return apply_table(table(cfg), mf, "hf")
