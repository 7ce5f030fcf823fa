"""DeepSeek-V4: published checkpoint names ↔ reference (MindSpore Transformers PyNative) names, numpy only.

The HF side is the layout DeepSeek publishes (``embed.weight``, ``layers.{i}.attn.wq_a.weight``,
``layers.{i}.ffn.experts.{e}.w1.weight``, ``mtp.0.*``; mindformers-2.1.md §5.8 "Native"), which is
what a model directory on the hub holds and what ``transformers`` renames on load (its
``deepseek_v4`` conversion table; it ignores ``mtp.*``). Reference layouts:

- ``experts.weight1 [E, H, 2F]`` = ``[w1ᵀ | w3ᵀ]``, ``weight2 [E, F, H]`` = ``w2ᵀ``; shared ``linear_fc1``
  row-interleaves w1/w3;
- ``hc_{attn,ffn}_scale [3]`` = ``alpha_pre``, ``alpha_post``, ``alpha_res``; ``hc_*_fn``/``_base`` =
  ``mapping_proj.weight``/``.bias``;
- ``mtp.0.e_proj | h_proj`` (dim 1) = ``eh_proj``;
- ``tid2eid`` int64 ↔ int32; reference-only buffers (``rms_weight``, ``q_rms_gamma``: frozen ones;
  ``tokens_per_expert``: zeros) are filled on import and must hold those values on export.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.ckpt.hf.convert import Source, ends_to_hf, ends_to_mf, deinterleave_rows, interleave_rows, stack_experts, unstack_experts
from mftk.errors import CheckpointError

_ATTN = (("linear_q_down_proj.weight", "wq_a.weight"), ("q_layernorm.weight", "q_norm.weight"),
         ("linear_q_up_proj.weight", "wq_b.weight"), ("linear_kv_proj.weight", "wkv.weight"),
         ("kv_layernorm.weight", "kv_norm.weight"), ("linear_o_group_proj", "wo_a.weight"),
         ("linear_proj.weight", "wo_b.weight"), ("core_attention.attn_sink", "attn_sink"))
_COMPRESSOR = (("linear_wkv.weight", "wkv.weight"), ("linear_wgate.weight", "wgate.weight"), ("ape", "ape"),
               ("norm.weight", "norm.weight"))
_INDEXER = (("linear_wq_b.weight", "wq_b.weight"), ("linear_weights_proj.weight", "weights_proj.weight"))
_HC = ("attn", "ffn")
_EXPERT = ("w1", "w3", "w2")  # gate, up, down

_ENDS = ("embed.weight", "norm.weight", "head.weight")  # HF embedding, final norm, output layer


def _renames(cfg: Any, layer_id: int, hashed: bool) -> list[tuple[str, str]]:
    """(reference suffix, native suffix) of one layer's plain tensors."""
    r = cfg.compress_ratio(layer_id)
    out = [("input_layernorm.weight", "attn_norm.weight"), ("pre_mlp_layernorm.weight", "ffn_norm.weight"),
           ("mlp.router.weight", "ffn.gate.weight")]
    out += [(f"self_attention.{a}", f"attn.{b}") for a, b in _ATTN]
    if r > 0:
        out += [(f"self_attention.core_attention.compressor.{a}", f"attn.compressor.{b}") for a, b in _COMPRESSOR]
    if r == 4 and not cfg.csa_dense_mode:
        out += [(f"self_attention.core_attention.indexer.{a}", f"attn.indexer.{b}") for a, b in _INDEXER]
        out += [(f"self_attention.core_attention.indexer.compressor.{a}", f"attn.indexer.compressor.{b}")
                for a, b in _COMPRESSOR]
    if cfg.moe_shared_expert_intermediate_size_resolved():
        out.append(("mlp.shared_experts.linear_fc2.weight", "ffn.shared_experts.w2.weight"))
    if not hashed and cfg.moe_router_enable_expert_bias:
        out.append(("mlp.expert_bias", "ffn.gate.bias"))
    return out


def _layer_to_mf(src: Source, p: str, m: str, cfg: Any, layer_id: int, hashed: bool, out: dict) -> None:
    for a, b in _renames(cfg, layer_id, hashed):
        out[m + a] = src.take(p + b)
    n, h = cfg.num_residual_streams, cfg.hidden_size
    for hc in _HC:
        out[m + f"{hc}_hc.mapping_proj.weight"] = src.take(p + f"hc_{hc}_fn")
        out[m + f"{hc}_hc.mapping_proj.bias"] = src.take(p + f"hc_{hc}_base")
        scale = src.take(p + f"hc_{hc}_scale")
        if scale is not None:
            for k, name in enumerate(("alpha_pre", "alpha_post", "alpha_res")):
                out[m + f"{hc}_hc.{name}"] = np.asarray(scale, np.float32).reshape(-1)[k:k + 1].copy()
        out[m + f"{hc}_hc.rms_weight"] = np.ones((n * h,), np.float32)
    out[m + "self_attention.q_rms_gamma"] = np.ones((cfg.v_head_dim,), np.float32)
    if hashed:
        t = src.take(p + "ffn.gate.tid2eid")
        if t is not None:
            out[m + "mlp.router.tid2eid"] = np.asarray(t).astype(np.int32)
    elif not cfg.moe_router_enable_expert_bias:
        src.skip(p + "ffn.gate.bias")
    w = stack_experts(src, lambda e, x: p + f"ffn.experts.{e}.{x}.weight", cfg.n_routed_experts, _EXPERT)
    if w is not None:
        out[m + "mlp.experts.weight1"], out[m + "mlp.experts.weight2"] = w
    if cfg.moe_shared_expert_intermediate_size_resolved():
        g, u = src.take(p + "ffn.shared_experts.w1.weight"), src.take(p + "ffn.shared_experts.w3.weight")
        if g is not None and u is not None:
            out[m + "mlp.shared_experts.linear_fc1.weight"] = interleave_rows(g, u)
    out[m + "mlp.tokens_per_expert"] = np.zeros((cfg.n_routed_experts,), np.float32)


_HEAD = (("hc_fn.weight", "hc_head_fn"), ("hc_base", "hc_head_base"), ("hc_scale", "hc_head_scale"))  # (reference, published) names of the hc head


def _head_to_mf(src: Source, p: str, m: str, out: dict) -> None:
    for a, b in _HEAD:
        out[m + a] = src.take(p + b)


def _published_layout(cfg: Any) -> None:
    """The published layout holds the dsv4_hybrid attention; the legacy ``mla`` variant (plain MLA) has none."""
    if getattr(cfg, "experimental_attention_variant", "dsv4_hybrid") == "mla":
        raise CheckpointError(message="DeepSeek-V4 with experimental_attention_variant: mla has no published "
                              "checkpoint layout (DeepSeek's V4 checkpoints hold the dsv4_hybrid attention), so "
                              "it is not converted to or from Hugging Face",
                              hint="keep mftk's own checkpoints for it, or use experimental_attention_variant: "
                              "dsv4_hybrid")


def hf_to_mf(hf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Published DeepSeek-V4 tensors (native names, MTP as ``mtp.{k}.*``) → reference names."""
    _published_layout(cfg)
    src, out = Source(hf, "HF"), {}
    L, hashed = cfg.num_hidden_layers, cfg.hash_layer_pattern()
    ends_to_mf(src, out, cfg.tie_word_embeddings, _ENDS)
    _head_to_mf(src, "", "decoder.hc_head.", out)
    for i in range(L):
        _layer_to_mf(src, f"layers.{i}.", f"decoder.layers.{i}.", cfg, i, hashed[i], out)
    for k in range(cfg.mtp_num_layers()):
        p, m = f"mtp.{k}.", f"mtp.layers.{k}."
        for a, b in (("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"),
                     ("final_layernorm.weight", "norm.weight")):
            out[m + a] = src.take(p + b)
        e, h = src.take(p + "e_proj.weight"), src.take(p + "h_proj.weight")
        if e is not None and h is not None:
            out[m + "eh_proj.weight"] = np.concatenate([e, h], 1)
        _head_to_mf(src, p, m + "hc_head.", out)
        _layer_to_mf(src, p, m + "transformer_layer.", cfg, L + k, False, out)
    src.check(ignore_prefixes=() if cfg.mtp_num_layers() else ("mtp.",))  # MTP layers the config turns off
    return {k: v for k, v in out.items() if v is not None}


def _constant(src: Source, name: str, value: float) -> None:
    """A reference-only buffer that must still hold its constant (else the export would drop information)."""
    a = src.take(name)
    if a is not None and not np.all(a == value):
        raise CheckpointError(message=f"{name} is not all {value:g}: this tensor has no place in the HF layout",
                              problems=[f"{name}: expected the frozen constant {value:g}"])


def _layer_to_hf(src: Source, p: str, m: str, cfg: Any, layer_id: int, hashed: bool, out: dict) -> None:
    for a, b in _renames(cfg, layer_id, hashed):
        out[p + b] = src.take(m + a)
    for hc in _HC:
        out[p + f"hc_{hc}_fn"] = src.take(m + f"{hc}_hc.mapping_proj.weight")
        out[p + f"hc_{hc}_base"] = src.take(m + f"{hc}_hc.mapping_proj.bias")
        alphas = [src.take(m + f"{hc}_hc.{n}") for n in ("alpha_pre", "alpha_post", "alpha_res")]
        if all(a is not None for a in alphas):
            out[p + f"hc_{hc}_scale"] = np.concatenate([np.asarray(a, np.float32).reshape(-1) for a in alphas])
        _constant(src, m + f"{hc}_hc.rms_weight", 1.0)
    _constant(src, m + "self_attention.q_rms_gamma", 1.0)
    if hashed:
        t = src.take(m + "mlp.router.tid2eid")
        if t is not None:
            out[p + "ffn.gate.tid2eid"] = np.asarray(t).astype(np.int64)
    elif not cfg.moe_router_enable_expert_bias:  # transformers' router always has the buffer
        out[p + "ffn.gate.bias"] = np.zeros((cfg.n_routed_experts,), np.float32)
    w1, w2 = src.take(m + "mlp.experts.weight1"), src.take(m + "mlp.experts.weight2")
    if w1 is not None and w2 is not None:
        unstack_experts(w1, w2, lambda e, x: p + f"ffn.experts.{e}.{x}.weight", _EXPERT, out)
    if cfg.moe_shared_expert_intermediate_size_resolved():
        fc1 = src.take(m + "mlp.shared_experts.linear_fc1.weight")
        if fc1 is not None:
            out[p + "ffn.shared_experts.w1.weight"], out[p + "ffn.shared_experts.w3.weight"] = deinterleave_rows(fc1)
    src.skip(m + "mlp.tokens_per_expert")


def _head_to_hf(src: Source, p: str, m: str, out: dict) -> None:
    for a, b in _HEAD:
        out[p + b] = src.take(m + a)


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference names → the published DeepSeek-V4 layout (the inverse of ``hf_to_mf``)."""
    _published_layout(cfg)
    src, out = Source(mf, "mftk"), {}
    L, hashed = cfg.num_hidden_layers, cfg.hash_layer_pattern()
    ends_to_hf(src, out, cfg.tie_word_embeddings, _ENDS)
    _head_to_hf(src, "", "decoder.hc_head.", out)
    for i in range(L):
        _layer_to_hf(src, f"layers.{i}.", f"decoder.layers.{i}.", cfg, i, hashed[i], out)
    for k in range(cfg.mtp_num_layers()):
        p, m = f"mtp.{k}.", f"mtp.layers.{k}."
        for a, b in (("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"),
                     ("final_layernorm.weight", "norm.weight")):
            out[p + b] = src.take(m + a)
        eh = src.take(m + "eh_proj.weight")
        if eh is not None:
            out[p + "e_proj.weight"], out[p + "h_proj.weight"] = eh[:, :cfg.hidden_size].copy(), eh[:, cfg.hidden_size:].copy()
        _head_to_hf(src, p, m + "hc_head.", out)
        _layer_to_hf(src, p, m + "transformer_layer.", cfg, L + k, False, out)
    src.check()
    return {k: v for k, v in out.items() if v is not None}
