"""HF `config.json` ↔ `model:` for DeepSeek-V4 and Qwen3-MoE (used by `config/hf.py`).

DeepSeek-V4's HF config describes the same model with other words (mindformers-2.1.md §5.2 last
column): per-layer ``layer_types`` + ``compress_rates`` for our ``compress_ratios``, ``mlp_layer_types``
for ``num_hash_layers``, ``partial_rotary_factor·head_dim`` for ``qk_rope_head_dim``, a nested
``rope_parameters`` for the YaRN keys, ``swiglu_limit``/``hc_mult``/``sliding_window`` for the reference's
names; the shared expert is always one of width ``moe_intermediate_size``. Export refuses what
transformers cannot express, import says what it dropped.
"""
from __future__ import annotations

from typing import Any

from mftk.config.model_base import NOTE, WARNING
from mftk.errors import Problem

V4_RATIO = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
V4_HANDLED = frozenset("""head_dim partial_rotary_factor layer_types compress_rates compress_ratios mlp_layer_types
num_hash_layers scoring_func hc_mult hc_sinkhorn_iters swiglu_limit sliding_window rope_parameters rope_scaling
num_key_value_heads router_aux_loss_coef output_router_logits router_jitter_noise mlp_bias qk_rope_head_dim
compress_rate_csa compress_rate_hca expert_dtype""".split())
QWEN3_MOE_HANDLED = frozenset("rope_parameters rope_scaling".split())
DEFAULT_MTP_LOSS_SCALING_FACTOR = 0.3  # the shipped DeepSeek-V4 YAMLs' mtp_loss_factor


def _note(notes: list[Problem], key: str, value: Any, message: str, severity: str = NOTE) -> None:
    notes.append(Problem(path=f"model.{key}", severity=severity, value=value, message=message))


def deepseek_v4_from_hf(cj: dict, notes: list[Problem]) -> dict:
    """The `model:` keys an HF ``DeepseekV4Config`` implies beyond the same-named ones."""
    out: dict[str, Any] = {"qk_layernorm": True, "apply_dsa_kernel_fusion": False, "moe_grouped_gemm": True}
    L = int(cj.get("num_hidden_layers", 43))
    d = int(cj.get("head_dim", 512))
    rope = int(cj.get("qk_rope_head_dim") or round(d * float(cj.get("partial_rotary_factor") or 64 / 512)))
    out.update(v_head_dim=d, qk_rope_head_dim=rope, qk_nope_head_dim=d - rope)
    rates = {**V4_RATIO, **(cj.get("compress_rates") or {})}
    if cj.get("compress_rate_hca"):
        rates["heavily_compressed_attention"] = cj["compress_rate_hca"]
    types = cj.get("layer_types")
    if types:
        ratios = [int(rates[t]) for t in types[:L]]
    elif cj.get("compress_ratios"):
        ratios = [int(r) for r in cj["compress_ratios"][:L]]
    else:  # transformers' default: two HCA layers, then CSA at odd offsets
        ratios = [128] * min(L, 2) + [4 if i % 2 else 128 for i in range(max(L - 2, 0))]
        _note(notes, "compress_ratios", ratios, "added: transformers' default layer_types (none in config.json)")
    mtp = int(cj.get("num_nextn_predict_layers", 1) or 0)
    out["compress_ratios"] = ratios + [0] * mtp
    if mtp:
        out["mtp_loss_scaling_factor"] = DEFAULT_MTP_LOSS_SCALING_FACTOR
        _note(notes, "mtp_loss_scaling_factor", DEFAULT_MTP_LOSS_SCALING_FACTOR,
              "added: required with MTP on (the shipped YAMLs' mtp_loss_factor); MTP layers are sliding-window")
    mlp = cj.get("mlp_layer_types")
    if mlp:
        n_hash = next((i for i, t in enumerate(mlp) if t != "hash_moe"), len(mlp))
        if any(t == "hash_moe" for t in mlp[n_hash:]):
            _note(notes, "num_hash_layers", mlp, "hash-routed layers after a learned one are not supported "
                  "(the reference's hash layers are the leading ones); read as the leading run", WARNING)
        out["num_hash_layers"] = n_hash
    elif cj.get("num_hash_layers") is not None:
        out["num_hash_layers"] = int(cj["num_hash_layers"])
    for src, dst in (("scoring_func", "moe_router_score_function"), ("hc_mult", "num_residual_streams"),
                     ("hc_sinkhorn_iters", "mhc_sinkhorn_iterations"), ("swiglu_limit", "activation_func_clamp_value"),
                     ("sliding_window", "csa_window_size")):
        if src in cj:
            out[dst] = cj[src]
    if cj.get("n_shared_experts", 1):
        out["moe_shared_expert_intermediate_size"] = cj.get("moe_intermediate_size", 2048)
    out.update(_v4_rope(cj, notes))
    for key in ("router_aux_loss_coef", "output_router_logits", "router_jitter_noise"):
        if key in cj:
            _note(notes, key, cj[key], "dropped: transformers' load-balancing loss differs from the reference's; "
                  "set moe_aux_loss_coeff / moe_router_load_balancing_type")
    _note(notes, "num_key_value_heads", cj.get("num_key_value_heads", 1), "dropped: one shared KV head (MQA) is implied")
    return out


def _v4_rope(cj: dict, notes: list[Problem]) -> dict:
    rp = cj.get("rope_parameters") or cj.get("rope_scaling") or {}
    comp = rp.get("compress", rp) if isinstance(rp, dict) else {}
    out: dict[str, Any] = {}
    kind = comp.get("rope_type", comp.get("type", "default"))
    out["position_embedding_type"] = "yarn" if kind == "yarn" else "rope"
    if kind == "yarn":
        for src, dst in (("factor", "rotary_scaling_factor"), ("original_max_position_embeddings",
                         "original_max_position_embeddings"), ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow")):
            if comp.get(src) is not None:
                out[dst] = comp[src]
    main = rp.get("main", {}) if isinstance(rp, dict) else {}
    if main.get("rope_theta") is not None:
        out["rope_theta"] = main["rope_theta"]
    if comp.get("rope_theta") is not None and "main" in rp:
        out["compress_rope_theta"] = comp["rope_theta"]
    return out


def deepseek_v4_to_hf(cfg: Any) -> dict:
    L = cfg.num_hidden_layers
    named = {0: "sliding_attention", 4: "compressed_sparse_attention"}
    types = [named.get(cfg.compress_ratio(i), "heavily_compressed_attention") for i in range(L)]
    hca = sorted({cfg.compress_ratio(i) for i in range(L)} - {0, 4}) or [128]
    rope = {"rope_type": "default"}
    if cfg.position_embedding_type == "yarn":
        rope = {"rope_type": "yarn", "factor": cfg.rotary_scaling_factor, "beta_fast": cfg.beta_fast,
                "beta_slow": cfg.beta_slow, "original_max_position_embeddings": cfg.original_max_position_embeddings}
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "moe_intermediate_size": cfg.moe_intermediate_size,
        "num_hidden_layers": L, "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": 1,
        "head_dim": cfg.v_head_dim, "q_lora_rank": cfg.q_lora_rank,
        "partial_rotary_factor": cfg.qk_rope_head_dim / cfg.v_head_dim, "num_experts_per_tok": cfg.num_experts_per_tok,
        "n_routed_experts": cfg.n_routed_experts, "n_shared_experts": 1, "scoring_func": cfg.moe_router_score_function,
        "norm_topk_prob": True, "routed_scaling_factor": cfg.routed_scaling_factor,
        "max_position_embeddings": cfg.max_position_embeddings, "rope_theta": cfg.rope_theta, "layer_types": types,
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": hca[0]},
        "compress_rope_theta": cfg.compress_rope_theta, "hc_mult": cfg.num_residual_streams,
        "hc_sinkhorn_iters": cfg.mhc_sinkhorn_iterations, "hc_eps": cfg.hc_eps,
        "mlp_layer_types": ["hash_moe" if h else "moe" for h in cfg.hash_layer_pattern()],
        "swiglu_limit": cfg.activation_func_clamp_value, "sliding_window": cfg.csa_window_size,
        "o_groups": cfg.o_groups, "o_lora_rank": cfg.o_lora_rank, "index_n_heads": cfg.index_n_heads,
        "index_head_dim": cfg.index_head_dim, "index_topk": cfg.index_topk,
        "num_nextn_predict_layers": cfg.mtp_num_layers(), "hidden_act": "silu",
        "initializer_range": cfg.initializer_range, "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings, "rope_parameters": rope, "attention_bias": False,
        "mlp_bias": False, "attention_dropout": cfg.attention_dropout,
    }


def deepseek_v4_export_problems(cfg: Any, err) -> None:
    """``err(key, value, message, hint="")`` for every engine setting transformers' DeepSeek-V4 cannot express."""
    L = cfg.num_hidden_layers
    if not cfg.norm_topk_prob:
        err("norm_topk_prob", False, "transformers' DeepSeek-V4 router always renormalises the top-k weights")
    fs = cfg.moe_shared_expert_intermediate_size_resolved()
    if fs != cfg.moe_intermediate_size:
        err("moe_shared_expert_intermediate_size", fs, f"transformers builds one shared expert of width "
            f"moe_intermediate_size = {cfg.moe_intermediate_size}; this model's is {fs or 'absent'}")
    if cfg.activation_func_clamp_value is None:
        err("activation_func_clamp_value", None, "transformers' DeepSeek-V4 always clamps the SwiGLU (swiglu_limit)")
    if len({cfg.compress_ratio(i) for i in range(L)} - {0, 4}) > 1:
        err("compress_ratios", cfg.compress_ratios, "transformers has one ratio for every heavily compressed layer")
    if cfg.csa_dense_mode:
        err("csa_dense_mode", True, "transformers' CSA layers always select through the indexer")
    if (cfg.n_group or 0) > 0:
        err("n_group", cfg.n_group, "transformers' DeepSeek-V4 router has no group-limited routing")
    if cfg.moe_router_score_function not in ("sqrtsoftplus", "sigmoid"):
        err("moe_router_score_function", cfg.moe_router_score_function, "transformers' router supports "
            "sqrtsoftplus and sigmoid scores")
    if any(cfg.compress_ratio(L + k) != 0 for k in range(cfg.mtp_num_layers())):
        err("compress_ratios", cfg.compress_ratios, "the exported MTP layer is read as a sliding-window layer")


def qwen3_moe_to_hf(cfg: Any) -> dict:
    return {"head_dim": cfg.kv_channels(), "max_position_embeddings": cfg.max_position_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta}, "rope_theta": cfg.rope_theta,
            "attention_bias": cfg.attention_bias, "tie_word_embeddings": cfg.tie_word_embeddings,
            "use_sliding_window": False, "sliding_window": None, "moe_intermediate_size": cfg.moe_intermediate_size,
            "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
            "norm_topk_prob": cfg.norm_topk_prob, "decoder_sparse_step": cfg.decoder_sparse_step,
            "mlp_only_layers": list(cfg.mlp_only_layers or []), "output_router_logits": False}


def qwen3_moe_export_problems(cfg: Any, err) -> None:
    if cfg.routed_scaling_factor != 1.0:
        err("routed_scaling_factor", cfg.routed_scaling_factor, "transformers' Qwen3-MoE router has no scaling factor")


def qwen3_moe_from_hf(cj: dict, notes: list[Problem]) -> dict:
    rp = cj.get("rope_parameters") or {}
    out: dict[str, Any] = {"moe_grouped_gemm": True}
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        out["rope_theta"] = rp["rope_theta"]
    if cj.get("output_router_logits"):
        _note(notes, "output_router_logits", True, "transformers' joint load-balancing loss is not implemented; "
              "set moe_aux_loss_coeff for the per-layer one", WARNING)
    return out
