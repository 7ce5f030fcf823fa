"""Summary numbers against hand arithmetic and numpy."""
import math

import numpy as np
import pytest

from mftk.logs.summary import percentile, summarize


def test_percentile_matches_numpy():
    values = sorted([5.0, 1.0, 9.0, 3.5, 7.25, 2.0, 11.0])
    for q in (0, 10, 50, 90, 99, 100):
        assert math.isclose(percentile(values, q), float(np.percentile(values, q)))
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_by_hand():
    series = [
        {"step": 1, "total_steps": 4, "loss": 11.0, "per_step_time": 9000, "throughput": 1.0, "global_batch_size": 8},
        {"step": 2, "total_steps": 4, "loss": 9.0, "per_step_time": 1000, "throughput": 30.0, "global_batch_size": 8},
        {"step": 3, "total_steps": 4, "loss": float("nan"), "per_step_time": 3000, "throughput": 10.0,
         "global_batch_size": 8},
        {"step": 4, "total_steps": 4, "loss": 9.5, "per_step_time": 2000, "throughput": 15.0, "global_batch_size": 8},
    ]
    s = summarize(series, ranks=[0, 1], primary_rank=0, skip_warmup=1, seq_length=1024, peak_tflops=20.0)
    assert (s.steps, s.first_step, s.last_step, s.total_steps) == (4, 1, 4, 4)
    assert (s.loss_first, s.loss_last, s.loss_min, s.loss_min_step) == (11.0, 9.5, 9.0, 2)  # NaN skipped
    # after warm-up: times 1000, 3000, 2000 -> sorted 1000, 2000, 3000
    assert s.step_time_ms == {"p50": 2000, "p90": 2800, "p99": 2980, "mean": 2000, "max": 3000}
    # time-weighted: (30*1 + 10*3 + 15*2) / 6 = 15 TFLOP/s -> 75% of 20
    assert math.isclose(s.throughput_tflops, 15.0) and math.isclose(s.mfu, 0.75)
    assert math.isclose(s.samples_per_s, 24 / 6.0)  # 3 steps x 8 samples in 6 s
    assert math.isclose(s.tokens_per_s, 4.0 * 1024) and s.world_size == 2
    assert math.isclose(s.tokens_per_s_per_device, 2048)
    assert "Megatron" in s.mfu_convention


def test_summary_notes_when_fields_missing():
    series = [{"step": i, "loss": 2.0, "per_step_time": 100} for i in range(1, 4)]
    s = summarize(series, ranks=[0], primary_rank=0, peak_tflops=100.0)
    assert s.mfu is None and s.samples_per_s is None and s.world_size is None
    assert any("no throughput" in n for n in s.notes) and any("global_batch_size" in n for n in s.notes)


def test_mfu_over_100_percent_warns():
    series = [{"step": i, "loss": 2.0, "per_step_time": 100, "throughput": 500.0} for i in range(1, 4)]
    s = summarize(series, ranks=[0], primary_rank=0, peak_tflops=100.0)
    assert s.mfu == 5.0 and any("exceeds 100%" in n for n in s.notes)


def test_tokens_from_the_metrics_tokens_field_and_coarse_throughput():
    """mftk's metrics.jsonl has `tokens` per step: tokens/s needs no --seq-length. A step line's `0.00T`
    (a CPU rate rounded to 0.01 TFLOP/s) is flagged as too coarse, with a note."""
    series = [{"step": s, "loss": 8.0, "per_step_time": 500, "global_batch_size": 8, "tokens": 1024,
               "throughput": 0.0} for s in range(1, 5)]
    s = summarize(series, ranks=[0], primary_rank=0, skip_warmup=1)
    assert math.isclose(s.tokens_per_s, 3 * 1024 / 1.5)  # 3 steps after warm-up, 0.5 s each
    assert s.throughput_coarse and any("too coarse" in n for n in s.notes)
    exact = [dict(r, throughput=0.0041) for r in series]
    assert not summarize(exact, ranks=[0], primary_rank=0).throughput_coarse
