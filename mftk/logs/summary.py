"""One run's numbers: loss first/last/min, step-time percentiles, throughput and MFU.

Rates are averaged after warm-up (the first step includes graph building and is usually much
slower) and weighted by time: TFLOP/s = Σ(throughput·t) / Σt, which is the total work divided
by the total time rather than a plain mean of per-step rates (which over-weights fast steps).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import attrs
import numpy as np

from mftk.logs.table import as_view

MFU_CONVENTION = ("MFU = model TFLOP/s per device as logged (Megatron-LM formula as in MindSpore Transformers: "
                  "GEMMs x3 for fwd+bwd, x2 per FMA, causal attention, recompute not counted), "
                  "time-weighted after warm-up, divided by the peak you passed")


@attrs.define
class Summary:
    """What a user wants to know about a run at a glance; None where the log lacks the field."""

    steps: int
    first_step: int
    last_step: int
    total_steps: int | None
    ranks: list[int]
    primary_rank: int
    warmup_skipped: int
    loss_first: float | None = None
    loss_last: float | None = None
    loss_min: float | None = None
    loss_min_step: int | None = None
    step_time_ms: dict[str, float] = attrs.field(factory=dict)  # p50, p90, p99, mean, max
    throughput_tflops: float | None = None  # per device
    throughput_coarse: bool = False  # logged as %6.2fT values of a rate below 1 TFLOP/s: mostly rounding
    samples_per_s: float | None = None  # global
    tokens_per_s: float | None = None  # global; needs seq_length
    tokens_per_s_per_device: float | None = None
    world_size: int | None = None
    seq_length: int | None = None
    peak_tflops: float | None = None
    mfu: float | None = None
    mfu_convention: str = ""
    notes: list[str] = attrs.field(factory=list)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not len(sorted_values):
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(series: Sequence[dict[str, Any]], *, ranks: list[int], primary_rank: int, skip_warmup: int = 1,
              seq_length: int | None = None, world_size: int | None = None,
              peak_tflops: float | None = None) -> Summary:
    """Summarize one rank's step series (sorted by step, one record per step), reading whole columns."""
    view = as_view(series)
    first, last = view[0], view[len(view) - 1]
    s = Summary(steps=len(view), first_step=first["step"], last_step=last["step"],
                total_steps=last.get("total_steps"), ranks=ranks, primary_rank=primary_rank,
                warmup_skipped=min(skip_warmup, max(len(view) - 1, 0)), seq_length=seq_length,
                world_size=world_size or (len(ranks) if len(ranks) > 1 else None), peak_tflops=peak_tflops)
    loss = view.values("loss")
    finite = np.isfinite(loss)
    if finite.any():
        i_first, i_last = int(np.argmax(finite)), len(finite) - 1 - int(np.argmax(finite[::-1]))
        best = int(np.argmin(np.where(finite, loss, np.inf)))
        s.loss_first, s.loss_last, s.loss_min = float(loss[i_first]), float(loss[i_last]), float(loss[best])
        s.loss_min_step = view[best]["step"]
    del loss, finite
    time = view.native("per_step_time")[s.warmup_skipped:]  # integer milliseconds: no gaps, no copy
    times = np.sort(time if time.dtype.kind == "i" else time[np.isfinite(time)])
    if len(times):
        s.step_time_ms = {f"p{q}": float(percentile(times, q)) for q in (50, 90, 99)}
        s.step_time_ms.update(mean=float(np.sum(times, dtype=np.float64)) / len(times), max=float(times[-1]))
    del times
    with np.errstate(invalid="ignore"):
        timed = np.isfinite(time) & (time > 0)
    _rates(s, _Steady(view, s.warmup_skipped, timed))
    return s


class _Steady:
    """The timed steady-state steps' columns, fetched one at a time (a few columns of millions of steps
    are never all held at once)."""

    def __init__(self, view: Any, skip: int, timed: np.ndarray) -> None:
        self.view, self.skip, self.timed = view, skip, timed
        self.all = bool(timed.all())  # every step timed: the columns as they are, no filtered copies

    def __getitem__(self, key: str) -> np.ndarray:
        column = self.view.values(key)[self.skip:]
        return column if self.all else column[self.timed]


def _rates(s: Summary, col: _Steady) -> None:
    """Rates over the timed steady-state steps; columns are NaN where a step lacks the field."""
    timed = col.timed
    total_ms = float(np.sum(col["per_step_time"]))
    thr = col["throughput"]
    thr_ok = np.isfinite(thr)
    if thr_ok.any():
        thr, t_ms = thr[thr_ok], col["per_step_time"][thr_ok]
        s.throughput_tflops = float(np.dot(thr, t_ms)) / float(np.sum(t_ms))
        del t_ms
        s.throughput_coarse = coarse_throughput(thr)
        if s.throughput_coarse:
            s.notes.append("the step line logs throughput in TFLOP/s with 2 decimals, too coarse below 1 TFLOP/s; "
                           "samples/s and tokens/s are exact, and an mftk run's metrics.jsonl (next to its "
                           "info.log) has the exact FLOP/s")
    del thr
    gbs = col["global_batch_size"]
    gbs_ok = np.isfinite(gbs)
    if gbs_ok.any() and total_ms:
        s.samples_per_s = (float(np.sum(gbs[gbs_ok]))
                           / (float(np.sum(col["per_step_time"][gbs_ok])) / 1e3))
    elif timed.any():
        s.notes.append("no global_batch_size in the log: samples/s not computed")
    tokens = _tokens_per_s(s, col)
    if tokens is not None:
        s.tokens_per_s = tokens
        if s.world_size:
            s.tokens_per_s_per_device = tokens / s.world_size
    elif s.samples_per_s is not None:
        s.notes.append("pass --seq-length to get tokens/s")
    if s.peak_tflops:
        if s.throughput_tflops is None:
            s.notes.append("MFU not computed: the log has no throughput field")
        else:
            s.mfu = s.throughput_tflops / s.peak_tflops
            s.mfu_convention = MFU_CONVENTION
            if s.mfu > 1:
                s.notes.append(f"MFU {s.mfu:.0%} exceeds 100%: check --peak-tflops is the per-device dense peak "
                               "for the dtype used")


def _tokens_per_s(s: Summary, timed: _Steady) -> float | None:
    """Tokens per second (global): from ``--seq-length``, else mftk's per-step ``tokens`` field, else
    Megatron's running ``consumed_tokens``."""
    ms = timed["per_step_time"]
    seconds = float(np.sum(ms)) / 1e3
    if not seconds:
        return None
    if s.seq_length and s.samples_per_s is not None:
        return s.samples_per_s * s.seq_length
    tokens = timed["tokens"]
    if len(tokens) and bool(np.isfinite(tokens).all()):
        return float(np.sum(tokens)) / seconds
    consumed = timed["consumed_tokens"]
    if len(consumed) >= 2 and bool(np.isfinite(consumed).all()):
        return float(consumed[-1] - consumed[0]) / (float(np.sum(ms[1:])) / 1e3)
    return None


def coarse_throughput(values: Sequence[float] | np.ndarray) -> bool:
    """True when logged TFLOP/s values are 2-decimal roundings (the step line's ``%6.2fT``) of a rate
    below 1 TFLOP/s, where the rounding is most of the value."""
    v = np.asarray(values, dtype=np.float64)
    if not len(v):
        return False
    return bool(np.abs(v).max() < 1.0 and np.all(np.abs(v * 100 - np.round(v * 100)) < 1e-6))
