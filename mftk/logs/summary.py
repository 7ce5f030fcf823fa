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


@attrs.define
class RateSums:
    """The sums the rates are made of, over the timed steady-state steps: one pass over whole columns
    (`of`), or a segment at a time added up (`add`, `mftk.logs.stream`) for a log too long to hold."""

    timed: bool = False  # any timed steady step
    total_ms: float = 0.0
    thr_seen: bool = False
    thr_t: float = 0.0  # sum of throughput x step time, where throughput is logged
    thr_ms: float = 0.0  # sum of step time there
    thr_max: float = 0.0  # largest |throughput|
    thr_rounded: bool = True  # every throughput a 2-decimal rounding
    gbs_seen: bool = False
    gbs: float = 0.0
    gbs_ms: float = 0.0
    ms_after_first: float = 0.0  # the step times but the first's
    tokens_all: bool = True
    tokens_n: int = 0
    tokens: float = 0.0
    consumed_all: bool = True
    consumed_n: int = 0
    consumed_first: float = 0.0
    consumed_last: float = 0.0

    @classmethod
    def of(cls, col: _Steady, first: bool = True) -> RateSums:
        """The sums over `col`'s steps (`first`: they start the series, so the first step's time is left
        out of `ms_after_first`)."""
        r = cls(timed=bool(col.timed.any()))
        ms = col["per_step_time"]
        r.total_ms = float(np.sum(ms))
        r.ms_after_first = float(np.sum(ms[1:] if first else ms))
        thr = col["throughput"]
        thr_ok = np.isfinite(thr)
        if thr_ok.any():
            thr, t_ms = thr[thr_ok], ms[thr_ok]
            r.thr_seen, r.thr_t, r.thr_ms = True, float(np.dot(thr, t_ms)), float(np.sum(t_ms))
            r.thr_max = float(np.abs(thr).max())
            r.thr_rounded = bool(np.all(np.abs(thr * 100 - np.round(thr * 100)) < 1e-6))
        gbs = col["global_batch_size"]
        gbs_ok = np.isfinite(gbs)
        if gbs_ok.any():
            r.gbs_seen, r.gbs, r.gbs_ms = True, float(np.sum(gbs[gbs_ok])), float(np.sum(ms[gbs_ok]))
        tokens = col["tokens"]
        r.tokens_n, r.tokens_all = len(tokens), bool(np.isfinite(tokens).all())
        r.tokens = float(np.sum(tokens)) if r.tokens_all else 0.0
        consumed = col["consumed_tokens"]
        r.consumed_n, r.consumed_all = len(consumed), bool(np.isfinite(consumed).all())
        if len(consumed) and r.consumed_all:
            r.consumed_first, r.consumed_last = float(consumed[0]), float(consumed[-1])
        return r

    def add(self, o: RateSums) -> None:
        """Add the sums of the steps that follow (the next segment)."""
        if o.consumed_n:
            self.consumed_first = self.consumed_first if self.consumed_n else o.consumed_first
            self.consumed_last = o.consumed_last
        if o.thr_seen:
            self.thr_max = max(self.thr_max, o.thr_max) if self.thr_seen else o.thr_max
        self.timed |= o.timed
        self.thr_seen |= o.thr_seen
        self.gbs_seen |= o.gbs_seen
        self.thr_rounded &= o.thr_rounded
        self.tokens_all &= o.tokens_all
        self.consumed_all &= o.consumed_all
        for name in ("total_ms", "thr_t", "thr_ms", "gbs", "gbs_ms", "ms_after_first", "tokens", "tokens_n",
                     "consumed_n"):
            setattr(self, name, getattr(self, name) + getattr(o, name))


def _rates(s: Summary, col: _Steady) -> None:
    """Rates over the timed steady-state steps; columns are NaN where a step lacks the field."""
    rates_from(s, RateSums.of(col))


def rates_from(s: Summary, r: RateSums) -> None:
    """Fill `s`'s rates, MFU and notes from the sums over its timed steady-state steps."""
    if r.thr_seen:
        s.throughput_tflops = r.thr_t / r.thr_ms
        s.throughput_coarse = r.thr_max < 1.0 and r.thr_rounded
        if s.throughput_coarse:
            s.notes.append("the step line logs throughput in TFLOP/s with 2 decimals, too coarse below 1 TFLOP/s; "
                           "samples/s and tokens/s are exact, and an mftk run's metrics.jsonl (next to its "
                           "info.log) has the exact FLOP/s")
    if r.gbs_seen and r.total_ms:
        s.samples_per_s = r.gbs / (r.gbs_ms / 1e3)
    elif r.timed:
        s.notes.append("no global_batch_size in the log: samples/s not computed")
    tokens = _tokens_per_s(s, r)
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


def _tokens_per_s(s: Summary, r: RateSums) -> float | None:
    """Tokens per second (global): from ``--seq-length``, else mftk's per-step ``tokens`` field, else
    Megatron's running ``consumed_tokens``."""
    seconds = r.total_ms / 1e3
    if not seconds:
        return None
    if s.seq_length and s.samples_per_s is not None:
        return s.samples_per_s * s.seq_length
    if r.tokens_n and r.tokens_all:
        return r.tokens / seconds
    if r.consumed_n >= 2 and r.consumed_all:
        return (r.consumed_last - r.consumed_first) / (r.ms_after_first / 1e3)
    return None


def coarse_throughput(values: Sequence[float] | np.ndarray) -> bool:
    """True when logged TFLOP/s values are 2-decimal roundings (the step line's ``%6.2fT``) of a rate
    below 1 TFLOP/s, where the rounding is most of the value."""
    v = np.asarray(values, dtype=np.float64)
    if not len(v):
        return False
    return bool(np.abs(v).max() < 1.0 and np.all(np.abs(v * 100 - np.round(v * 100)) < 1e-6))
