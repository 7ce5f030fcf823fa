"""Which `model:` settings mftk's engine implements, checked before a run (no MindSpore import).

A setting the reference honours but our layers do not would otherwise be accepted and silently
computed differently; `validate-config` and `train` report it instead. The accepted values of each field
are declared once, in its row of `status.MODEL` (``accepts`` as code, ``only`` as text, ``engine``: what the
engine does instead); this module asks them of a model and adds the rules that span fields.
"""
from __future__ import annotations

from typing import Any

from mftk.errors import Problem

_FP32_ON_CPU = ("compute_dtype", "params_dtype", "embedding_params_dtype")


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
    from mftk.config.status import MODEL

    problems: list[Problem] = []
    mt = getattr(model, "model_type", "")
    rows = [(n, st) for n, st in MODEL.items() if st.rule and st.accepts is not None]
    for name, st in [r for r in rows if not r[1].families] + [r for r in rows if r[1].families]:
        if st.families:  # the family rows: asked of those model types, with the value a missing field reads as
            if mt not in st.families:
                continue
            value, family = getattr(model, name, None), f" for {mt}"
        elif not hasattr(model, name) or mt in st.exempt:
            continue
        else:
            value, family = getattr(model, name), ""
        if not st.accepts(value):
            problems.append(Problem(path=f"model.{name}", value=value,
                                    message=f"{value!r} {NOT_IN_ENGINE}{family} ({st.engine})",
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
