"""Qwen3: HF ``transformers`` names ↔ reference (MindSpore Transformers PyNative) names, numpy only.

Layouts (models.md §3.3): ``linear_qkv`` is group-interleaved ``[q heads of group g | k_g | v_g]`` per
KV group; ``linear_fc1`` rows interleave gate and up. Everything else is a rename.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.engine.models.convert import Source, deinterleave_rows, expect_shape, interleave_rows

_RENAMES = (  # (HF suffix, MF suffix) of the attention half of a layer (Qwen3-MoE shares it)
    ("input_layernorm.weight", "input_layernorm.weight"),
    ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
    ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
    ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
    ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
)


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
    out["embedding.word_embeddings.weight"] = src.take("model.embed_tokens.weight")
    out["decoder.final_layernorm.weight"] = src.take("model.norm.weight")
    if cfg.tie_word_embeddings:
        src.skip("lm_head.weight")
    else:
        out["output_layer.weight"] = src.take("lm_head.weight")
    for i in range(cfg.num_hidden_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention_to_mf(src, p, m, cfg, out)
        out[m + "mlp.linear_fc2.weight"] = src.take(p + "mlp.down_proj.weight")
        g, u = src.take(p + "mlp.gate_proj.weight"), src.take(p + "mlp.up_proj.weight")
        if g is not None and u is not None:
            out[m + "mlp.linear_fc1.weight"] = interleave_rows(g, u)
    src.check()
    out = {k: v for k, v in out.items() if v is not None}
    expect_shape("decoder.layers.0.self_attention.linear_qkv.weight",
                 out["decoder.layers.0.self_attention.linear_qkv.weight"], ((nh + 2 * ng) * hd, h))
    return out


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference names → HF ``Qwen3ForCausalLM`` names (the inverse of ``hf_to_mf``)."""
    src, out = Source(mf, "mftk"), {}
    out["model.embed_tokens.weight"] = src.take("embedding.word_embeddings.weight")
    out["model.norm.weight"] = src.take("decoder.final_layernorm.weight")
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = src.take("output_layer.weight")
    for i in range(cfg.num_hidden_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention_to_hf(src, p, m, cfg, out)
        out[p + "mlp.down_proj.weight"] = src.take(m + "mlp.linear_fc2.weight")
        fc1 = src.take(m + "mlp.linear_fc1.weight")
        if fc1 is not None:
            out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = deinterleave_rows(fc1)
    src.check()
    return {k: v for k, v in out.items() if v is not None}
