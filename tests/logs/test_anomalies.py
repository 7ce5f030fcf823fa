"""Anomalies: each kind found at the right steps and ranks, and nothing on a clean run."""
import math

import numpy as np
import pytest

from mftk.logs.anomalies import Thresholds, _RollingMedian, find_anomalies
from mftk.logs.parse import Run


def run_of(rows, rank=0):
    return Run(name="t", files=[], records=[{"rank": rank, **r} for r in rows])


def clean(n=100, **extra):
    return [{"step": s, "loss": 10.0 - s * 0.01, "grad_norm": 1.0, "per_step_time": 5000 if s == 1 else 700,
             "lr": 1e-4 * min(1.0, s / 10), **extra} for s in range(1, n + 1)]


def kinds(anoms):
    return [(a.kind, a.step, a.field) for a in anoms]


def test_clean_run_has_no_anomalies():
    assert find_anomalies(run_of(clean())) == []  # warm-up lr ramp and slow first step are normal


def test_nan_and_inf_at_the_right_steps():
    rows = clean()
    rows[39]["loss"] = math.nan  # step 40
    rows[59]["grad_norm"] = math.inf  # step 60
    found = find_anomalies(run_of(rows))
    assert kinds(found) == [("nan", 40, "loss"), ("nan", 60, "grad_norm")]
    assert found[1].message == "grad_norm is Inf"


def test_consecutive_nans_collapse_to_one_with_count():
    rows = clean()
    for r in rows[49:54]:
        r["loss"] = math.nan
    (a,) = find_anomalies(run_of(rows))
    assert (a.step, a.last_step, a.count) == (50, 54, 5)


def test_loss_and_grad_spikes_against_rolling_median():
    rows = clean()
    rows[69]["loss"] *= 1.5  # step 70: 1.5x > 1.25x
    rows[79]["loss"] *= 1.2  # step 80: below the default threshold
    rows[84]["grad_norm"] = 9.0  # step 85: 9x > 4x
    found = find_anomalies(run_of(rows))
    assert kinds(found) == [("spike", 70, "loss"), ("grad_spike", 85, "grad_norm")]
    assert math.isclose(found[0].reference, 10.0 - 0.01 * 44.5)  # median of steps 20..69
    assert kinds(find_anomalies(run_of(rows), thresholds=Thresholds(spike=1.1))) [:2] == [
        ("spike", 70, "loss"), ("spike", 80, "loss")]


def test_slow_step_but_not_warmup():
    rows = clean()
    rows[29]["per_step_time"] = 2000  # step 30
    assert kinds(find_anomalies(run_of(rows))) == [("straggler", 30, "per_step_time")]


def test_lr_discontinuity():
    rows = clean()
    for r in rows[49:]:
        r["lr"] = 1e-5  # step decay x0.1 at step 50
    assert kinds(find_anomalies(run_of(rows))) == [("lr_jump", 50, "lr")]


def test_resume_step_goes_back():
    rows = clean(30) + clean(30)[19:]  # steps 1..30, then 20..30 again
    (a,) = find_anomalies(run_of(rows))
    assert (a.kind, a.step, a.reference) == ("resume", 20, 30)


def test_rank_divergence_and_rank_straggler():
    records = [{"rank": rank, **r} for rank in range(4) for r in clean(20)]
    for r in records:
        if r["rank"] == 2 and r["step"] == 12:
            r["loss"] += 0.5
        if r["rank"] == 3 and r["step"] == 15:
            r["per_step_time"] = 2500
    found = find_anomalies(Run(name="t", files=[], records=records))
    assert [(a.kind, a.step, a.ranks) for a in found] == [("divergence", 12, [2]), ("straggler", 15, [3])]


def test_same_nan_on_all_ranks_is_reported_once():
    records = [{"rank": rank, **r} for rank in range(8) for r in clean(20)]
    for r in records:
        if r["step"] == 9:
            r["loss"] = math.nan
    (a,) = find_anomalies(Run(name="t", files=[], records=records))
    assert a.kind == "nan" and a.step == 9 and a.ranks == list(range(8))


def test_rolling_median_matches_sorted_window():
    import random
    rng = random.Random(0)
    rm, values = _RollingMedian(7), []
    for _ in range(200):
        v = rng.random()
        rm.push(v)
        values.append(v)
        window = sorted(values[-7:])
        n = len(window)
        expected = window[n // 2] if n % 2 else (window[n // 2 - 1] + window[n // 2]) / 2
        assert rm.median() == expected


def _cosine(total, *, peak=3e-3, end=0.0, warmup=3):
    """Hand transcription of CosineWithWarmUpLR as the step line logs it (lr after step s = lr(s))."""
    def lr(t):
        if t < warmup:
            return peak * t / warmup
        if t >= total:
            return end
        return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * (t - warmup) / (total - warmup)))
    return lr


def _lr_rows(values, start=1):
    return [{"step": start + i, "loss": 5.0, "lr": v, "per_step_time": 700} for i, v in enumerate(values)]


def test_no_lr_jump_at_the_end_of_a_normal_cosine_run():
    """The tail of a cosine to 0 changes by more than half the (tiny) LR each step: a schedule, not a jump."""
    for total, end in ((40, 0.0), (100, 0.0), (30, 3e-4), (6, 3e-4)):
        lr = _cosine(total, end=end)
        rows = _lr_rows([lr(s) for s in range(1, total + 1)])
        assert [a for a in find_anomalies(run_of(rows)) if a.kind == "lr_jump"] == [], (total, end)


def test_lr_jump_when_a_resume_restarts_a_decayed_cosine():
    """30 steps to 3e-4, then resumed with training.steps=60: back up to 1.69e-3 at step 31."""
    old, new = _cosine(30, end=3e-4), _cosine(60, end=3e-4)
    rows = _lr_rows([old(s) for s in range(1, 31)] + [new(s) for s in range(31, 41)])
    jumps = [a for a in find_anomalies(run_of(rows)) if a.kind == "lr_jump"]
    assert [(a.step, round(a.reference, 7), round(a.value, 7)) for a in jumps] == [
        (31, 3e-4, round(new(31), 7))]


def test_cool_down_to_a_final_lr_is_not_a_jump_but_a_drop_from_the_peak_is():
    rows = _lr_rows([1e-3] * 20 + [1e-5] * 5 + [1e-6] * 5)  # step 26: ConstantWithCoolDown's lr_end1 -> lr_end2
    assert [(a.kind, a.step) for a in find_anomalies(run_of(rows)) if a.kind == "lr_jump"] == [("lr_jump", 21)]


def _over_median_reference(values, ratio, window, min_history):
    """The rule walked one value at a time, median by sorting (an independent reference)."""
    out, kept = [], []
    for i, v in enumerate(values):
        if not math.isfinite(v):
            continue
        last = sorted(kept[-window:])
        if len(last) >= min_history:
            mid = len(last) // 2
            med = last[mid] if len(last) % 2 else (last[mid - 1] + last[mid]) / 2
            if med > 0 and v > ratio * med:
                out.append((i, v, med))
                continue
        kept.append(v)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_spike_rule_with_its_prefilter_equals_the_one_value_at_a_time_walk(seed):
    """The detector skips, by a rolling minimum, the values that cannot be spikes; what it flags must be
    exactly what the plain sequential rule flags: bursts of spikes, NaN holes, a level shift, values <= 0."""
    from mftk.logs.anomalies import _over_median

    rng = np.random.default_rng(seed)
    values = 3 + 0.05 * rng.standard_normal(3000)
    for start in rng.integers(0, 2900, 12):
        values[start:start + rng.integers(1, 15)] *= rng.choice([1.3, 2.0, 5.0])
    values[rng.integers(0, 3000, 30)] = np.nan
    values[2000:2100] = 0.0 if seed % 2 else -1.0
    values[2500:] *= 2.5  # a level shift: flagged until the new level fills the window
    t = Thresholds(window=20, min_history=5)
    got = [(i, v, med) for i, v, med, _ in _over_median(values, 1.25, t)]
    assert got == _over_median_reference(values.tolist(), 1.25, 20, 5) and len(got) > 20
