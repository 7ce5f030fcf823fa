"""The typed `model:` section's grammar: key normalisation and the rules of every family.

Each family's attrs class is in its own module (`model_qwen3`, `model_deepseek_v3`, `model_deepseek_v4`,
`model_qwen3_moe`, re-exported here); `mftk.config.families` maps ``model_type`` to it.

MindSpore Transformers keeps `model:` flat and HF-flavoured (`num_hidden_layers`, `n_routed_experts`)
with `TransformerConfig` names (`num_layers`, `num_moe_experts`) accepted as aliases; it warns about
keys it cannot map ("Unmapped Keys") and ignores them. We keep ONE name per quantity (the HF-style
YAML key users write), rewrite aliases in `normalize_model_dict` with a note, and warn about the rest
— so a YAML accepted there loads here and means the same thing.

Defaults are the effective defaults the reference ends up with for the family:
MF-injected defaults < HF signature defaults (models.md §1.3/§1.4). Values the reference derives
in `__post_init__` are methods here (never fields a user could contradict). Model-internal rules
(models.md §1.2, §1.7) are in `model_problems`; cross-section rules live in `rules.py`.
"""
import difflib
from typing import Any

import attrs

from mftk.config.families import FAMILIES, MODEL_TYPES
from mftk.config.model_base import (  # noqa: F401  (re-exported: other modules import these from here)
    AUX_LOSS_TYPES, DTYPES, ERROR, HIDDEN_ACTS, NOTE, SCORE_FUNCTIONS, WARNING, RopeParams, TransformerFields, _err, _f, _g,
    _positive,
)
from mftk.config import model_deepseek_v4 as _dsv4, model_qwen3_moe as _q3moe
from mftk.config.model_deepseek_v3 import DeepseekV3ModelConfig  # noqa: F401  (re-exported, as the others)
from mftk.config.model_deepseek_v4 import DeepseekV4ModelConfig
from mftk.config.model_qwen3 import Qwen3ModelConfig
from mftk.config.model_qwen3_moe import Qwen3MoeModelConfig
from mftk.errors import Problem


ModelConfig = Qwen3ModelConfig | DeepseekV3ModelConfig | DeepseekV4ModelConfig | Qwen3MoeModelConfig

def model_configs() -> dict[str, type]:
    """``model_type`` → config class, from the one family table (`mftk.config.families`)."""
    return {mt: f.config_class for mt, f in MODEL_TYPES.items()}


def architectures_of(cls: type) -> tuple[str, ...]:
    return next(f.architectures for f in FAMILIES if f.config_class is cls)


# ---------------------------------------------------------------------------------------------
# Key normalisation (aliases, deleted keys, inert keys, unknown keys)
# ---------------------------------------------------------------------------------------------

# TransformerConfig identity names → our (HF-style) field, per family.
_COMMON_ALIASES = {
    "num_layers": "num_hidden_layers",
    "ffn_hidden_size": "intermediate_size",
    "num_query_groups": "num_key_value_heads",
    "layernorm_epsilon": "rms_norm_eps",
    "rotary_base": "rope_theta",
    "add_qkv_bias": "attention_bias",
    "init_method_std": "initializer_range",
}
ALIASES: dict[type, dict[str, str]] = {
    Qwen3ModelConfig: {**_COMMON_ALIASES, "kv_channels": "head_dim"},
    DeepseekV3ModelConfig: {
        **_COMMON_ALIASES,
        "moe_ffn_hidden_size": "moe_intermediate_size",
        "mtp_num_layers": "num_nextn_predict_layers",
        "mtp_loss_factor": "mtp_loss_scaling_factor",
        "shared_expert_num": "n_shared_experts",
        "num_moe_experts": "n_routed_experts",
        "moe_router_topk": "num_experts_per_tok",
        "moe_router_topk_scaling_factor": "routed_scaling_factor",
        "moe_router_num_groups": "n_group",
        "moe_router_group_topk": "topk_group",
        "qk_head_dim": "qk_nope_head_dim",
        "qk_pos_emb_head_dim": "qk_rope_head_dim",
    },
    DeepseekV4ModelConfig: _dsv4.ALIASES,
    Qwen3MoeModelConfig: _q3moe.ALIASES,
}

_DELETED_COMMON = ("auto_map", "torch_dtype", "use_cache", "transformers_version")
DELETED: dict[type, tuple[str, ...]] = {
    Qwen3ModelConfig: _DELETED_COMMON + ("max_window_layers", "sliding_window", "use_sliding_window", "layer_types"),
    DeepseekV3ModelConfig: _DELETED_COMMON + ("ep_size", "scoring_func"),
    DeepseekV4ModelConfig: _dsv4.DELETED,
    Qwen3MoeModelConfig: _q3moe.DELETED,
}

# Accepted by the reference but without effect in the PyNative DSv3/Qwen3 path (models.md §1.5).
INERT = frozenset("""
batch_size parallel_config pet_config context_parallel_algo rotary_cos_format mla_qkv_concat
use_contiguous_weight_layout_attention use_interleaved_weight_layout_mlp add_mlp_fc1_bias_linear
add_mlp_fc2_bias_linear fp16_lm_cross_entropy untie_embeddings_and_output_weights mask_func_type
comp_comm_parallel comp_comm_parallel_degree use_fused_ops_topkrouter topk_method npu_nums_per_device
use_pad_tokens callback_moe_droprate moe_router_fusion use_eod_reset print_separate_loss sandwich_norm
block_size num_blocks pre_process dispatch_global_max_bs attn_reduce_scatter attn_allgather attn_allreduce
ffn_reduce_scatter ffn_allgather ffn_allreduce use_alltoall use_fused_mla quantization_config
disable_lazy_inline coeff micro_batch_num seq_split_num gradient_aggregation_group offset ulysses_degree_in_cp
vocab_emb_dp op_swap default_prefetch softmax_scale fp32_residual_connection activation_func
nope_layer_interval partial_rotary_factor param_init_std_rules attention_softmax_in_fp32 softmax_compute_dtype
bias_dropout_fusion moe_shared_expert_overlap moe_z_loss_coeff group_wise_a2a moe_expert_capacity_factor
moe_token_drop_policy print_expert_load cp_comm_type window_size window_attn_skip_freq model_architecture
num_encoder_layers num_decoder_layers use_rope_scaling rotary_seq_len_interpolation_factor rope_type
original_max_position_embeddings use_attention_mask moe_n_hash_layers actual_vocab_size
data_parallel model_parallel pipeline_stage pp_interleave_num use_seq_parallel context_parallel
expert_parallel expert_model_parallel swap layer_swap bias_swiglu_fusion
""".split())
_INERT_PREFIXES = ("cpu_offloading", "expert_relocation")
_INERT_SUFFIXES = ("_parallel_size",)
# DSv3.2 / DSv4 features: accepted when off, rejected when switched on.
_UNSUPPORTED_FEATURES = ("experimental_attention_variant", "enable_hyper_connections")
_UNSUPPORTED_PREFIXES = ("dsa_", "csa_", "mhc_")
_PARALLEL_ALIASES = frozenset("""data_parallel model_parallel pipeline_stage pp_interleave_num use_seq_parallel
context_parallel expert_parallel expert_model_parallel context_parallel_algo ulysses_degree_in_cp""".split())
_DSV3_ONLY = frozenset(attrs.fields_dict(DeepseekV3ModelConfig)) - frozenset(attrs.fields_dict(Qwen3ModelConfig))


def _is_inert(key: str) -> bool:
    return (key in INERT or key.startswith(_INERT_PREFIXES) or key.endswith(_INERT_SUFFIXES)
            or "recompute" in key)


def _float_fields(cls: type) -> set[str]:
    return {a.name for a in attrs.fields(cls) if a.type in (float, float | None)}


def family_of(raw: dict) -> type | None:
    """The config class for a raw `model:` mapping, from its `model_type` (None when unknown)."""
    mt = raw.get("model_type") if isinstance(raw, dict) else None
    return model_configs().get(mt) if isinstance(mt, str) else None


def normalize_model_dict(raw: dict) -> tuple[dict, list[Problem]]:
    """Rewrite a raw YAML `model:` mapping to our field names; say what was changed and why.

    Returns the dict to structure into the family's config class plus problems: notes (alias
    rewritten, deleted key dropped, string coerced), warnings (inert or unknown keys, as the
    reference's "Unmapped Keys" warning) and errors (no/unknown model_type, conflicting aliases,
    switched-on unsupported features).
    """
    problems: list[Problem] = []
    if not isinstance(raw, dict):
        return {}, [Problem(path="model", message="must be a mapping of model keys", value=raw,
                            hint="write `model:` followed by indented `key: value` lines")]
    cls = family_of(raw)
    if cls is None:
        mt = raw.get("model_type")
        msg = "is required" if mt is None else f"unknown model_type {mt!r}"
        problems.append(Problem(path="model.model_type", message=msg, value=mt,
                                hint=f"one of: {', '.join(model_configs())}" + _did_you_mean(mt, list(model_configs()))))
        return {}, problems
    fields = attrs.fields_dict(cls)
    aliases, deleted = ALIASES[cls], DELETED[cls]
    floats = _float_fields(cls)
    out: dict[str, Any] = {}
    source: dict[str, str] = {}  # our field → YAML key it came from
    for key, value in raw.items():
        path = f"model.{key}"
        if not isinstance(key, str):
            problems.append(Problem(path=path, message="model keys must be strings", value=key))
            continue
        target = key
        if key in aliases:
            target = aliases[key]
            problems.append(Problem(path=path, severity=NOTE, value=value,
                                    message=f"alias of `{target}`; read as model.{target}"))
        elif key in fields:
            pass
        elif key in deleted:
            problems.append(Problem(path=path, severity=NOTE, value=value, message=_deleted_message(key)))
            continue
        elif key == "experimental_attention_variant" and value == "mla":
            # the reference's layer builder reads the legacy `mla` as no variant: plain MLA attention, which needs
            # multi_latent_attention (mindformers 2.1.0 pynative/base_models/gpt/gpt_layer_specs.py)
            if cls is DeepseekV3ModelConfig:
                problems.append(Problem(path=path, severity=NOTE, value=value, message="the legacy name of the plain "
                                        "MLA attention DeepSeek-V3 builds (the reference reads it as no variant)"))
            else:
                problems.append(Problem(path=path, value=value, message="`mla` is plain MLA attention: it needs "
                                        "multi_latent_attention, which this model does not have (the reference "
                                        "raises too)", hint="remove it"))
            continue
        elif key in _UNSUPPORTED_FEATURES or key.startswith(_UNSUPPORTED_PREFIXES):
            if value not in (None, False, 0, "", "none"):
                problems.append(Problem(path=path, value=value, message="DeepSeek-V3.2/V4 feature; not supported",
                                        hint="remove it or set it off"))
            continue
        elif cls in (Qwen3ModelConfig, Qwen3MoeModelConfig) and key == "qk_layernorm":
            problems.append(Problem(path=path, value=value, severity=NOTE if value is True else WARNING,
                                    message="Qwen3 always applies q/k RMSNorm (the reference ignores this key)"))
            continue
        elif cls is Qwen3ModelConfig and (key in _DSV3_ONLY or key in ALIASES[DeepseekV3ModelConfig]):
            problems.append(Problem(path=path, severity=WARNING, value=value,
                                    message="accepted, no effect for model_type qwen3 (dense GQA model); ignored"))
            continue
        elif _is_inert(key):
            msg = "accepted, no effect in PyNative; ignored"
            if key in _PARALLEL_ALIASES:
                msg += " (parallel degrees come from the top-level `parallelism:` section)"
            problems.append(Problem(path=path, severity=WARNING, value=value, message=msg))
            continue
        else:
            problems.append(Problem(path=path, severity=WARNING, value=value,
                                    message="unknown model key (unmapped); ignored",
                                    hint=_did_you_mean(key, list(fields) + list(aliases)).lstrip("; ")))
            continue
        if target in out:
            if out[target] != value:
                problems.append(Problem(path=path, value=value,
                                        message=f"`{key}` and `{source[target]}` name the same setting with "
                                                f"different values ({value!r} vs {out[target]!r})",
                                        hint=f"keep only `{target}`"))
            continue
        out[target], source[target] = value, key
    if raw.get("bias_swiglu_fusion") is True and out.get("hidden_act") == "swiglu":
        out["hidden_act"] = "fusedswiglu"  # the reference rewrites it the same way
        problems.append(Problem(path=f"model.{source['hidden_act']}", severity=NOTE, value="swiglu",
                                message="read as fusedswiglu because bias_swiglu_fusion is true (as the reference does)"))
    if out.get("hidden_act") in ("swiglu", "fusedswiglu") and out.get("gated_linear_unit") is False:
        out["gated_linear_unit"] = True  # SwiGLU halves its input: mindformers 2.1.0 transformer_config.py does the same
        problems.append(Problem(path=f"model.{source['gated_linear_unit']}", severity=WARNING, value=False,
                                message=f"read as true: {out['hidden_act']} is a gated activation (the reference "
                                        "overrides it the same way, with a warning)",
                                hint="use hidden_act: silu or gelu for a non-gated MLP"))
    _coerce(out, source, cls, floats, problems)
    return out, problems


def _coerce(out: dict, source: dict, cls: type, floats: set[str], problems: list[Problem]) -> None:
    """Friendly fixes that cost nothing: YAML-1.1 float strings, nulls that mean 0, one-element lists."""
    for name in list(out):
        value, path = out[name], f"model.{source[name]}"
        if name in floats and isinstance(value, str):
            try:
                out[name] = float(value)
            except ValueError:
                continue  # the converter reports the type error
            problems.append(Problem(path=path, severity=NOTE, value=value,
                                    message=f"string {value!r} read as the float {out[name]!r} (YAML 1.1 needs a dot)"))
        elif name in ("hidden_dropout", "attention_dropout") and isinstance(value, int) and not isinstance(value, bool):
            out[name] = float(value)
            problems.append(Problem(path=path, severity=WARNING, value=value,
                                    message=f"int {value} read as {float(value)}; MindSpore Transformers rejects an int here",
                                    hint=f"write {float(value)}"))
    if "pad_token_id" in out and out["pad_token_id"] is None:
        out["pad_token_id"] = -1 if cls in (DeepseekV4ModelConfig, Qwen3MoeModelConfig) else 0
        problems.append(Problem(path=f"model.{source['pad_token_id']}", severity=NOTE, value=None,
                                message=f"null pad_token_id means {out['pad_token_id']}"))
    if cls is DeepseekV3ModelConfig and "num_nextn_predict_layers" in out and out["num_nextn_predict_layers"] is None:
        out["num_nextn_predict_layers"] = 0
        problems.append(Problem(path=f"model.{source['num_nextn_predict_layers']}", severity=NOTE, value=None,
                                message="null MTP depth means 0 (MTP off)"))
    arch = out.get("architectures")
    if isinstance(arch, list) and len(arch) == 1 and isinstance(arch[0], str):
        out["architectures"] = arch[0]
        problems.append(Problem(path="model.architectures", severity=WARNING, value=arch,
                                message=f"a list (legacy graph-mode style); read as {arch[0]!r}",
                                hint=f"write `architectures: {arch[0]}` — MindSpore Transformers PyNative rejects a list"))


def _deleted_message(key: str) -> str:
    if key == "scoring_func":
        return "deleted by the reference and ignored; the router uses `moe_router_score_function`"
    if key == "torch_dtype":
        return "deleted by the reference and ignored; dtypes come from compute_dtype / params_dtype"
    return "deleted by the reference and ignored"


def _did_you_mean(key: Any, choices: list[str]) -> str:
    if not isinstance(key, str):
        return ""
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.75)
    return f"; did you mean `{close[0]}`?" if close else ""


def yaml_key_for(raw: dict, name: str) -> str:
    """The key the user actually wrote for field `name` (an alias, or the name itself).

    Structuring errors are reported on our field names; this maps them back so the message
    and the YAML line number point at what the user typed (`num_layers`, not `num_hidden_layers`).
    """
    cls = family_of(raw)
    if cls is None or name in raw:
        return name
    for alias, target in ALIASES[cls].items():
        if target == name and alias in raw:
            return alias
    return name


def model_config_from_dict(raw: dict) -> tuple[ModelConfig | None, list[Problem]]:
    """Normalise and build a model config without cattrs (tests, HF import); types are not coerced."""
    data, problems = normalize_model_dict(raw)
    if any(p.severity == ERROR for p in problems):
        return None, problems
    return model_configs()[raw["model_type"]](**data), problems


# ---------------------------------------------------------------------------------------------
# Model-internal rules (models.md §1.2, §1.7)
# ---------------------------------------------------------------------------------------------

def model_problems(cfg: ModelConfig) -> list[Problem]:
    """Every model-internal rule the reference enforces (or crashes on), with the arithmetic shown."""
    ps: list[Problem] = []
    _check_common(cfg, ps)
    if isinstance(cfg, Qwen3ModelConfig):
        _check_qwen3(cfg, ps)
    elif isinstance(cfg, DeepseekV4ModelConfig):
        _dsv4.check_deepseek_v4(cfg, ps)
    elif isinstance(cfg, Qwen3MoeModelConfig):
        _q3moe.check_qwen3_moe(cfg, ps)
    else:
        _check_dsv3(cfg, ps)
    return ps


def _check_common(cfg: ModelConfig, ps: list[Problem]) -> None:
    allowed = architectures_of(type(cfg))
    if cfg.architectures not in allowed:
        _err(ps, "architectures", cfg.architectures, f"{cfg.architectures!r} is not a model class for "
             f"model_type {cfg.model_type!r}", f"use {' or '.join(allowed)}")
    _positive(cfg, ps, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "seq_length", "max_position_embeddings"))
    if cfg.chunk_loss_num < 0:
        _err(ps, "chunk_loss_num", cfg.chunk_loss_num, "must be >= 0", "0 disables chunking")
    for n in ("compute_dtype", "params_dtype", "embedding_params_dtype", "layernorm_compute_dtype", "rotary_dtype"):
        v = getattr(cfg, n)
        if v not in DTYPES:
            _err(ps, n, v, f"unknown dtype {v!r}", f"one of {', '.join(DTYPES)}" + _did_you_mean(v, list(DTYPES)))
    if cfg.hidden_act not in HIDDEN_ACTS:
        hint = "use silu (or fusedswiglu: the same SwiGLU)" if cfg.hidden_act == "swiglu" else \
            f"one of {', '.join(HIDDEN_ACTS)}"
        _err(ps, "hidden_act", cfg.hidden_act,
             f"{cfg.hidden_act!r} is not a PyNative activation (only {', '.join(HIDDEN_ACTS)})", hint)
    for n in ("hidden_dropout", "attention_dropout"):
        v = getattr(cfg, n)
        if not 0.0 <= v < 1.0:
            _err(ps, n, v, f"dropout must be in [0, 1), got {v}", "e.g. 0.0 (off)")
    if not cfg.fused_norm:
        _err(ps, "fused_norm", False, "non-fused norms are rejected by the reference", "set fused_norm: true")
    if cfg.normalization != "RMSNorm":
        _err(ps, "normalization", cfg.normalization, "only RMSNorm is supported by these models",
             "set normalization: RMSNorm")
    if cfg.rms_norm_eps <= 0:
        _err(ps, "rms_norm_eps", cfg.rms_norm_eps, f"must be > 0, got {cfg.rms_norm_eps}", "e.g. 1.0e-6")
    if cfg.rope_theta <= 0:
        _err(ps, "rope_theta", cfg.rope_theta, f"must be > 0, got {cfg.rope_theta}", "e.g. 10000.0 (Qwen3 checkpoints: 1000000.0)")
    if cfg.initializer_range < 0:
        _err(ps, "initializer_range", cfg.initializer_range, "a standard deviation must be >= 0", "e.g. 0.02")
    if cfg.calculate_per_token_loss:
        _err(ps, "calculate_per_token_loss", True, "not handled by the PyNative trainer (only the numerator "
             "would be used)", "set calculate_per_token_loss: false")
    if cfg.rope_scaling is not None and not isinstance(cfg.rope_scaling, dict):
        _err(ps, "rope_scaling", cfg.rope_scaling, "must be a mapping (HF rope_scaling) or null", "e.g. {type: yarn, factor: 40, original_max_position_embeddings: 4096}")


def _check_qwen3(cfg: Qwen3ModelConfig, ps: list[Problem]) -> None:
    nh, ng = cfg.num_attention_heads, cfg.num_query_groups()
    if ng > 0 and nh > 0 and nh % ng:
        _err(ps, "num_key_value_heads", ng, f"num_attention_heads % num_key_value_heads = {nh} % {ng} = {nh % ng}, "
             "must be 0 (each KV head serves a whole group of query heads)", "pick a divisor of num_attention_heads")
    hd = cfg.kv_channels()
    if hd <= 0:
        _err(ps, "head_dim", cfg.head_dim, f"head dim must be > 0, got {hd}", "e.g. 128")
    elif cfg.position_embedding_type == "rope" and hd % 2:
        _err(ps, "head_dim", hd, f"RoPE rotates pairs: head_dim must be even, got {hd}", f"use {hd + 1}")
    if cfg.rope_scaling:
        _err(ps, "rope_scaling", cfg.rope_scaling, "the reference's Qwen3 breaks with rope_scaling (yarn needs MLA "
             "fields; other types silently disable RoPE)", "remove rope_scaling (null)")
    if cfg.position_embedding_type not in ("rope", "none"):
        _err(ps, "position_embedding_type", cfg.position_embedding_type,
             "Qwen3 supports rope or none", "set position_embedding_type: rope")


def _check_dsv3(cfg: DeepseekV3ModelConfig, ps: list[Problem]) -> None:
    _positive(cfg, ps, ("moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "kv_lora_rank",
                        "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                        "moe_shared_expert_intermediate_size"))
    if cfg.qk_rope_head_dim > 0 and cfg.qk_rope_head_dim % 2:
        _err(ps, "qk_rope_head_dim", cfg.qk_rope_head_dim, "RoPE rotates pairs: must be even", "e.g. 64")
    if not cfg.multi_latent_attention:
        _err(ps, "multi_latent_attention", False, "DeepSeek-V3 is built with MLA only",
             "set multi_latent_attention: true")
    _check_rope_dsv3(cfg, ps)
    _check_moe_pattern(cfg, ps)
    if cfg.is_moe():
        _check_router(cfg, ps)
        if cfg.add_bias_linear:
            _err(ps, "add_bias_linear", True, "must be false with MoE (the reference asserts it)",
                 "set add_bias_linear: false")
        if not cfg.moe_grouped_gemm:
            _err(ps, "moe_grouped_gemm", False, "the reference's PyNative MoE raises NotImplementedError "
                 "without grouped GEMM", "set moe_grouped_gemm: true")
    if cfg.n_shared_experts < 0:
        _err(ps, "n_shared_experts", cfg.n_shared_experts, "must be >= 0", "0 turns shared experts off")
    elif cfg.n_shared_experts == 0 and cfg.moe_shared_expert_intermediate_size:
        _err(ps, "moe_shared_expert_intermediate_size", cfg.moe_shared_expert_intermediate_size,
             "set while n_shared_experts is 0: there are no shared experts", "remove it or set n_shared_experts",
             severity=WARNING)
    D = cfg.num_nextn_predict_layers
    if D < 0 or D > 1:
        _err(ps, "num_nextn_predict_layers", D, f"MTP depth must be 0 or 1, got {D}", "0 turns MTP off")
    elif D == 1 and cfg.mtp_loss_scaling_factor is None:
        _err(ps, "mtp_loss_scaling_factor", None, "required when num_nextn_predict_layers = 1 (the reference "
             "divides by it and crashes)", "set mtp_loss_scaling_factor: 0.3, or num_nextn_predict_layers: 0")
    if cfg.mtp_loss_scaling_factor is not None and cfg.mtp_loss_scaling_factor < 0:
        _err(ps, "mtp_loss_scaling_factor", cfg.mtp_loss_scaling_factor, "must be >= 0", "e.g. 0.3")
    if not cfg.qk_layernorm:
        _err(ps, "qk_layernorm", False, "without it the MLA latent norms are identities (differs from "
             "DeepSeek-V3 / HF)", "set qk_layernorm: true for the published architecture", severity=WARNING)
    if cfg.tie_word_embeddings:
        _err(ps, "tie_word_embeddings", True, "the DeepSeek-V3 PyNative model never ties the LM head; ignored",
             "set tie_word_embeddings: false", severity=WARNING)


def _check_rope_dsv3(cfg: DeepseekV3ModelConfig, ps: list[Problem]) -> None:
    rs = cfg.rope_scaling
    if isinstance(rs, dict):
        if "type" not in rs and "rope_type" not in rs:
            _err(ps, "rope_scaling", rs, "needs a `type` (or `rope_type`) key", "add type: yarn")
        for k in ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "original_max_position_embeddings"):
            if k in rs and (isinstance(rs[k], bool) or not isinstance(rs[k], (int, float))):
                _err(ps, f"rope_scaling.{k}", rs[k], "must be a number", "write it without quotes, e.g. 40")
                return
    rp = cfg.rope_params()
    if rp.position_embedding_type not in ("rope", "yarn", "none"):
        key = "rope_scaling" if rs else "position_embedding_type"
        _err(ps, key, rp.position_embedding_type, f"position embedding {rp.position_embedding_type!r} is not "
             "supported for DeepSeek-V3", "use rope or yarn")
    if rp.factor <= 0:
        _err(ps, "rotary_scaling_factor", rp.factor, "YaRN factor must be > 0", "e.g. 40")
    if not 0 < cfg.rotary_percent <= 1:
        _err(ps, "rotary_percent", cfg.rotary_percent, "must be in (0, 1]", "1.0 rotates all rope dims")


def _check_moe_pattern(cfg: DeepseekV3ModelConfig, ps: list[Problem]) -> None:
    L, freq, k = cfg.num_hidden_layers, cfg.moe_layer_freq, cfg.first_k_dense_replace
    if isinstance(freq, list):
        if len(freq) != L:
            _err(ps, "moe_layer_freq", freq, f"a list needs one entry per layer: len = {len(freq)}, "
                 f"num_hidden_layers = {L}", "give one 0/1 per layer")
        if any(x not in (0, 1) for x in freq):
            _err(ps, "moe_layer_freq", freq, "list entries must be 0 (dense) or 1 (MoE)", "e.g. [0, 1, 1, 1]")
    elif freq < 1:
        _err(ps, "moe_layer_freq", freq, f"must be >= 1, got {freq}", "1 makes every layer MoE")
    if k is not None:
        if k < 0 or k > L:
            _err(ps, "first_k_dense_replace", k, f"must be in [0, num_hidden_layers = {L}], got {k}", f"use at most {L}")
        if isinstance(freq, int) and freq > 1:
            _err(ps, "first_k_dense_replace", k, f"cannot be combined with moe_layer_freq = {freq} > 1",
                 "use one of them, or a moe_layer_freq list")


def _check_router(cfg: DeepseekV3ModelConfig, ps: list[Problem]) -> None:
    E, K, G, TG = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
    if K > E > 0:
        _err(ps, "num_experts_per_tok", K, f"top-K {K} exceeds n_routed_experts {E}", f"use at most {E}")
    if cfg.moe_router_score_function not in SCORE_FUNCTIONS:
        _err(ps, "moe_router_score_function", cfg.moe_router_score_function,
             f"unknown score function {cfg.moe_router_score_function!r}", f"one of {', '.join(SCORE_FUNCTIONS)}")
    elif cfg.moe_router_enable_expert_bias and cfg.moe_router_score_function == "softmax":
        _err(ps, "moe_router_enable_expert_bias", True, "expert bias needs a sigmoid or sqrtsoftplus score function, "
             "got softmax", "set moe_router_score_function: sigmoid, or moe_router_enable_expert_bias: false")
    if K > 1 and cfg.moe_router_score_function == "softmax" and not cfg.moe_router_pre_softmax \
            and not cfg.norm_topk_prob:
        ps.append(Problem(path="model.moe_router_pre_softmax", value=False, severity="note", message=(
            "routing takes the softmax over all experts before top-k whatever this says, as MindSpore Transformers "
            "2.1's PyNative router (pynative/transformers/moe/router.py, TopKRouter.construct); Megatron's order "
            "for false (top-k, then softmax over the k) is not applied — the same weights only with "
            "norm_topk_prob: true")))
    if K == 1 and cfg.moe_router_score_function == "softmax" and not cfg.moe_router_pre_softmax:
        _err(ps, "num_experts_per_tok", 1, "top-1 softmax routing is rejected by the reference",
             "set moe_router_pre_softmax: true, or use K > 1")
    if G is not None and G > 0 and E > 0:
        if TG is None or TG <= 0:
            _err(ps, "topk_group", TG, f"required (> 0) when n_group = {G}", "set topk_group, or n_group: null to turn group routing off")
        else:
            if E % G:
                _err(ps, "n_group", G, f"n_routed_experts % n_group = {E} % {G} = {E % G}, must be 0", "pick n_group dividing n_routed_experts")
            elif E // G < 2:
                _err(ps, "n_group", G, f"experts per group = {E} / {G} = {E // G}, must be >= 2 "
                     "(group score is the sum of the top-2)", f"use n_group <= {E // 2}")
            if TG > G:
                _err(ps, "topk_group", TG, f"topk_group {TG} > n_group {G}", f"use at most {G}")
            if K % TG:
                _err(ps, "topk_group", TG, f"num_experts_per_tok % topk_group = {K} % {TG} = {K % TG}, must be 0", "pick topk_group dividing num_experts_per_tok")
    if cfg.moe_aux_loss_coeff < 0:
        _err(ps, "moe_aux_loss_coeff", cfg.moe_aux_loss_coeff, "must be >= 0", "0 turns the aux loss off")
    elif cfg.moe_aux_loss_coeff > 0 and cfg.moe_router_load_balancing_type not in AUX_LOSS_TYPES:
        _err(ps, "moe_router_load_balancing_type", cfg.moe_router_load_balancing_type,
             f"must be one of {', '.join(AUX_LOSS_TYPES)} when moe_aux_loss_coeff = {cfg.moe_aux_loss_coeff} > 0 "
             "(the reference raises 'Unknown aux_loss_type')", "e.g. seq_aux_loss (DeepSeek-V3)")
    if cfg.moe_router_bias_update_rate < 0:
        _err(ps, "moe_router_bias_update_rate", cfg.moe_router_bias_update_rate, "must be >= 0", "e.g. 0.001")
    if cfg.moe_router_dtype not in DTYPES:
        _err(ps, "moe_router_dtype", cfg.moe_router_dtype, f"unknown dtype {cfg.moe_router_dtype!r}", f"one of {', '.join(DTYPES)}")
