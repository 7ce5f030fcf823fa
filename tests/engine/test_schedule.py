"""LR schedules against hand-computed values and the reference's own docstring examples.

The docstring examples (lr=0.005, warmup 10, total 20) come from MindSpore Transformers'
`core/lr/lr_schedule.py`; the rest are computed by hand from the formulas in the reference
(§1.3 lr_scheduler table), written out in each test.
"""
import math

import pytest

from mftk.config.sections import LrSchedulerConfig
from mftk.engine.schedule import build_schedule


def sched(total=20, **kw):
    return build_schedule(LrSchedulerConfig(**kw), total)


def test_reference_docstring_examples():
    base = dict(learning_rate=0.005, warmup_steps=10)
    assert sched(type="ConstantWarmUpLR", **base)(1) == pytest.approx(0.0005)
    assert sched(type="ConstantWarmUpLR", **base)(15) == pytest.approx(0.005)
    assert sched(type="LinearWithWarmUpLR", **base)(1) == pytest.approx(0.0005)
    assert sched(type="LinearWithWarmUpLR", **base)(15) == pytest.approx(0.0025)
    assert sched(type="CosineWithWarmUpLR", **base)(15) == pytest.approx(0.0024999997, rel=1e-6)
    poly = sched(type="PolynomialWithWarmUpLR", lr_end=1e-7, **base)
    assert poly(1) == pytest.approx(0.0005)
    assert poly(15) == pytest.approx(0.0025000498, rel=1e-6)


def test_warmup_from_init_and_ratio():
    s = sched(total=100, type="ConstantWarmUpLR", learning_rate=1.0, warmup_ratio=0.1, warmup_lr_init=0.2)
    # warmup = int(100*0.1) = 10; lr(t) = 0.2 + 0.8*t/10
    assert [s(t) for t in (0, 5, 9, 10, 50)] == pytest.approx([0.2, 0.6, 0.92, 1.0, 1.0])


def test_zero_warmup_starts_at_peak():
    s = sched(total=10, type="LinearWithWarmUpLR", learning_rate=1.0, warmup_steps=0)
    # (total - t)/max(1, total - 0)
    assert [s(t) for t in (0, 1, 5, 10, 12)] == pytest.approx([1.0, 0.9, 0.5, 0.0, 0.0])


def test_cosine_decay_and_lr_end():
    s = sched(total=12, type="CosineWithWarmUpLR", learning_rate=1.0, warmup_steps=2, lr_end=0.1)
    # after warmup: 0.1 + 0.9*0.5*(1+cos(pi*(t-2)/10)); t >= decay_steps(=total) -> lr_end
    for t in (2, 4, 7, 11):
        assert s(t) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t - 2) / 10)))
    assert s(12) == 0.1 and s(100) == 0.1
    assert s(1) == pytest.approx(0.5)


def test_cosine_decay_steps_cuts_early():
    s = sched(total=12, type="CosineWithWarmUpLR", learning_rate=1.0, warmup_steps=0, decay_steps=6, lr_end=0.0)
    assert s(5) == pytest.approx(0.5 * (1 + math.cos(math.pi * 5 / 12)))
    assert s(6) == 0.0


def test_warmup_stable_decay():
    s = sched(total=20, type="WarmUpStableDecayLR", learning_rate=1.0, warmup_steps=4, decay_start_steps=10,
              lr_end=0.0)
    # warmup to 4, hold to 10, then linear over 20-10=10 steps
    assert [s(t) for t in (2, 4, 9, 10, 15, 20, 25)] == pytest.approx([0.5, 1, 1, 1, 0.5, 0.0, 0.0])


def test_constant_with_cooldown():
    s = sched(total=30, type="ConstantWithCoolDownLR", learning_rate=1.0, warmup_steps=2, keep_steps=3,
              decay_steps=10, lr_end1=0.1, final_steps=5, lr_end2=0.01)
    assert s(1) == pytest.approx(0.5)
    assert s(2) == 1.0 and s(4) == 1.0                       # keep: [2, 5)
    assert s(10) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 10)))  # cosine over [5, 15)
    assert s(15) == 0.1 and s(19) == 0.1                     # final: [15, 20)
    assert s(20) == 0.01 and s(29) == 0.01


def test_polynomial_power():
    s = sched(total=12, type="PolynomialWithWarmUpLR", learning_rate=1.0, warmup_steps=2, lr_end=0.0, power=2.0)
    # (1 - (t-2)/10)^2
    assert [s(t) for t in (2, 7, 12)] == pytest.approx([1.0, 0.25, 0.0])
    assert s(13) == 0.0


def test_unknown_type_is_refused():
    with pytest.raises(ValueError):
        sched(type="Nope")
