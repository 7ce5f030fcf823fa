"""Hugging Face `config.json` ↔ our `model:` section, every family: the one module of HF config import and export.

Users start from published models. The HF keys are already our field names (models.md §1.3/§1.4),
so most values pass through; what changes is what HF leaves implicit and the reference needs
spelled out (models.md §1.2): DeepSeek-V3 needs `moe_grouped_gemm`, `qk_layernorm`, an MTP loss
weight and a valid aux-loss type; both families want `hidden_dropout: 0.0` (HF models train
without it, and Qwen3's reference default is 0.1). Keys that only matter to HF (`torch_dtype`,
`auto_map`, FP8 `quantization_config`, ...) are dropped, each reported as a note, never silently.

DeepSeek-V4's HF config describes the same model with other words (mindformers-2.1.md §5.2 last
column): per-layer ``layer_types`` + ``compress_rates`` for our ``compress_ratios``, ``mlp_layer_types``
for ``num_hash_layers``, ``partial_rotary_factor·head_dim`` for ``qk_rope_head_dim``, a nested
``rope_parameters`` for the YaRN keys, ``swiglu_limit``/``hc_mult``/``sliding_window`` for the reference's
names; the shared expert is always one of width ``moe_intermediate_size``. Export refuses what
transformers cannot express, import says what it dropped.
"""
import json
import math
from pathlib import Path
from typing import Any

import attrs
import yaml

from mftk.config.families import family_of
from mftk.config.model import (ALIASES, DELETED, NOTE, WARNING, DeepseekV3ModelConfig, DeepseekV4ModelConfig,
                               Qwen3ModelConfig, Qwen3MoeModelConfig, TransformerFields, model_configs,
                               normalize_model_dict)
from mftk.errors import ConfigError, DataFormatError, InputError, Problem
from mftk.files import CONFIG_LIMIT, MAX_JSON_DEPTH, json_depth, read_text

# HF-only keys with no place in the model section (beyond the reference's own deleted keys).
_HF_ONLY = {
    "quantization_config": "FP8 block quantisation of the published weights; dequantise them before import",
    "pretraining_tp": "HF tensor-parallel hint; parallelism comes from the `parallelism:` section",
    "topk_method": "always noaux_tc-style group top-k in PyNative",
    "aux_loss_alpha": "read as moe_aux_loss_coeff",
    "seq_aux": "read as moe_router_load_balancing_type",
    "scoring_func": "read as moe_router_score_function",
    "rope_interleave": "DeepSeek's interleaved rope-dim layout; mftk always uses it",
}

DEFAULT_MTP_LOSS_SCALING_FACTOR = 0.3  # DeepSeek-V3 paper, first 10T tokens; pynative_ds3.yaml uses it too


def hf_to_model_section(config_json: dict, *, seq_length: int | None = None) -> tuple[dict, list[Problem]]:
    """Translate an HF `config.json` dict; return the `model:` mapping and what was dropped or added."""
    if not isinstance(config_json, dict):
        raise ConfigError(message="config.json must hold a JSON object", problems=[])
    mt = config_json.get("model_type")
    configs = model_configs()
    cls = configs.get(mt) if isinstance(mt, str) else None
    if cls is None:
        raise ConfigError(
            message=f"unsupported HF model_type {mt!r}",
            hint=f"supported: {', '.join(configs)}",
            problems=[Problem(path="model_type", value=mt, message=f"{mt!r:.60} is not a model_type mftk trains",
                              hint=f"one of {', '.join(configs)}")])
    notes: list[Problem] = []
    fields = attrs.fields_dict(cls)
    raw: dict[str, Any] = {}
    handled = _FAMILY_HANDLED.get(cls, frozenset())
    for key, value in config_json.items():
        if key == "architectures" and isinstance(value, list):
            value = value[0] if value else fields["architectures"].default
        if key in handled:
            continue  # translated by the family's extras below
        if key in fields or key in ALIASES[cls]:  # an alias (num_local_experts) is rewritten by normalize_model_dict
            raw[key] = value
        elif key in DELETED[cls] or key in _HF_ONLY:
            why = _HF_ONLY.get(key) or "only meaningful to HF / deleted by the reference"
            notes.append(Problem(path=f"model.{key}", severity=NOTE, value=value, message=f"dropped: {why}"))
        else:
            notes.append(Problem(path=f"model.{key}", severity=WARNING, value=value,
                                 message="HF key with no mftk equivalent; dropped"))
    if cls is DeepseekV3ModelConfig:
        raw.update(_deepseek_extras(config_json, notes))
    elif cls is DeepseekV4ModelConfig:
        raw.update(deepseek_v4_from_hf(config_json, notes))
    elif cls is Qwen3MoeModelConfig:
        raw.update(qwen3_moe_from_hf(config_json, notes))
    raw["hidden_dropout"] = 0.0
    raw["seq_length"] = seq_length if seq_length is not None else fields["seq_length"].default
    raw.setdefault("architectures", fields["architectures"].default)
    section, problems = normalize_model_dict(raw)
    problems += _section_problems(section)
    if any(p.severity == "error" for p in problems):  # never print a model: section that would not validate
        raise ConfigError(message="the HF config.json does not give a valid model: section",
                          problems=notes + [p for p in problems if p.severity != NOTE],
                          hint="check the config.json's values (types, finiteness)")
    return _ordered(section, cls), notes + [p for p in problems if p.severity != NOTE]


def _section_problems(section: dict) -> list[Problem]:
    """What structuring the section into its typed class, and the number checks, find."""
    from mftk.config.load import build_model_section
    from mftk.config.numbers import model_number_problems

    model, problems = build_model_section(dict(section))
    return problems + (model_number_problems(model) if model is not None else [])


def model_section_from_hf(config_json: dict, *, seq_length: int | None = None) -> dict:
    """The YAML-ready `model:` section for an HF Qwen3 / DeepSeek-V3 `config.json` dict."""
    return hf_to_model_section(config_json, seq_length=seq_length)[0]


def _deepseek_extras(cj: dict, notes: list[Problem]) -> dict:
    """Keys the reference needs set for the published DeepSeek-V3 architecture (models.md §1.2)."""
    extra: dict[str, Any] = {"moe_grouped_gemm": True, "qk_layernorm": True}
    if cj.get("num_nextn_predict_layers", 1):
        extra["mtp_loss_scaling_factor"] = DEFAULT_MTP_LOSS_SCALING_FACTOR
        notes.append(Problem(path="model.mtp_loss_scaling_factor", severity=NOTE,
                             value=DEFAULT_MTP_LOSS_SCALING_FACTOR,
                             message="added: required with MTP on (DeepSeek-V3's λ for the first 10T tokens)"))
    alpha = cj.get("aux_loss_alpha")
    if isinstance(alpha, (int, float)) and alpha > 0:
        extra["moe_aux_loss_coeff"] = float(alpha)
        extra["moe_router_load_balancing_type"] = "seq_aux_loss" if cj.get("seq_aux", True) else "aux_loss"
    if "scoring_func" in cj:
        extra["moe_router_score_function"] = cj["scoring_func"]
    if isinstance(cj.get("rope_scaling"), dict):
        # Keep HF's dict: it makes max_position_embeddings = original_max_position_embeddings (4096),
        # which is what HF-exact YaRN needs (models.md §1.7).
        extra["rope_scaling"] = dict(cj["rope_scaling"])
        extra["position_embedding_type"] = cj["rope_scaling"].get("type", cj["rope_scaling"].get("rope_type", "yarn"))
    return extra


def _ordered(section: dict, cls: type) -> dict:
    """model_type and architectures first, then the class's field order (a readable YAML)."""
    base = [a.name for a in attrs.fields(TransformerFields)]
    order = ["model_type", "architectures", "seq_length"] + [a.name for a in attrs.fields(cls) if a.name not in base] + base
    return {k: section[k] for k in sorted(section, key=lambda k: order.index(k) if k in order else len(order))}


def read_hf_config(path: str | Path) -> dict:
    """Read an HF `config.json` (or the directory holding one) as a dict, with clear errors."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    hint = "pass the config.json of a Hugging Face model directory"
    try:
        text = read_text(p, limit=CONFIG_LIMIT, what="config.json", hint=hint)
    except FileNotFoundError:
        raise InputError(message=f"{p}: no such file", path=str(p), hint=hint) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(message=f"{p}: not valid JSON ({exc.msg})", path=str(p), line=exc.lineno,
                              offset=exc.pos, expected="a JSON object", found=text[exc.pos:exc.pos + 20]) from exc
    except RecursionError:
        data = None
    if data is None or json_depth(data) > MAX_JSON_DEPTH:
        raise DataFormatError(message=f"{p}: JSON nested more than {MAX_JSON_DEPTH} levels deep", path=str(p),
                              expected="a Hugging Face config.json", found="deeply nested JSON", hint=hint)
    if not isinstance(data, dict):
        raise DataFormatError(message=f"{p}: expected a JSON object", path=str(p), expected="a JSON object",
                              found=type(data).__name__)
    return data


def model_section_yaml(section: dict) -> str:
    """`model:` plus the section as block YAML (key order kept; floats always carry a dot/exponent)."""
    return yaml.safe_dump({"model": section}, sort_keys=False, default_flow_style=False, allow_unicode=True)


# ---------------------------------------------------------------------------------------------
# The inverse: our model section → HF config.json (for `inspect-ckpt --export-hf`)
# ---------------------------------------------------------------------------------------------

HF_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
             "float16": "float16", "fp16": "float16"}


def hf_config_from_model_section(cfg: Any, *, dtype: str = "float32") -> dict:
    """The HF `config.json` dict describing what mftk's engine computes for ``cfg``.

    ``cfg`` is a model config object (or a raw `model:` mapping). Settings the engine honours but
    `transformers` cannot express (a softmax router, a MLA softmax scale HF would compute
    differently, ...) raise one ConfigError listing each; an export that loads but computes
    something else would be silent data loss. Settings the engine ignores are left out; see
    :func:`hf_export_notes`.
    """
    cfg = _as_config(cfg)
    if problems := [p for p in hf_export_problems(cfg) if p.severity == "error"]:
        raise ConfigError(message=f"this {cfg.model_type} model cannot be expressed as a transformers config "
                                  f"({len(problems)} problem(s))", problems=problems)
    out: dict[str, Any] = {"architectures": [_HF_ARCH[type(cfg)]], "model_type": _hf_model_type(cfg)}
    if isinstance(cfg, DeepseekV4ModelConfig):
        out.update(deepseek_v4_to_hf(cfg))
    elif isinstance(cfg, Qwen3MoeModelConfig):
        out.update({**_common_keys(cfg), **qwen3_moe_to_hf(cfg)})
    else:
        out.update(_qwen3_keys(cfg) if isinstance(cfg, Qwen3ModelConfig) else _dsv3_keys(cfg))
    pad = None if cfg.pad_token_id < 0 else cfg.pad_token_id  # −1: no padding id (transformers wants None)
    out.update({"pad_token_id": pad, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
                "torch_dtype": HF_DTYPES.get(dtype, dtype), "use_cache": True})
    return out


def hf_export_problems(cfg: Any) -> list[Problem]:
    """Errors: engine behaviour HF cannot reproduce. Warnings: settings the engine ignores (left out)."""
    cfg = _as_config(cfg)
    ps: list[Problem] = []

    def err(key: str, value: Any, message: str, hint: str = "") -> None:
        ps.append(Problem(path=f"model.{key}", value=value, message=message, hint=hint))

    def ignored(key: str, value: Any, default: Any) -> None:
        if value != default:
            ps.append(Problem(path=f"model.{key}", value=value, severity=WARNING,
                              message="mftk's engine does not use this setting; the export describes what it computed"))

    if not cfg.gated_linear_unit:
        err("gated_linear_unit", False, "transformers' MLPs of these models are gated (gate_proj and up_proj)",
            "export models trained with gated_linear_unit: true")
    ignored("add_bias_linear", cfg.add_bias_linear, False)
    ignored("apply_residual_connection_post_layernorm", cfg.apply_residual_connection_post_layernorm, False)
    if isinstance(cfg, (Qwen3ModelConfig, Qwen3MoeModelConfig)):
        ignored("rope_scaling", cfg.rope_scaling, None)
        ignored("rotary_interleaved", cfg.rotary_interleaved, False)
        ignored("position_embedding_type", cfg.position_embedding_type, "rope")
        if isinstance(cfg, Qwen3MoeModelConfig):
            qwen3_moe_export_problems(cfg, err)
        return ps
    if isinstance(cfg, DeepseekV4ModelConfig):
        deepseek_v4_export_problems(cfg, err)
        return ps
    ignored("tie_word_embeddings", cfg.tie_word_embeddings, False)
    if cfg.moe_router_score_function != "sigmoid":
        err("moe_router_score_function", cfg.moe_router_score_function,
            "transformers' DeepseekV3 router is sigmoid-only", "export models trained with sigmoid routing")
    if cfg.use_shared_expert_gating:
        err("use_shared_expert_gating", True, "transformers' DeepseekV3 has no shared-expert gate")
    if cfg.activation_func_clamp_value is not None:
        err("activation_func_clamp_value", cfg.activation_func_clamp_value, "transformers' experts do not clamp")
    if cfg.attention_bias:
        err("attention_bias", True, "the DeepSeek-V3 name mapping carries no MLA biases")
    if not cfg.qk_layernorm:
        err("qk_layernorm", False, "transformers' DeepseekV3 always applies the latent q/kv RMSNorms",
            "export models trained with qk_layernorm: true")
    if not cfg.multi_latent_attention:
        err("multi_latent_attention", False, "transformers' DeepseekV3 is MLA only")
    if cfg.rotary_percent != 1.0:
        err("rotary_percent", cfg.rotary_percent, "transformers' DeepseekV3 rotates every rope dim")
    fs = cfg.moe_shared_expert_intermediate_size_resolved()
    if cfg.n_shared_experts <= 0 or fs != cfg.moe_intermediate_size * cfg.n_shared_experts:
        err("moe_shared_expert_intermediate_size", cfg.moe_shared_expert_intermediate_size,
            f"transformers' shared-expert width is moe_intermediate_size × n_shared_experts "
            f"= {cfg.moe_intermediate_size} × {cfg.n_shared_experts}; this model has {fs}")
    L, pattern = cfg.num_hidden_layers, cfg.moe_layer_pattern()
    k = next((i for i, moe in enumerate(pattern) if moe), L)
    if pattern != [False] * k + [True] * (L - k):
        err("moe_layer_freq", cfg.moe_layer_freq, f"transformers' DeepseekV3 makes every layer from "
            f"first_k_dense_replace on MoE; this model's pattern is {[int(x) for x in pattern]}")
    if (cfg.num_nextn_predict_layers or 0) > 1:
        err("num_nextn_predict_layers", cfg.num_nextn_predict_layers, "DeepSeek-V3's HF layout holds one MTP layer")
    ours, theirs = cfg.mla_softmax_scale(), _hf_mla_scale(cfg)
    if not math.isclose(ours, theirs, rel_tol=1e-12):
        rp = cfg.rope_params()
        err("mscale", rp.mscale, f"MLA softmax scale: mftk uses g(factor={rp.factor:g}, mscale={rp.mscale:g})² / "
            f"√{cfg.q_head_dim()} = {ours:.6g} (with {rp.position_embedding_type} RoPE); transformers would use "
            f"{theirs:.6g} (g(factor, mscale_all_dim)² with YaRN, 1 otherwise)",
            "with plain RoPE set rotary_scaling_factor: 1.0; with YaRN set mscale equal to mscale_all_dim")
    return ps


def hf_export_notes(cfg: Any) -> list[Problem]:
    """The warnings of :func:`hf_export_problems` (settings the export leaves out)."""
    return [p for p in hf_export_problems(cfg) if p.severity != "error"]


_HF_ARCH = {Qwen3ModelConfig: "Qwen3ForCausalLM", DeepseekV3ModelConfig: "DeepseekV3ForCausalLM",
            DeepseekV4ModelConfig: "DeepseekV4ForCausalLM", Qwen3MoeModelConfig: "Qwen3MoeForCausalLM"}


def _as_config(cfg: Any) -> Any:
    if isinstance(cfg, tuple(_HF_ARCH)):
        return cfg
    from mftk.config.load import build_model_section

    built, problems = build_model_section(cfg)
    if built is None or any(p.severity == "error" for p in problems):
        raise ConfigError(message="the model section does not load", problems=problems)
    return built


def _hf_model_type(cfg: Any) -> str:
    return family_of(cfg).hf_model_type  # deepseek_mtp exports as deepseek_v3 (not an HF type)


def _hf_act(cfg: Any) -> str:
    """transformers' ``hidden_act``: its ``gelu`` is the exact erf GELU, the reference's ``gelu`` too."""
    return "gelu" if cfg.hidden_act == "gelu" else "silu"


def _common_keys(cfg: Any) -> dict:
    return {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_query_groups(), "hidden_act": _hf_act(cfg),
            "initializer_range": cfg.initializer_range, "rms_norm_eps": cfg.rms_norm_eps,
            "attention_dropout": cfg.attention_dropout}


def _qwen3_keys(cfg: Qwen3ModelConfig) -> dict:
    """Plain RoPE always: mftk's Qwen3 ignores rope_scaling, so the export must too."""
    return {**_common_keys(cfg), "head_dim": cfg.kv_channels(), "max_position_embeddings": cfg.max_position_embeddings,
            "rope_theta": cfg.rope_theta, "rope_scaling": None, "attention_bias": cfg.attention_bias,
            "tie_word_embeddings": cfg.tie_word_embeddings, "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": cfg.num_hidden_layers}


def _dsv3_keys(cfg: DeepseekV3ModelConfig) -> dict:
    rp = cfg.rope_params()
    max_pos, rope_scaling = cfg.max_position_embeddings, None
    if rp.position_embedding_type == "yarn":
        rope_scaling = {"type": "yarn", "factor": rp.factor,
                        "original_max_position_embeddings": rp.original_max_position_embeddings,
                        "beta_fast": rp.beta_fast, "beta_slow": rp.beta_slow, "mscale": rp.mscale,
                        "mscale_all_dim": rp.mscale_all_dim}
        if not cfg.rope_scaling:  # flat keys: max_position_embeddings was the original length; HF wants the extended one
            max_pos = int(rp.original_max_position_embeddings * rp.factor)
    return {
        **_common_keys(cfg), "moe_intermediate_size": cfg.moe_intermediate_size,
        "n_shared_experts": cfg.n_shared_experts, "n_routed_experts": cfg.n_routed_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok, "routed_scaling_factor": cfg.routed_scaling_factor,
        "n_group": cfg.n_group or 1, "topk_group": cfg.topk_group or 1, "norm_topk_prob": cfg.norm_topk_prob,
        "first_k_dense_replace": next((i for i, m in enumerate(cfg.moe_layer_pattern()) if m), cfg.num_hidden_layers),
        "moe_layer_freq": 1, "q_lora_rank": cfg.q_lora_rank, "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim, "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim, "num_nextn_predict_layers": cfg.num_nextn_predict_layers or 0,
        "max_position_embeddings": max_pos, "rope_theta": cfg.rope_theta, "rope_scaling": rope_scaling,
        "rope_interleave": True, "attention_bias": False, "tie_word_embeddings": False,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "aux_loss_alpha": cfg.moe_aux_loss_coeff,
        "seq_aux": cfg.moe_router_load_balancing_type == "seq_aux_loss",
    }


def _hf_mla_scale(cfg: DeepseekV3ModelConfig) -> float:
    """transformers' DeepseekV3Attention scale: qk_head_dim^-0.5 · g(factor, mscale_all_dim)² under YaRN."""
    rp = cfg.rope_params()
    scale = cfg.q_head_dim() ** -0.5
    if rp.position_embedding_type == "yarn" and rp.mscale_all_dim:
        g = 1.0 if rp.factor <= 1 else 0.1 * rp.mscale_all_dim * math.log(rp.factor) + 1.0
        scale *= g * g
    return scale


# ------------------------------------------------------------------ DeepSeek-V4 and Qwen3-MoE

V4_RATIO = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
V4_HANDLED = frozenset("""head_dim partial_rotary_factor layer_types compress_rates compress_ratios mlp_layer_types
num_hash_layers scoring_func hc_mult hc_sinkhorn_iters swiglu_limit sliding_window rope_parameters rope_scaling
num_key_value_heads router_aux_loss_coef output_router_logits router_jitter_noise mlp_bias qk_rope_head_dim
compress_rate_csa compress_rate_hca expert_dtype""".split())
QWEN3_MOE_HANDLED = frozenset("rope_parameters rope_scaling".split())
V4_MTP_LOSS_SCALING_FACTOR = 0.3  # the shipped DeepSeek-V4 YAMLs' mtp_loss_factor


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
        out["mtp_loss_scaling_factor"] = V4_MTP_LOSS_SCALING_FACTOR
        _note(notes, "mtp_loss_scaling_factor", V4_MTP_LOSS_SCALING_FACTOR,
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


# the HF keys each family's own import reads (read when a config is imported, so defined after the readers)
_FAMILY_HANDLED = {DeepseekV4ModelConfig: V4_HANDLED, Qwen3MoeModelConfig: QWEN3_MOE_HANDLED}
