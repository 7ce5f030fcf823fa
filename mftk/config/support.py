"""Which `model:` settings mftk's engine implements, checked before a run (no MindSpore import).

A setting the reference honours but our layers do not would otherwise be accepted and silently
computed differently; `validate-config` and `train` report it instead. Each row: the field, the
values the engine implements, and what to write instead.
"""
from __future__ import annotations

from typing import Any, Callable

from mftk.errors import Problem

# (field, accepted?, what the engine does) — a field missing from a family is skipped.
_ROWS: list[tuple[str, Callable[[Any], bool], str]] = [
    ("add_bias_linear", lambda v: v is False, "linear layers have no bias: set false"),
    ("apply_residual_connection_post_layernorm", lambda v: v is False, "residuals are taken before the norm"),
    ("rotary_interleaved", lambda v: v is False, "rotary pairs are the two halves (not interleaved)"),
    ("rotary_percent", lambda v: v == 1.0, "the whole rope head dim is rotated"),
    ("moe_router_force_expert_balance", lambda v: v is False, "routing follows the router scores"),
    ("moe_apply_probs_on_input", lambda v: v is False, "routing probabilities scale the expert outputs"),
    ("activation_func_clamp_value", lambda v: v is None, "the experts' SwiGLU is not clamped"),
]
# Rows that hold for some families only: (field, model types, accepted?, what the engine does there).
# GELU (exact erf, as the reference's) and non-gated MLPs are built for every dense MLP and for gated experts;
# routed experts are gated only (``weight1`` holds [gate | up]); DeepSeek-V4's experts are transformers'
# clamped SwiGLU.
_FAMILY_ROWS: list[tuple[str, tuple[str, ...], Callable[[Any], bool], str]] = [
    ("hidden_act", ("deepseek_v4",), lambda v: v in ("silu", "fusedswiglu"),
     "DeepSeek-V4's experts are the clamped SwiGLU of transformers' DeepseekV4: use silu"),
    ("gated_linear_unit", ("qwen3_moe", "deepseek_v3", "deepseek_mtp", "deepseek_v4"), lambda v: v is True,
     "routed experts are gated (weight1 holds [gate | up]): set true; a non-gated MLP is built for dense "
     "models (model_type qwen3)"),
]
_FP32_ON_CPU = ("compute_dtype", "params_dtype", "embedding_params_dtype")
_IMPLEMENTED_FOR = {"activation_func_clamp_value": ("deepseek_v4",)}  # rows a family's own layers do implement


NOT_IN_ENGINE = "is not implemented by mftk's engine yet"  # the mark of these errors (demote_for_plan finds them)


def demote_for_plan(problems: list[Problem]) -> list[Problem]:
    """A plan for an accelerator cluster (where MindSpore Transformers may be the trainer) keeps a model the engine
    does not implement: its errors become warnings that say so (``plan-parallel``; ``train`` still refuses).
    New problems: the ones given may be shared (cached rule results)."""
    out = []
    for p in problems:
        if p.severity == "error" and NOT_IN_ENGINE in p.message:
            p = Problem(path=p.path, value=p.value, line=p.line, hint=p.hint, severity="warning",
                        message=p.message + "; planned anyway (the accelerator profiles plan the cluster's run, "
                        "e.g. with MindSpore Transformers), `mftk train` refuses it")
        out.append(p)
    return out


def unsupported_model_settings(model: Any) -> list[Problem]:
    """Errors for settings the engine does not implement; notes for dtypes computed in fp32."""
    problems: list[Problem] = []
    for name, accepted, does in _ROWS:
        if not hasattr(model, name) or getattr(model, "model_type", "") in _IMPLEMENTED_FOR.get(name, ()):
            continue
        value = getattr(model, name)
        if not accepted(value):
            problems.append(Problem(path=f"model.{name}", value=value,
                                    message=f"{value!r} {NOT_IN_ENGINE} ({does})",
                                    hint="change it, or train this model with MindSpore Transformers"))
    for name, types, accepted, does in _FAMILY_ROWS:
        value = getattr(model, name, None)
        if getattr(model, "model_type", "") in types and not accepted(value):
            problems.append(Problem(path=f"model.{name}", value=value,
                                    message=f"{value!r} {NOT_IN_ENGINE} for {model.model_type} ({does})",
                                    hint="change it, or train this model with MindSpore Transformers"))
    if getattr(model, "model_type", "") == "qwen3":
        if getattr(model, "rope_scaling", None) is not None or getattr(model, "position_embedding_type", "rope") != "rope":
            problems.append(Problem(path="model.rope_scaling", value=getattr(model, "rope_scaling", None),
                                    message="Qwen3 uses plain RoPE in mftk (the reference breaks with rope_scaling "
                                    "on Qwen3 too)", hint="remove rope_scaling and position_embedding_type"))
    for name in _FP32_ON_CPU:
        value = getattr(model, name, "float32")
        if value not in ("float32", "fp32"):
            problems.append(Problem(path=f"model.{name}", value=value, severity="note",
                                    message=f"{value} requested; mftk computes and stores in float32 on CPU"))
    return problems
