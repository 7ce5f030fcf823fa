"""Hugging Face `config.json` → our `model:` section (Qwen3 and DeepSeek-V3).

Users start from published models. The HF keys are already our field names (models.md §1.3/§1.4),
so most values pass through; what changes is what HF leaves implicit and the reference needs
spelled out (models.md §1.2): DeepSeek-V3 needs `moe_grouped_gemm`, `qk_layernorm`, an MTP loss
weight and a valid aux-loss type; both families want `hidden_dropout: 0.0` (HF models train
without it, and Qwen3's reference default is 0.1). Keys that only matter to HF (`torch_dtype`,
`auto_map`, FP8 `quantization_config`, ...) are dropped, each reported as a note, never silently.
"""
import json
from pathlib import Path
from typing import Any

import attrs
import yaml

from mftk.config.model import (DELETED, MODEL_CONFIGS, NOTE, WARNING, DeepseekV3ModelConfig, TransformerFields,
                               normalize_model_dict)
from mftk.errors import ConfigError, DataFormatError, InputError, Problem

# HF-only keys with no place in the model section (beyond the reference's own deleted keys).
_HF_ONLY = {
    "quantization_config": "FP8 block quantisation of the published weights; dequantise them before import",
    "pretraining_tp": "HF tensor-parallel hint; parallelism comes from the `parallelism:` section",
    "topk_method": "always noaux_tc-style group top-k in PyNative",
    "aux_loss_alpha": "read as moe_aux_loss_coeff",
    "seq_aux": "read as moe_router_load_balancing_type",
    "scoring_func": "read as moe_router_score_function",
}

DEFAULT_MTP_LOSS_SCALING_FACTOR = 0.3  # DeepSeek-V3 paper, first 10T tokens; pynative_ds3.yaml uses it too


def hf_to_model_section(config_json: dict, *, seq_length: int | None = None) -> tuple[dict, list[Problem]]:
    """Translate an HF `config.json` dict; return the `model:` mapping and what was dropped or added."""
    if not isinstance(config_json, dict):
        raise ConfigError(message="config.json must hold a JSON object", problems=[])
    mt = config_json.get("model_type")
    cls = MODEL_CONFIGS.get(mt) if isinstance(mt, str) else None
    if cls is None:
        raise ConfigError(
            message=f"unsupported HF model_type {mt!r}",
            hint=f"supported: {', '.join(MODEL_CONFIGS)}",
            problems=[Problem(path="model_type", value=mt, message="unsupported model_type",
                              hint=f"one of {', '.join(MODEL_CONFIGS)}")])
    notes: list[Problem] = []
    fields = attrs.fields_dict(cls)
    raw: dict[str, Any] = {}
    for key, value in config_json.items():
        if key == "architectures" and isinstance(value, list):
            value = value[0] if value else fields["architectures"].default
        if key in fields:
            raw[key] = value
        elif key in DELETED[cls] or key in _HF_ONLY:
            why = _HF_ONLY.get(key) or "only meaningful to HF / deleted by the reference"
            notes.append(Problem(path=f"model.{key}", severity=NOTE, value=value, message=f"dropped: {why}"))
        else:
            notes.append(Problem(path=f"model.{key}", severity=WARNING, value=value,
                                 message="HF key with no mftk equivalent; dropped"))
    if cls is DeepseekV3ModelConfig:
        raw.update(_deepseek_extras(config_json, notes))
    raw["hidden_dropout"] = 0.0
    raw["seq_length"] = seq_length if seq_length is not None else fields["seq_length"].default
    raw.setdefault("architectures", fields["architectures"].default)
    section, problems = normalize_model_dict(raw)
    return _ordered(section, cls), notes + [p for p in problems if p.severity != NOTE]


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
    if not p.exists():
        raise InputError(message=f"{p}: no such file", path=str(p),
                         hint="pass the config.json of a Hugging Face model directory")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(message=f"{p}: cannot read ({exc})", path=str(p)) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(message=f"{p}: not valid JSON ({exc.msg})", path=str(p), line=exc.lineno,
                              offset=exc.pos, expected="a JSON object", found=text[exc.pos:exc.pos + 20]) from exc
    if not isinstance(data, dict):
        raise DataFormatError(message=f"{p}: expected a JSON object", path=str(p), expected="a JSON object",
                              found=type(data).__name__)
    return data


def model_section_yaml(section: dict) -> str:
    """`model:` plus the section as block YAML (key order kept; floats always carry a dot/exponent)."""
    return yaml.safe_dump({"model": section}, sort_keys=False, default_flow_style=False, allow_unicode=True)
