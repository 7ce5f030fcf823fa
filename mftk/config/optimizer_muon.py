"""Muon's optimizer keys (mindformers-2.1.md §4.1–§4.2): their parsing and every rule, in one place.

The engine (`mftk.engine.muon`) reads the Newton–Schulz schedule through `ns_schedule`, so the
YAML forms accepted here are exactly the ones that run. The reference's checks are reproduced
(coefficient forms, QK-clip threshold, comm strategy, memory budgets, ``swap``); mftk also runs Muon
for families the reference refuses (it requires MLA), and says where QK-clip cannot act.
"""
from __future__ import annotations

from typing import Any

from mftk.config.families import MODEL_TYPES
from mftk.errors import Problem

DEFAULT_ADAMW_INCLUDE = ("*word_embeddings*", "*output_layer*")
COMM_STRATEGIES = ("allgather", "allgather_deredundency")
MUON_KEYS = ("matched_adamw_rms", "momentum", "nesterov", "ns_steps", "ns_coefficients", "adamw_betas", "adamw_eps",
             "adamw_include", "qk_clip_enabled", "qk_clip_threshold", "comm_strategy", "use_fused_adamw",
             "phase0_batch_memory_gb", "ns_batch_memory_gb", "phase4_batch_memory_gb")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def ns_schedule(coefficients: Any, ns_steps: int) -> list[tuple[float, float, float]]:
    """The Newton–Schulz coefficients of every step, in order; ValueError says what is wrong.

    Flat ``[a, b, c]`` repeats the triple ``ns_steps`` times; segmented ``[[[a, b, c], n], …]``
    repeats each triple ``n`` times and ignores ``ns_steps`` (muon.py:2323-2372)."""
    if not isinstance(coefficients, (list, tuple)) or not coefficients:
        raise ValueError("must be [a, b, c] or a non-empty list of [[a, b, c], steps] segments")
    if _number(coefficients[0]):
        if len(coefficients) != 3 or not all(_number(x) for x in coefficients):
            raise ValueError(f"the flat form needs exactly three numbers, got {list(coefficients)}")
        if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps <= 0:
            raise ValueError(f"the flat form repeats (a, b, c) ns_steps times: ns_steps must be > 0, got {ns_steps}")
        return [tuple(float(x) for x in coefficients)] * ns_steps  # type: ignore[list-item]
    out: list[tuple[float, float, float]] = []
    for i, seg in enumerate(coefficients):
        if not isinstance(seg, (list, tuple)) or len(seg) != 2:
            raise ValueError(f"segment {i} must be [[a, b, c], steps], got {seg!r}")
        triple, n = seg
        if not isinstance(triple, (list, tuple)) or len(triple) != 3 or not all(_number(x) for x in triple):
            raise ValueError(f"segment {i}: the coefficients must be three numbers, got {triple!r}")
        if isinstance(n, bool) or not _number(n) or int(n) <= 0:
            raise ValueError(f"segment {i}: the step count must be > 0, got {n!r}")
        out += [tuple(float(x) for x in triple)] * int(n)  # type: ignore[list-item]
    return out


def adamw_globs(value: Any) -> tuple[str, ...]:
    """``adamw_include`` as globs: null → the reference's defaults, a string → one glob."""
    if value is None:
        return DEFAULT_ADAMW_INCLUDE
    return (value,) if isinstance(value, str) else tuple(value)


def muon_problems(config: Any) -> list[Problem]:
    """Every problem of an ``optimizer: {type: Muon, …}`` section (and notes on what mftk does differently)."""
    o, ps = config.optimizer, []

    def add(key: str, message: str, hint: str = "", severity: str = "error") -> None:
        ps.append(Problem(path=f"optimizer.{key}", value=getattr(o, key), message=message, hint=hint, severity=severity))

    try:
        ns_schedule(o.ns_coefficients, o.ns_steps)
    except ValueError as exc:
        add("ns_coefficients", str(exc), "e.g. [3.4445, -4.7750, 2.0315] or [[[3.4445, -4.7750, 2.0315], 8], [[2.0, -1.5, 0.5], 2]]")
    if o.qk_clip_enabled and o.qk_clip_threshold <= 0:
        add("qk_clip_threshold", f"must be > 0 with qk_clip_enabled, got {o.qk_clip_threshold}", "e.g. 100")
    if o.comm_strategy not in COMM_STRATEGIES:
        add("comm_strategy", f"{o.comm_strategy!r} is not one of {', '.join(COMM_STRATEGIES)}", "use allgather")
    elif o.comm_strategy == "allgather_deredundency":
        add("comm_strategy", "mftk runs one implementation: every rank orthogonalises the full matrix (allgather); "
            "the reference means the two to be numerically identical", severity="note")
    for key in ("phase0_batch_memory_gb", "ns_batch_memory_gb", "phase4_batch_memory_gb"):
        if getattr(o, key) <= 0:
            add(key, f"must be > 0, got {getattr(o, key)}", "e.g. 1")
    if len(o.adamw_betas) != 2 or not all(0 <= b < 1 for b in o.adamw_betas):
        add("adamw_betas", f"needs two values in [0, 1), got {o.adamw_betas}")
    if o.adamw_eps < 0:
        add("adamw_eps", f"must be >= 0, got {o.adamw_eps}")
    if not 0 <= o.momentum < 1:
        add("momentum", f"must be in [0, 1), got {o.momentum}", "e.g. 0.95")
    if o.matched_adamw_rms <= 0:
        add("matched_adamw_rms", f"must be > 0, got {o.matched_adamw_rms}", "e.g. 0.2")
    if o.swap:
        add("swap", "Muon does not support optimizer-state swap (the reference raises)", "set swap: false")
    ps += _qk_clip_notes(config)
    return ps


def _qk_clip_notes(config: Any) -> list[Problem]:
    """Where QK-clip has nothing to rescale: DeepSeek-V4's attention (as in the reference) and qk-norm models."""
    o, m = config.optimizer, config.model
    mt = getattr(m, "model_type", None)
    family = MODEL_TYPES.get(mt)
    if not o.qk_clip_enabled or m is None or family is None:
        return []
    if family.attention == "csa" and not m.plain_mla():
        return [Problem(path="optimizer.qk_clip_enabled", value=True, severity="note",
                        message=f"no effect for {mt}: its compressed sparse attention keeps no max logits "
                                "(the reference's QK-clip returns at once too)")]
    if family.qk_norm:
        return [Problem(path="optimizer.qk_clip_enabled", value=True, severity="warning",
                        message=f"no effect for {mt}: q and k are RMS-normalised per head after the projection, so "
                                "rescaling the projection cannot lower a logit (the reference runs Muon on MLA models only)",
                        hint="set qk_clip_enabled: false")]
    return []


def adamw_only_problems(config: Any) -> list[Problem]:
    """Muon keys set in an AdamW section: read by nothing, so say so."""
    import attrs

    o = config.optimizer
    defaults = {f.name: f for f in attrs.fields(type(o))}  # the section's own class: no import back to sections
    out = []
    for key in MUON_KEYS:
        d = defaults[key]
        default = d.default.factory() if isinstance(d.default, attrs.Factory) else d.default
        if getattr(o, key) != default:
            out.append(Problem(path=f"optimizer.{key}", value=getattr(o, key), severity="warning",
                               message=f"only read by Muon; optimizer.type is {o.type}"))
    return out


def qk_clip_active(config: Any) -> bool:
    """QK-clip has something to clip: Muon with ``qk_clip_enabled`` on an MLA model (DeepSeek-V3, or DeepSeek-V4
    with the legacy ``mla`` variant), whose core attention then tracks its max logits (the reference switches the
    tracking on the same way and clips every ``MLASelfAttention`` that tracks them: mindformers 2.1.0
    pynative/base_models/gpt/gpt_model.py ``apply_qk_clip_scaling``)."""
    o, m = config.optimizer, getattr(config, "model", None)
    family = MODEL_TYPES.get(getattr(m, "model_type", None))
    return (o.type == "Muon" and bool(o.qk_clip_enabled) and family is not None
            and (family.mla or (family.attention == "csa" and m.plain_mla())))
