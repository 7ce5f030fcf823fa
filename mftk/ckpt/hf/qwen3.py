"""Qwen3: HF ``transformers`` names ↔ reference (MindSpore Transformers PyNative) names, numpy only.

Layouts (models.md §3.3): ``linear_qkv`` is group-interleaved ``[q heads of group g | k_g | v_g]`` per
KV group; ``linear_fc1`` rows interleave gate and up. Everything else is a rename.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.ckpt.hf.convert import Source, ends_to_hf, ends_to_mf, dense_mlp_to_hf, dense_mlp_to_mf, expect_shape

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


def attention_to_mf(src: Source, p: str, m: str, cfg: Any, out: dict) -> None:
    """The norms and the GQA attention of HF layer prefix ``p`` into reference layer prefix ``m``."""
    ng = cfg.num_query_groups()
    for a, b in _RENAMES:
        out[m + b] = src.take(p + a)
    q, k, v = (src.take(p + f"self_attn.{x}_proj.weight") for x in "qkv")
    if q is not None and k is not None and v is not None:
        out[m + "self_attention.linear_qkv.weight"] = qkv_to_mf(q, k, v, ng)
    if cfg.attention_bias:
        qb, kb, vb = (src.take(p + f"self_attn.{x}_proj.bias") for x in "qkv")
        if qb is not None and kb is not None and vb is not None:
            out[m + "self_attention.linear_qkv.bias"] = qkv_to_mf(qb[:, None], kb[:, None], vb[:, None], ng)[:, 0]


def attention_to_hf(src: Source, p: str, m: str, cfg: Any, out: dict) -> None:
    """The inverse of `attention_to_mf`."""
    _, nh, ng, hd = _dims(cfg)
    for a, b in _RENAMES:
        out[p + a] = src.take(m + b)
    qkv = src.take(m + "self_attention.linear_qkv.weight")
    if qkv is not None:
        for x, w in zip("qkv", qkv_to_hf(qkv, nh, ng, hd)):
            out[p + f"self_attn.{x}_proj.weight"] = w
    if cfg.attention_bias:
        b = src.take(m + "self_attention.linear_qkv.bias")
        if b is not None:
            for x, w in zip("qkv", qkv_to_hf(b[:, None], nh, ng, hd)):
                out[p + f"self_attn.{x}_proj.bias"] = w[:, 0]
    src.skip(m + "self_attention.core_attention.max_logits_val")  # max-logit tracking: no HF counterpart


def hf_to_mf(hf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """HF ``Qwen3ForCausalLM`` state dict → reference names; raises CheckpointError on any mismatch."""
    src, out = Source(hf, "HF"), {}
    h, nh, ng, hd = _dims(cfg)
    ends_to_mf(src, out, cfg.tie_word_embeddings, _ENDS)
    for i in range(cfg.num_hidden_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention_to_mf(src, p, m, cfg, out)
        dense_mlp_to_mf(src, p, m, out)
    src.check()
    out = {k: v for k, v in out.items() if v is not None}
    expect_shape("decoder.layers.0.self_attention.linear_qkv.weight",
                 out["decoder.layers.0.self_attention.linear_qkv.weight"], ((nh + 2 * ng) * hd, h))
    return out


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference names → HF ``Qwen3ForCausalLM`` names (the inverse of ``hf_to_mf``)."""
    src, out = Source(mf, "mftk"), {}
    ends_to_hf(src, out, cfg.tie_word_embeddings, _ENDS)
    for i in range(cfg.num_hidden_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention_to_hf(src, p, m, cfg, out)
        dense_mlp_to_hf(src, p, m, out)
    src.check()
    return {k: v for k, v in out.items() if v is not None}
