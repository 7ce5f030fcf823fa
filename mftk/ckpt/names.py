"""Optimizer-state tensor names in a checkpoint's ``*-opt-*`` files: the one place that knows them.

MindSpore Transformers names each per-parameter state ``<state>.<parameter name>`` plus one
``global_step`` counter (reference §3.1, 2.1.0 §4.7). Which states exist depends on the optimizer
that wrote the file; mftk's AdamW keeps ``adam_m`` / ``adam_v`` (and ``main_param`` masters for
low-precision parameters). States of other optimizers are recognised so they can be reported by
name and skipped, never mistaken for model weights and never silently dropped when they matter.
"""
from __future__ import annotations

from typing import Iterable

STEP = "global_step"
ADAMW_STATES = ("adam_m", "adam_v")  # fp32 moments of every trainable parameter (mftk's AdamW)
MASTER = "main_param"  # fp32 master copy, only for bf16/fp16 parameters
# States other optimizers write, with what they are: mftk's AdamW has no use for them.
UNUSED_STATES = {
    "max_exp_avg_sq": "AMSGrad's running maximum of adam_v (optimizer.amsgrad: true)",
    "muon_m": "Muon momentum (optimizer.type: Muon)",
}
STATES = ADAMW_STATES + (MASTER,) + tuple(UNUSED_STATES)
_PREFIXES = tuple(f"{s}." for s in STATES)


LORA_SUFFIXES = (".lora_a", ".lora_b", "_lora_a", "_lora_b")  # the reference's `is_lora_param_name` (2.1 §2.8)


def is_lora_name(name: str) -> bool:
    """A LoRA adapter tensor (``….lora_a``, ``…experts.weight1_lora_b``), or an optimizer state of one."""
    param = param_of(name)
    return param.endswith(LORA_SUFFIXES) or param in ("lora_a", "lora_b")


def split_state(name: str) -> tuple[str, str] | None:
    """``'adam_m.decoder.w'`` → ``('adam_m', 'decoder.w')``; None for a model tensor or ``global_step``."""
    if name.startswith(_PREFIXES):
        state, param = name.split(".", 1)
        return state, param
    return None


def is_optimizer_name(name: str) -> bool:
    """True for ``global_step`` and every known per-parameter optimizer state."""
    return name == STEP or split_state(name) is not None


def param_of(name: str) -> str:
    """The parameter an optimizer state belongs to (the name itself for a model tensor)."""
    parts = split_state(name)
    return parts[1] if parts else name


def state_name(state: str, param: str) -> str:
    return f"{state}.{param}"


def unused_states(names: Iterable[str]) -> dict[str, list[str]]:
    """The tensors mftk's AdamW does not use, grouped by state (``{'max_exp_avg_sq': [...]}``), sorted."""
    out: dict[str, list[str]] = {}
    for name in names:
        parts = split_state(name)
        if parts and parts[0] in UNUSED_STATES:
            out.setdefault(parts[0], []).append(name)
    return {k: sorted(v) for k, v in sorted(out.items())}


def describe_unused(groups: dict[str, list[str]], *, shown: int = 3) -> list[str]:
    """One line per unused state: ``max_exp_avg_sq.* (4 tensors: a, b, c, …) — AMSGrad's …``."""
    lines = []
    for state, names in groups.items():
        head = ", ".join(names[:shown]) + (", …" if len(names) > shown else "")
        lines.append(f"{state}.* ({len(names)} tensor{'s' if len(names) != 1 else ''}: {head}) — {UNUSED_STATES[state]}")
    return lines
