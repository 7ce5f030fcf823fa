"""Trouble found in a run's records, each with the steps (and ranks) where it happened.

Spikes and slow steps are judged against a rolling median of the previous `window` steps, which
a single outlier cannot drag (unlike a mean) and which follows the normal downward loss trend.
Consecutive steps with the same trouble are reported once, with `last_step` and `count`.
"""
from __future__ import annotations

import bisect
import math
import warnings
from collections import defaultdict
from typing import Iterable

import attrs
import numpy as np

from mftk.logs.parse import Run
from mftk.logs.table import TableView

KINDS = ("nan", "spike", "grad_spike", "straggler", "lr_jump", "divergence", "resume", "skipped", "zero_loss",
         "unread", "stopped")


@attrs.define
class Thresholds:
    """Detection knobs; ratios are against the rolling median of the previous `window` steps."""

    spike: float = 1.25  # loss > 1.25 x median
    grad_spike: float = 4.0  # grad_norm > 4 x median
    straggler: float = 2.0  # per_step_time > 2 x median (in time, or vs. the other ranks)
    lr_jump: float = 0.5  # |Δlr| > 50% of the lr, against both flat and linear extrapolation
    divergence_rtol: float = 1e-3  # ranks' losses at one step differ by more than this (relative)
    window: int = 50
    min_history: int = 5
    skip_warmup: int = 1  # steps excluded from the step-time checks


@attrs.define
class Anomaly:
    kind: str
    step: int
    field: str
    message: str
    ranks: list[int] = attrs.field(factory=list)
    value: float | None = None
    reference: float | None = None
    last_step: int | None = None
    count: int = 1


class _RollingMedian:
    """Median of the last `window` values pushed, kept as a sorted list (O(window) per push)."""

    def __init__(self, window: int) -> None:
        self._window = window
        self._fifo: list[float] = []
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._sorted)

    def median(self) -> float:
        n = len(self._sorted)
        mid = n // 2
        return self._sorted[mid] if n % 2 else (self._sorted[mid - 1] + self._sorted[mid]) / 2

    def push(self, value: float) -> None:
        self._fifo.append(value)
        bisect.insort(self._sorted, value)
        if len(self._fifo) > self._window:
            old = self._fifo.pop(0)
            del self._sorted[bisect.bisect_left(self._sorted, old)]


_BLOCK = 1 << 16  # steps a vectorized check holds at a time: the detectors' memory stays bounded


class _Series:
    """One rank's steps, read a column at a time (NaN where a step lacks the field): the detectors work on
    arrays, never on a dict per step nor a list of every step."""

    def __init__(self, view: TableView) -> None:
        self.view = view
        self.steps = view.native("step").astype(np.int64, copy=False)

    def __len__(self) -> int:
        return len(self.steps)


def find_anomalies(run: Run, *, thresholds: Thresholds | None = None) -> list[Anomaly]:
    """Every anomaly of every kind in `run`, merged over consecutive steps, sorted by step."""
    t = thresholds or Thresholds()
    found: list[Anomaly] = []
    found += _resumes(run)
    series = {rank: _Series(run.series(rank)) for rank in run.ranks}
    for rank, recs in series.items():
        found += _non_finite(rank, recs)
        found += _flagged(rank, recs)
        found += _spikes(rank, recs, "loss", "spike", t.spike, t)
        found += _spikes(rank, recs, "grad_norm", "grad_spike", t.grad_spike, t)
        found += _slow_steps(rank, recs, t)
        found += _lr_jumps(rank, recs, t)
    found += _rank_checks(series, t)
    found += _stops(run)
    return merge(found)


def _flagged(rank: int, recs: _Series) -> list[Anomaly]:
    """What a step line says outright: a skipped step (MF's skip-data `is_skip: [ True]`), a loss of exactly 0
    (no real language-model loss is; a masked-out batch or a broken label pipeline is), and a field whose text
    held no single number (`global_norm: [1 31049]`), left out rather than guessed."""
    out = []
    view = recs.view
    for i in np.nonzero(np.nan_to_num(view.values("is_skip")) != 0)[0].tolist():
        out.append(Anomaly(kind="skipped", step=int(recs.steps[i]), field="is_skip", ranks=[rank], value=None,
                           message="step skipped (is_skip: the global norm was over the skip threshold; "
                                   "its data was not trained on)"))
    for i in np.nonzero(view.values("loss") == 0)[0].tolist():
        out.append(Anomaly(kind="zero_loss", step=int(recs.steps[i]), field="loss", ranks=[rank], value=0.0,
                           message="loss is exactly 0 (check the labels/loss mask of this batch)"))
    texts = view.table.texts
    for i, row in enumerate(view.index.tolist() if texts else []):
        unread = texts.get(row, {}).get("unread")
        if unread:
            names = ", ".join(part.split(":")[0] for part in unread.split("; "))
            out.append(Anomaly(kind="unread", step=int(recs.steps[i]), field=names, ranks=[rank], value=None,
                               message=f"could not read {names}: not one number (e.g. {unread}); left out, "
                                       "not guessed"))
    return out


def _stops(run: Run) -> list[Anomaly]:
    """An exception or `stop training` message after a file's last step line: the run did not end normally."""
    out = []
    for f in run.files:
        if f.stop is None:
            continue
        steps = run.series(f.rank).values("step")
        out.append(Anomaly(kind="stopped", step=int(steps[-1]) if len(steps) else 0, field="log", ranks=[f.rank],
                           value=None, message=f"training stopped after this step: {f.stop}"))
    return out


def _resumes(run: Run) -> list[Anomaly]:
    out: list[Anomaly] = []
    if run.records.constant("rank") is not None and run.records.increasing("step"):
        return out
    ranks, steps = run.records.values("rank"), run.records.values("step")
    for rank in np.unique(ranks).tolist():
        s = steps[ranks == rank].astype(np.int64)
        for j in np.nonzero(s[1:] <= s[:-1])[0].tolist():
            out.append(resume(int(rank), int(s[j]), int(s[j + 1])))
    return out


def resume(rank: int, prev: int, step: int) -> Anomaly:
    """The finding for one point where `rank`'s step went back from `prev` to `step`."""
    return Anomaly(kind="resume", step=step, field="step", ranks=[rank], value=step, reference=prev,
                   message=f"step went back from {prev} to {step}: a resumed run; "
                           f"its lines replace the earlier steps {step}..{prev}")


def _non_finite(rank: int, recs: _Series) -> list[Anomaly]:
    out = []
    view = recs.view
    for key, column in view.table.columns.items():
        if column.kind != "float":
            continue
        values = view.values(key)
        bad = view.numeric(key) & ~np.isfinite(values)
        for i in np.nonzero(bad)[0].tolist():
            word = "NaN" if math.isnan(values[i]) else "Inf"
            out.append(Anomaly(kind="nan", step=int(recs.steps[i]), field=key, ranks=[rank], value=None,
                               message=f"{key} is {word}"))
    return out


def _over_median(values: np.ndarray, ratio: float, t: Thresholds) -> list[tuple[int, float, float, int]]:
    """(index, value, median, history) of each finite value over `ratio` x the median of the previous
    `t.window` finite values that were not flagged themselves (a spike stays out of the baseline)."""
    return MedianWalk(ratio, t).feed(values)


class MedianWalk:
    """`_over_median` fed a block at a time (a log too long to hold: `mftk.logs.stream`), with the same result
    as one call on the blocks joined: it carries the previous `window` values and a walk in progress.

    The rule is sequential, but it cannot flag a value at most `ratio` x the smallest of the previous
    `window` values (the median is at least that): a vectorized rolling minimum finds the few candidates,
    and the exact walk runs only from each candidate until `window` unflagged values have passed (from
    there on, its window is again simply the previous `window` values)."""

    def __init__(self, ratio: float, t: Thresholds) -> None:
        self.ratio, self.t = ratio, t
        self.tail = np.zeros(0)  # the last (at most `window`) finite values fed
        self.seen = 0  # finite values fed so far
        self.window: _RollingMedian | None = None  # the walk in progress at the end of the last block
        self.since, self.flagged = 0, False

    def feed(self, values: np.ndarray) -> list[tuple[int, float, float, int]]:
        """(index in `values`, value, median, history) of each value of this block flagged."""
        finite = np.isfinite(values)
        if finite.all():  # the usual case: no index, no copy
            where, vals = None, values
        else:
            where = np.nonzero(finite)[0]
            vals = values[where]
        del finite
        w, ratio, base, h = self.t.window, self.ratio, self.seen, len(self.tail)
        ext = np.concatenate((self.tail, vals)) if h else vals  # the previous values, then this block's
        n = len(vals)
        candidate = np.ones(n, dtype=bool)
        first = max(w - h, 0)  # the first value of the block with `w` values before it
        if n > first:
            low = np.empty(n - first)
            for b in range(first, n, 1 << 16):  # blocks: a bounded window view
                e = min(n, b + (1 << 16))
                low[b - first:e - first] = np.lib.stride_tricks.sliding_window_view(
                    ext[h + b - w:h + e - 1], w).min(axis=1)
            candidate[first:] = (vals[first:] > ratio * low) | (low <= 0)
        out: list[tuple[int, float, float, int]] = []
        window, since, flagged = self.window, self.since, self.flagged
        k = 0
        while k < n:
            if window is None:
                window, since, flagged = _RollingMedian(w), 0, False
                if base + k >= w:  # the window is the previous `w` values: skip to the next candidate
                    ahead = np.nonzero(candidate[k:])[0]
                    if not len(ahead):
                        window = None
                        break
                    k += int(ahead[0])
                    for v in ext[h + k - w:h + k].tolist():
                        window.push(float(v))
            while k < n and (base + k < w or candidate[k] or (flagged and since < w)):
                value = float(vals[k])
                if len(window) >= self.t.min_history:
                    med = window.median()
                    if med > 0 and value > ratio * med:
                        out.append((k if where is None else int(where[k]), value, med, len(window)))
                        since, flagged, k = 0, True, k + 1
                        continue
                window.push(value)
                since, k = since + 1, k + 1
            if k < n:  # the walk ended inside the block
                window = None
        self.window, self.since, self.flagged = window, since, flagged
        self.tail = np.array(ext[-w:], dtype=np.float64) if w else np.zeros(0)
        self.seen = base + n
        return out


def _spikes(rank: int, recs: _Series, key: str, kind: str, ratio: float, t: Thresholds,
            walk: MedianWalk | None = None) -> list[Anomaly]:
    hits = (walk or MedianWalk(ratio, t)).feed(recs.view.values(key))
    return [Anomaly(kind=kind, step=int(recs.steps[i]), field=key, ranks=[rank], value=value, reference=med,
                    message=f"{key} {value:.4g} is {value / med:.2f}x the median {med:.4g} "
                            f"of the previous {history} steps")
            for i, value, med, history in hits]


def _slow_steps(rank: int, recs: _Series, t: Thresholds, walk: MedianWalk | None = None,
                skip: int | None = None) -> list[Anomaly]:
    """Steps far slower than the previous ones; `skip` steps of `recs` left out (default: the warm-up)."""
    skip = t.skip_warmup if skip is None else skip
    times = recs.view.native("per_step_time")[skip:]
    return [Anomaly(kind="straggler", step=int(recs.steps[skip + i]), field="per_step_time", ranks=[rank],
                    value=value, reference=med,
                    message=f"step took {value:g} ms, {value / med:.1f}x the median {med:g} ms")
            for i, value, med, _ in (walk or MedianWalk(t.straggler, t)).feed(times)]


def _lr_jumps(rank: int, recs: _Series, t: Thresholds) -> list[Anomaly]:
    return lr_jumps_in(rank, recs.steps, recs.view.values("lr"), t)


def lr_jumps_in(rank: int, steps: np.ndarray, lr: np.ndarray, t: Thresholds, start: int = 2) -> list[Anomaly]:
    """Flag LR changes that no schedule explains: neither a flat nor a linear continuation of the last two
    steps predicts them, and they are either large against the run's LR (the largest of the last
    ``window`` steps) or turn against the trend (up during a decay or from a plateau, down during a
    warm-up) by a large fraction of the current LR. Warm-up ends, cosine tails that approach 0 and cool-down steps to a final
    LR are what schedules do; a resume with a larger ``training.steps`` (3e-4 back up to 1.6e-3) is not.
    Only steps from index `start` are judged (those before it are the previous block's, for context).
    """
    out = []
    for b in range(max(start, 2), len(lr), _BLOCK):  # a block at a time: a few temporary arrays of one block each
        i = np.arange(b, min(b + _BLOCK, len(lr)))
        la, lb, lc = lr[i - 2], lr[i - 1], lr[i]
        with np.errstate(invalid="ignore"):
            local = np.maximum(np.abs(lb), np.abs(lc))
            now = lc - lb
            unexplained = ((np.abs(now) > t.lr_jump * local) & (np.abs(lc - (2 * lb - la)) > t.lr_jump * local)
                           & (local > 0) & np.isfinite(la))  # NaN compares False
        unexplained &= (steps[i] == steps[i - 1] + 1) & (steps[i - 1] == steps[i - 2] + 1)
        for k in np.nonzero(unexplained)[0].tolist():
            out += _lr_jump_at(rank, steps, lr, int(i[k]), t)
    return out


def _lr_jump_at(rank: int, steps: np.ndarray, lr: np.ndarray, i: int, t: Thresholds) -> list[Anomaly]:
    """The rest of the lr-jump rule at an unexplained step `i`: large, or against the trend."""
    la, lb, lc = float(lr[i - 2]), float(lr[i - 1]), float(lr[i])
    before, now = lb - la, lc - lb
    large = abs(now) > t.lr_jump * float(np.nanmax(np.abs(lr[max(i - t.window + 1, 0):i + 1])))
    against_trend = before * now < 0 or (before == 0 and now > 0)  # a turn, or up from a plateau
    if not (large or against_trend):
        return []
    return [Anomaly(kind="lr_jump", step=int(steps[i]), field="lr", ranks=[rank], value=lc, reference=lb,
                    message=f"lr jumped from {lb:.3e} to {lc:.3e}")]


def _rank_checks(series: dict[int, _Series], t: Thresholds) -> list[Anomaly]:
    """Across ranks at one step: losses that disagree (DP divergence) and one rank far slower.

    The ranks' values are laid side by side, a block of steps at a time (a steps x ranks matrix, NaN
    where a rank lacks the step): the per-step medians are NumPy's, the messages are built only for the
    steps flagged."""
    if len(series) < 2:
        return []
    ranks = list(series)
    steps = np.unique(np.concatenate([recs.steps for recs in series.values()]))
    out: list[Anomaly] = []
    for key in ("loss", "per_step_time"):
        columns = []
        for recs in series.values():
            column = np.full(len(steps), np.nan)
            column[np.searchsorted(steps, recs.steps)] = recs.view.values(key)
            columns.append(column)
        for b in range(0, len(steps), _BLOCK):
            block = np.column_stack([c[b:b + _BLOCK] for c in columns])
            block[~np.isfinite(block)] = np.nan
            block_steps = steps[b:b + _BLOCK]
            if key == "loss":
                out += _diverging(block, block_steps, ranks, t)
            else:
                out += _slower_ranks(block, block_steps, ranks, t)
    return out


def _diverging(block: np.ndarray, steps: np.ndarray, ranks: list[int], t: Thresholds) -> list[Anomaly]:
    """Steps where one rank's loss (the farthest from the median) differs by more than the tolerance."""
    out = []
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: steps one rank alone logged
        med = np.nanmedian(block, axis=1)
        dev = np.abs(block - med[:, None])
        several = np.sum(np.isfinite(block), axis=1) >= 2
        worst_dev = np.nanmax(np.where(np.isfinite(dev), dev, -1.0), axis=1)
        flagged = several & (worst_dev > t.divergence_rtol * np.maximum(1.0, np.abs(med)))
    for i in np.nonzero(flagged)[0].tolist():
        row = block[i]
        j = int(np.nanargmax(np.where(np.isfinite(row), np.abs(row - med[i]), -1.0)))
        others = [float(v) for k, v in enumerate(row.tolist()) if k != j and math.isfinite(v)]
        out.append(Anomaly(kind="divergence", step=int(steps[i]), field="loss", ranks=[ranks[j]],
                           value=float(row[j]), reference=float(med[i]),
                           message=f"rank {ranks[j]} loss {row[j]:.6f} differs from the other ranks' "
                                   f"{_median(others):.6f} (data-parallel ranks should agree)"))
    return out


def _slower_ranks(block: np.ndarray, steps: np.ndarray, ranks: list[int], t: Thresholds) -> list[Anomaly]:
    """(step, rank) where a rank took more than `straggler` x the median of the other ranks' times."""
    out = []
    several = np.sum(np.isfinite(block), axis=1) >= 2
    for j, rank in enumerate(ranks):
        others = np.delete(block, j, axis=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(others, axis=1)
        with np.errstate(invalid="ignore"):
            flagged = several & (med > 0) & (block[:, j] > t.straggler * med)
        for i in np.nonzero(flagged)[0].tolist():
            value, ref = float(block[i, j]), float(med[i])
            out.append(Anomaly(kind="straggler", step=int(steps[i]), field="per_step_time", ranks=[rank],
                               value=value, reference=ref, message=f"rank {rank} took {value:g} ms, "
                                                                   f"{value / ref:.1f}x the other ranks' {ref:g} ms"))
    return out


def _median(values: list[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def merge(found: Iterable[Anomaly]) -> list[Anomaly]:
    """Collapse consecutive steps per (kind, field, rank); then join ranks with the same finding."""
    groups: dict[tuple, list[Anomaly]] = defaultdict(list)
    for a in found:
        groups[(a.kind, a.field, a.message if a.kind in ("resume", "stopped") else "",
                tuple(a.ranks))].append(a)
    runs: list[Anomaly] = []
    for items in groups.values():
        items.sort(key=lambda a: a.step)
        current = None
        for a in items:
            if current is not None and a.kind not in ("resume", "stopped") and a.step == (current.last_step or current.step) + 1:
                current.last_step, current.count = a.step, current.count + 1
                continue
            current = attrs.evolve(a)
            runs.append(current)
    joined: dict[tuple, Anomaly] = {}
    for a in runs:
        key = (a.kind, a.field, a.step, a.last_step, a.count,
               a.message if a.kind in ("nan", "resume", "stopped") else "")
        if key in joined:
            joined[key].ranks = sorted(set(joined[key].ranks) | set(a.ranks))
        else:
            joined[key] = a
    out = sorted(joined.values(), key=lambda a: (a.step, KINDS.index(a.kind), a.ranks))
    for a in out:
        if a.count > 1:
            a.message += f" (steps {a.step}..{a.last_step}, {a.count} steps)"
    return out
