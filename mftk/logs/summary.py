"""One run's numbers: loss first/last/min, step-time percentiles, throughput and MFU.

Rates are averaged after warm-up (the first step includes graph building and is usually much
slower) and weighted by time: TFLOP/s = Σ(throughput·t) / Σt, which is the total work divided
by the total time rather than a plain mean of per-step rates (which over-weights fast steps).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import attrs

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
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def summarize(series: list[dict[str, Any]], *, ranks: list[int], primary_rank: int, skip_warmup: int = 1,
              seq_length: int | None = None, world_size: int | None = None,
              peak_tflops: float | None = None) -> Summary:
    """Summarize one rank's step series (sorted by step, one record per step)."""
    s = Summary(steps=len(series), first_step=series[0]["step"], last_step=series[-1]["step"],
                total_steps=series[-1].get("total_steps"), ranks=ranks, primary_rank=primary_rank,
                warmup_skipped=min(skip_warmup, max(len(series) - 1, 0)), seq_length=seq_length,
                world_size=world_size or (len(ranks) if len(ranks) > 1 else None), peak_tflops=peak_tflops)
    losses = [(r["step"], r["loss"]) for r in series if _finite(r.get("loss"))]
    if losses:
        s.loss_first, s.loss_last = losses[0][1], losses[-1][1]
        s.loss_min_step, s.loss_min = min(losses, key=lambda sl: sl[1])
    steady = series[s.warmup_skipped:]
    times = sorted(float(r["per_step_time"]) for r in steady if _finite(r.get("per_step_time")))
    if times:
        s.step_time_ms = {f"p{q}": percentile(times, q) for q in (50, 90, 99)}
        s.step_time_ms.update(mean=sum(times) / len(times), max=times[-1])
    _rates(s, steady)
    return s


def _rates(s: Summary, steady: list[dict[str, Any]]) -> None:
    timed = [r for r in steady if _finite(r.get("per_step_time")) and r["per_step_time"] > 0]
    total_ms = sum(r["per_step_time"] for r in timed)
    thr = [(r["throughput"], r["per_step_time"]) for r in timed if _finite(r.get("throughput"))]
    if thr:
        s.throughput_tflops = sum(t * ms for t, ms in thr) / sum(ms for _, ms in thr)
        s.throughput_coarse = coarse_throughput([t for t, _ in thr])
        if s.throughput_coarse:
            s.notes.append("the step line logs throughput in TFLOP/s with 2 decimals, too coarse below 1 TFLOP/s; "
                           "samples/s and tokens/s are exact, and an mftk run's metrics.jsonl (next to its "
                           "info.log) has the exact FLOP/s")
    with_gbs = [r for r in timed if _finite(r.get("global_batch_size"))]
    if with_gbs and total_ms:
        s.samples_per_s = sum(r["global_batch_size"] for r in with_gbs) / (sum(r["per_step_time"] for r in with_gbs) / 1e3)
    elif timed:
        s.notes.append("no global_batch_size in the log: samples/s not computed")
    tokens = _tokens_per_s(s, timed)
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


def _tokens_per_s(s: Summary, timed: list[dict[str, Any]]) -> float | None:
    """Tokens per second (global): from ``--seq-length``, else mftk's per-step ``tokens`` field, else
    Megatron's running ``consumed_tokens``."""
    seconds = sum(r["per_step_time"] for r in timed) / 1e3
    if not seconds:
        return None
    if s.seq_length and s.samples_per_s is not None:
        return s.samples_per_s * s.seq_length
    with_tokens = [r for r in timed if _finite(r.get("tokens"))]
    if with_tokens and len(with_tokens) == len(timed):
        return sum(r["tokens"] for r in with_tokens) / seconds
    consumed = [r["consumed_tokens"] for r in timed if _finite(r.get("consumed_tokens"))]
    if len(consumed) >= 2 and len(consumed) == len(timed):
        return (consumed[-1] - consumed[0]) / (sum(r["per_step_time"] for r in timed[1:]) / 1e3)
    return None


def coarse_throughput(values: Sequence[float]) -> bool:
    """True when logged TFLOP/s values are 2-decimal roundings (the step line's ``%6.2fT``) of a rate
    below 1 TFLOP/s, where the rounding is most of the value."""
    if not values:
        return False
    return max(abs(v) for v in values) < 1.0 and all(abs(v * 100 - round(v * 100)) < 1e-6 for v in values)
