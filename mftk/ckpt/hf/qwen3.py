"""Qwen3: HF ``transformers`` names ↔ reference (MindSpore Transformers PyNative) names, numpy only.

Layouts (models.md §3.3): ``linear_qkv`` is group-interleaved ``[q heads of group g | k_g | v_g]`` per
KV group; ``linear_fc1`` rows interleave gate and up. Everything else is a rename. One table (`table`)
holds every tensor; both directions read it.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.ckpt.hf.convert import Rule, apply_table, dense_mlp_table, ends_table, expect_shape, rename

_RENAMES = (  # (HF suffix, MF suffix) of the attention half of a layer (Qwen3-MoE shares it)
    ("input_layernorm.weight", "input_layernorm.weight"),
    ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
    ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
    ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
    ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
)

_ENDS = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")  # HF embedding, final norm, output layer


def _dims(cfg: Any) -> tuple[int, int, int, int]:
    return cfg.hidden_size, cfg.num_attention_heads, cfg.num_query_groups(), cfg.kv_channels()


def qkv_to_mf(q: np.ndarray, k: np.ndarray, v: np.ndarray, ng: int) -> np.ndarray:
    h = q.shape[1]
    return np.concatenate([q.reshape(ng, -1, h), k.reshape(ng, -1, h), v.reshape(ng, -1, h)], 1).reshape(-1, h)


def qkv_to_hf(qkv: np.ndarray, nh: int, ng: int, hd: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    h, r = qkv.shape[1], nh // ng
    g = qkv.reshape(ng, (r + 2) * hd, h)  # (ng, (r+2)·hd, H)
    return (g[:, :r * hd].reshape(-1, h).copy(), g[:, r * hd:(r + 1) * hd].reshape(-1, h).copy(),
            g[:, (r + 1) * hd:].reshape(-1, h).copy())


def attention_table(p: str, m: str, cfg: Any) -> list[Rule]:
    """The norms and the GQA attention of HF layer prefix ``p`` ↔ reference layer prefix ``m``."""
    _, nh, ng, hd = _dims(cfg)
    rows = [rename(p + a, m + b) for a, b in _RENAMES]
    rows.append(Rule(tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv"), (m + "self_attention.linear_qkv.weight",),
                     to_mf=lambda q, k, v: (qkv_to_mf(q, k, v, ng),), to_hf=lambda qkv: qkv_to_hf(qkv, nh, ng, hd)))
    if cfg.attention_bias:
        rows.append(Rule(tuple(p + f"self_attn.{x}_proj.bias" for x in "qkv"), (m + "self_attention.linear_qkv.bias",),
                         to_mf=lambda q, k, v: (qkv_to_mf(q[:, None], k[:, None], v[:, None], ng)[:, 0],),
                         to_hf=lambda b: tuple(w[:, 0] for w in qkv_to_hf(b[:, None], nh, ng, hd))))
    rows.append(Rule((), (m + "self_attention.core_attention.max_logits_val",), to_mf=None, to_hf=None))  # no HF twin
    return rows


def table(cfg: Any) -> list[Rule]:
    """Every tensor of ``Qwen3ForCausalLM``, HF ↔ reference: read one way by `hf_to_mf`, the other by `mf_to_hf`."""
    rows = ends_table(cfg.tie_word_embeddings, _ENDS)
    for i in range(cfg.num_hidden_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        rows += attention_table(p, m, cfg) + dense_mlp_table(p, m)
    return rows


def hf_to_mf(hf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """HF ``Qwen3ForCausalLM`` state dict → reference names; raises CheckpointError on any mismatch."""
    h, nh, ng, hd = _dims(cfg)
    out = apply_table(table(cfg), hf, "mf")
    expect_shape("decoder.layers.0.self_attention.linear_qkv.weight",
                 out["decoder.layers.0.self_attention.linear_qkv.weight"], ((nh + 2 * ng) * hd, h))
    return out


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference names → HF ``Qwen3ForCausalLM`` names (the inverse of ``hf_to_mf``)."""
    return apply_table(table(cfg), mf, "hf")
