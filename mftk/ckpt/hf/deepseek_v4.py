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

One table (`table`) holds every tensor; both directions read it.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from mftk.ckpt.hf.convert import Rule, apply_table, deinterleave_rows, ends_table, experts_rule, interleave_rows, rename
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


def _constant(name: str, value: float) -> Callable[[np.ndarray], tuple[()]]:
    """Export of a reference-only buffer that must still hold its constant (else the export would drop information)."""
    def check(a: np.ndarray) -> tuple[()]:
        if not np.all(a == value):
            raise CheckpointError(message=f"{name} is not all {value:g}: this tensor has no place in the HF layout",
                                  problems=[f"{name}: expected the frozen constant {value:g}"])
        return ()
    return check


def _frozen(m: str, shape: tuple[int, ...], value: float) -> Rule:
    """A reference-only buffer: filled with ``value`` on import, checked and dropped on export."""
    return Rule((), (m,), to_mf=lambda: (np.full(shape, value, np.float32),), to_hf=_constant(m, value))


def _split_scale(scale: np.ndarray) -> tuple[np.ndarray, ...]:
    flat = np.asarray(scale, np.float32).reshape(-1)
    return tuple(flat[k:k + 1].copy() for k in range(3))


def _layer_table(p: str, m: str, cfg: Any, layer_id: int, hashed: bool) -> list[Rule]:
    """One layer: native prefix ``p`` ↔ reference prefix ``m``."""
    rows = [rename(p + b, m + a) for a, b in _renames(cfg, layer_id, hashed)]
    n, h, e_n = cfg.num_residual_streams, cfg.hidden_size, cfg.n_routed_experts
    for hc in _HC:
        rows += [rename(p + f"hc_{hc}_fn", m + f"{hc}_hc.mapping_proj.weight"),
                 rename(p + f"hc_{hc}_base", m + f"{hc}_hc.mapping_proj.bias"),
                 Rule((p + f"hc_{hc}_scale",), tuple(m + f"{hc}_hc.{x}" for x in ("alpha_pre", "alpha_post", "alpha_res")),
                      to_mf=_split_scale,
                      to_hf=lambda *a: (np.concatenate([np.asarray(x, np.float32).reshape(-1) for x in a]),)),
                 _frozen(m + f"{hc}_hc.rms_weight", (n * h,), 1.0)]
    rows.append(_frozen(m + "self_attention.q_rms_gamma", (cfg.v_head_dim,), 1.0))
    if hashed:
        rows.append(Rule((p + "ffn.gate.tid2eid",), (m + "mlp.router.tid2eid",),
                         to_mf=lambda t: (np.asarray(t).astype(np.int32),),
                         to_hf=lambda t: (np.asarray(t).astype(np.int64),)))
    elif not cfg.moe_router_enable_expert_bias:  # transformers' router always has the buffer
        rows.append(Rule((p + "ffn.gate.bias",), (), to_mf=None, to_hf=lambda: (np.zeros((e_n,), np.float32),)))
    rows.append(experts_rule(lambda e, x: p + f"ffn.experts.{e}.{x}.weight", e_n, _EXPERT,
                             m + "mlp.experts.weight1", m + "mlp.experts.weight2"))
    if cfg.moe_shared_expert_intermediate_size_resolved():
        rows.append(Rule((p + "ffn.shared_experts.w1.weight", p + "ffn.shared_experts.w3.weight"),
                         (m + "mlp.shared_experts.linear_fc1.weight",),
                         to_mf=lambda g, u: (interleave_rows(g, u),), to_hf=deinterleave_rows))
    rows.append(Rule((), (m + "mlp.tokens_per_expert",), to_mf=lambda: (np.zeros((e_n,), np.float32),), to_hf=None))
    return rows


_HEAD = (("hc_fn.weight", "hc_head_fn"), ("hc_base", "hc_head_base"), ("hc_scale", "hc_head_scale"))  # (reference, published) names of the hc head


def _head_table(p: str, m: str) -> list[Rule]:
    return [rename(p + b, m + a) for a, b in _HEAD]


def table(cfg: Any) -> list[Rule]:
    """Every published DeepSeek-V4 tensor (native names, MTP as ``mtp.{k}.*``) ↔ reference names: both
    directions read it."""
    L, hashed, hd = cfg.num_hidden_layers, cfg.hash_layer_pattern(), cfg.hidden_size
    rows = ends_table(cfg.tie_word_embeddings, _ENDS) + _head_table("", "decoder.hc_head.")
    for i in range(L):
        rows += _layer_table(f"layers.{i}.", f"decoder.layers.{i}.", cfg, i, hashed[i])
    for k in range(cfg.mtp_num_layers()):
        p, m = f"mtp.{k}.", f"mtp.layers.{k}."
        rows += [rename(p + b, m + a) for a, b in (("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"),
                                                   ("final_layernorm.weight", "norm.weight"))]
        rows.append(Rule((p + "e_proj.weight", p + "h_proj.weight"), (m + "eh_proj.weight",),
                         to_mf=lambda e, h: (np.concatenate([e, h], 1),),
                         to_hf=lambda eh: (eh[:, :hd].copy(), eh[:, hd:].copy())))
        rows += _head_table(p, m + "hc_head.") + _layer_table(p, m + "transformer_layer.", cfg, L + k, False)
    return rows


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
    # MTP layers the config turns off
    return apply_table(table(cfg), hf, "mf", ignore_prefixes=() if cfg.mtp_num_layers() else ("mtp.",))


def mf_to_hf(mf: Mapping[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """Reference names → the published DeepSeek-V4 layout (the inverse of ``hf_to_mf``)."""
    _published_layout(cfg)
    return apply_table(table(cfg), mf, "hf")
