"""Learning-rate schedules of MindSpore Transformers (reference §1.3 `lr_scheduler`, §2.7), in pure Python.

A schedule is a function ``step -> lr``. It is stateless: the LR position is the optimizer's
``global_step``, so restoring that counter restores the schedule (nothing else is saved).

Step indexing (reference §2.7): the k-th optimizer update (1-based) uses ``lr(k-1)``, i.e. the
optimizer evaluates the schedule at its counter *before* incrementing it. The log line's ``lr``
is ``lr(global_step)`` *after* the increment (the next update's LR), as the reference prints it.

Warm-up, shared by every schedule: ``if t < warmup: lr = init + (peak - init)·t/warmup``.
``warmup_ratio`` (when ``warmup_steps`` is unset) gives ``int(total·ratio)`` steps; ``total`` is
always ``training.steps`` (the reference forces it, overriding ``lr_scheduler.total_steps``).
No MindSpore here, so `validate-config` and tests can evaluate schedules without it.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import attrs

Schedule = Callable[[int], float]

NAMES = ("ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR", "WarmUpStableDecayLR",
         "ConstantWithCoolDownLR", "PolynomialWithWarmUpLR")


@attrs.frozen
class Warmup:
    steps: int
    init: float
    peak: float

    def active(self, t: float) -> bool:
        return self.steps > t

    def __call__(self, t: float) -> float:
        return self.init + (self.peak - self.init) * t / self.steps


def _steps(steps: int | None, ratio: float | None, total: int, default: int | None = 0) -> int | None:
    """``X_steps`` or ``int(total·X_ratio)`` (the reference's `_get_warmup_steps`)."""
    if ratio is not None and steps is None:
        return int(total * ratio)
    return default if steps is None else int(steps)


def _cosine(progress: float, num_cycles: float) -> float:
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))


def constant_warmup(peak: float, w: Warmup) -> Schedule:
    return lambda t: w(t) if w.active(t) else peak


def linear_warmup(peak: float, w: Warmup, total: int) -> Schedule:
    linear = max(1, total - w.steps)
    return lambda t: w(t) if w.active(t) else peak * max(0.0, (total - t) / linear)


def cosine_warmup(peak: float, w: Warmup, total: int, *, lr_end: float, num_cycles: float,
                  decay_steps: int | None) -> Schedule:
    cosine_steps = max(1, total - w.steps)
    decay = max(1, decay_steps) if decay_steps is not None else max(1, total)

    def lr(t: float) -> float:
        if t >= decay:
            return lr_end
        if w.active(t):
            return w(t)
        return lr_end + (peak - lr_end) * _cosine((t - w.steps) / cosine_steps, num_cycles)
    return lr


def warmup_stable_decay(peak: float, w: Warmup, total: int, *, lr_end: float, decay_start: int) -> Schedule:
    """Warm-up, hold ``peak`` until ``decay_start``, then linear to ``lr_end`` over ``total - decay_start``."""
    span = max(1, total - decay_start)

    def lr(t: float) -> float:
        if w.active(t):
            return w(t)
        if t < decay_start:
            return peak
        return peak + (lr_end - peak) * min(1.0, (t - decay_start) / span)
    return lr


def constant_with_cooldown(peak: float, w: Warmup, *, keep_steps: int, decay_steps: int, num_cycles: float,
                           lr_end1: float, final_steps: int, lr_end2: float) -> Schedule:
    """Warm-up; ``peak`` for ``keep_steps``; cosine to ``lr_end1`` over ``decay_steps``; ``lr_end1`` for
    ``final_steps``; then ``lr_end2`` (DeepSeek-V3 style)."""
    keep_end = w.steps + keep_steps
    decay_end = keep_end + decay_steps
    final_end = decay_end + final_steps

    def lr(t: float) -> float:
        if w.active(t):
            return w(t)
        if t < keep_end:
            return peak
        if t < decay_end:
            return lr_end1 + (peak - lr_end1) * _cosine((t - keep_end) / max(1, decay_steps), num_cycles)
        return lr_end1 if t < final_end else lr_end2
    return lr


def polynomial_warmup(peak: float, w: Warmup, total: int, *, lr_end: float, power: float,
                      decay_steps: int | None) -> Schedule:
    decay = max(1, decay_steps) if decay_steps is not None else max(1, total - w.steps)

    def lr(t: float) -> float:
        if w.active(t):
            return w(t)
        if t > total:
            return lr_end
        remaining = 1.0 - (t - w.steps) / decay
        return (peak - lr_end) * remaining ** power + lr_end
    return lr


def build_schedule(s: Any, total_steps: int) -> Schedule:
    """The `lr_scheduler:` section as a function of the optimizer step (``total_steps`` = training.steps).

    Defaults where the section leaves a value unset (``lr_end``: cosine 0, WSD/polynomial 1e-7;
    ``decay_start_steps``: the end of warm-up; cool-down ``decay_steps``: what is left of
    ``total`` after warm-up, keep and final steps) are the reference's where it has one.
    """
    total = int(total_steps)
    peak = float(s.learning_rate)
    warm = Warmup(steps=_steps(s.warmup_steps, s.warmup_ratio, total), init=float(s.warmup_lr_init), peak=peak)
    kind = s.type
    if kind == "ConstantWarmUpLR":
        return constant_warmup(peak, warm)
    if kind == "LinearWithWarmUpLR":
        return linear_warmup(peak, warm, total)
    if kind == "CosineWithWarmUpLR":
        return cosine_warmup(peak, warm, total, lr_end=float(s.lr_end or 0.0), num_cycles=float(s.num_cycles),
                             decay_steps=_steps(s.decay_steps, s.decay_ratio, total, None))
    if kind == "WarmUpStableDecayLR":
        start = _steps(s.decay_start_steps, s.decay_start_ratio, total, warm.steps)
        return warmup_stable_decay(peak, warm, total, lr_end=1e-7 if s.lr_end is None else float(s.lr_end),
                                   decay_start=start)
    if kind == "ConstantWithCoolDownLR":
        rest = max(1, total - warm.steps - int(s.keep_steps) - int(s.final_steps))
        return constant_with_cooldown(peak, warm, keep_steps=int(s.keep_steps),
                                      decay_steps=_steps(s.decay_steps, s.decay_ratio, total, rest),
                                      num_cycles=float(s.num_cycles), lr_end1=float(s.lr_end1),
                                      final_steps=int(s.final_steps),
                                      lr_end2=float(s.lr_end1 if s.lr_end2 is None else s.lr_end2))
    if kind == "PolynomialWithWarmUpLR":
        return polynomial_warmup(peak, warm, total, lr_end=1e-7 if s.lr_end is None else float(s.lr_end),
                                 power=float(s.power), decay_steps=_steps(s.decay_steps, s.decay_ratio, total, None))
    raise ValueError(f"unknown lr_scheduler.type {kind!r} (validate the config first)")


def lr_change_at_resume(saved: Any, saved_steps: int, saved_step: int, current: Any, steps: int,
                        start_step: int) -> str | None:
    """What a resume does to the LR when the schedule differs from the saved run's (``saved``: its
    ``lr_scheduler`` section, a mapping or the typed section), or None when the curve continues.

    A decaying schedule is a function of ``training.steps``: resuming with a larger target recomputes it,
    and the LR jumps (a cosine run that ended at 3e-4 restarts near the middle of a longer cosine).
    """
    if isinstance(saved, dict):
        import types

        saved = types.SimpleNamespace(**saved)
    try:
        before = build_schedule(saved, saved_steps)(saved_step)
    except (ValueError, TypeError, AttributeError):  # a saved section this version cannot read
        return None
    schedule = build_schedule(current, steps)
    after, next_logged = schedule(start_step), schedule(start_step + 1)
    if abs(after - before) <= 0.01 * max(abs(before), abs(after), 1e-30):
        return None
    what = (f"training.steps {saved_steps} -> {steps} recomputes the {current.type} schedule"
            if steps != saved_steps else "the lr_scheduler section differs from the saved run's")
    return (f"the learning rate jumps at the resume: {what}, so the first resumed update uses {after:.3e} where "
            f"the saved run was at {before:.3e} ({after / before:.2f}x; step {saved_step}'s log line shows lr "
            f"{before:.6e}, step {start_step + 1}'s will show {next_logged:.6e})" if before else
            f"the learning rate jumps at the resume: {what}, from {before:.3e} to {after:.3e}")
