"""Trouble found in a run's records, each with the steps (and ranks) where it happened.

Spikes and slow steps are judged against a rolling median of the previous `window` steps, which
a single outlier cannot drag (unlike a mean) and which follows the normal downward loss trend.
Consecutive steps with the same trouble are reported once, with `last_step` and `count`: each detector
collapses its flagged steps into runs as it finds them (NumPy), so a run of a million NaN steps is one object,
and `Findings` joins the runs of a log read a block of steps at a time, listing at most `MAX_LISTED` findings
per kind (the earliest) and counting the rest (`Findings.omitted`): memory bounded whatever the log's length.
"""
from __future__ import annotations

import bisect
import math
import warnings
from array import array
from typing import Iterable, Iterator

import attrs
import numpy as np

from mftk.logs.parse import Run
from mftk.logs.table import TableView

KINDS = ("nan", "spike", "grad_spike", "straggler", "lr_jump", "divergence", "resume", "skipped", "zero_loss",
         "unread", "stopped")
_ONCE = ("resume", "stopped")  # kinds never collapsed over steps (each is one event)
MAX_LISTED = 1000  # findings listed per kind (the earliest by step); the rest are counted (`Findings.omitted`)


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
    """Every anomaly of every kind in `run`, merged over consecutive steps, sorted by step; at most `MAX_LISTED`
    per kind (`detect(run).omitted()` counts the rest)."""
    return detect(run, thresholds=thresholds).result()


def detect(run: Run, *, thresholds: Thresholds | None = None) -> Findings:
    """`run`'s findings, collected (`Findings`): its `result()` is `find_anomalies`, its `omitted()` what the
    list leaves out."""
    t = thresholds or Thresholds()
    found: list[Anomaly] = []
    found += _resumes(run)
    series = {rank: _Series(run.series(rank)) for rank in run.ranks}
    for rank, recs in series.items():
        found += rank_findings(rank, recs, t)
    found += _rank_checks(series, t)
    found += _stops(run)
    findings = Findings()
    findings.add(found)
    return findings


def rank_findings(rank: int, recs: _Series, t: Thresholds) -> list[Anomaly]:
    """The one-rank detectors on a whole series, each run of flagged steps one finding (not merged): for a
    series held in memory beside a streamed one, to hand to `Findings` a block at a time (split by `step`)."""
    return (_non_finite(rank, recs) + _flagged(rank, recs) + _spikes(rank, recs, "loss", "spike", t.spike, t)
            + _spikes(rank, recs, "grad_norm", "grad_spike", t.grad_spike, t) + _slow_steps(rank, recs, t)
            + _lr_jumps(rank, recs, t))


def _runs(steps: np.ndarray, same: np.ndarray | None = None) -> Iterator[tuple[int, int | None, int]]:
    """(position of its first step, its last step or None for one step, its count) of each run of `steps` (a
    detector's flagged steps, in order) going up by one, a run also ending where `same` (a label per flagged step:
    a rank, a field) changes: `merge`'s collapse done where the steps are found, so a million flagged steps in a
    row make one finding, not a million."""
    n = len(steps)
    if not n:
        return
    cut = np.diff(steps) != 1
    if same is not None:
        cut |= same[1:] != same[:-1]
    starts = np.concatenate(([0], np.nonzero(cut)[0] + 1))
    counts = np.diff(np.append(starts, n))
    for p, count in zip(starts.tolist(), counts.tolist()):
        yield p, (int(steps[p + count - 1]) if count > 1 else None), count


def _flagged(rank: int, recs: _Series) -> list[Anomaly]:
    """What a step line says outright: a skipped step (MF's skip-data `is_skip: [ True]`), a loss of exactly 0
    (no real language-model loss is; a masked-out batch or a broken label pipeline is), and a field whose text
    held no single number (`global_norm: [1 31049]`), left out rather than guessed."""
    out = []
    view, steps = recs.view, recs.steps
    skipped = np.nonzero(np.nan_to_num(view.values("is_skip")) != 0)[0]
    for p, last, count in _runs(steps[skipped]):
        out.append(Anomaly(kind="skipped", step=int(steps[skipped[p]]), field="is_skip", ranks=[rank], value=None,
                           message="step skipped (is_skip: the global norm was over the skip threshold; "
                                   "its data was not trained on)", last_step=last, count=count))
    zero = np.nonzero(view.values("loss") == 0)[0]
    for p, last, count in _runs(steps[zero]):
        out.append(Anomaly(kind="zero_loss", step=int(steps[zero[p]]), field="loss", ranks=[rank], value=0.0,
                           message="loss is exactly 0 (check the labels/loss mask of this batch)",
                           last_step=last, count=count))
    texts = view.table.texts
    hits = [(i, unread) for i, row in enumerate(view.index.tolist() if texts else [])
            if (unread := texts.get(row, {}).get("unread"))]
    if hits:
        at = np.array([i for i, _ in hits])
        names = [", ".join(part.split(":")[0] for part in unread.split("; ")) for _, unread in hits]
        for p, last, count in _runs(steps[at], same=np.array(names, dtype=object)):
            out.append(Anomaly(kind="unread", step=int(steps[at[p]]), field=names[p], ranks=[rank], value=None,
                               message=f"could not read {names[p]}: not one number (e.g. {hits[p][1]}); left out, "
                                       "not guessed", last_step=last, count=count))
    return out


def _stops(run: Run, last_steps: dict[int, int] | None = None) -> list[Anomaly]:
    """An exception or `stop training` message after a file's last step line: the run did not end normally.
    `last_steps`: each rank's last step where the rows held are not all of it (a spilled run)."""
    out = []
    for f in run.files:
        if f.stop is None:
            continue
        steps = run.series(f.rank).values("step")
        last = (last_steps or {}).get(f.rank, int(steps[-1]) if len(steps) else 0)
        out.append(Anomaly(kind="stopped", step=last, field="log", ranks=[f.rank],
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
    """NaN/Inf in any float field; a run of them is one finding, named by its first step's word."""
    out = []
    view, steps = recs.view, recs.steps
    for key, column in view.table.columns.items():
        if column.kind != "float":
            continue
        values = view.values(key)
        bad = np.nonzero(view.numeric(key) & ~np.isfinite(values))[0]
        for p, last, count in _runs(steps[bad]):
            word = "NaN" if math.isnan(values[bad[p]]) else "Inf"
            out.append(Anomaly(kind="nan", step=int(steps[bad[p]]), field=key, ranks=[rank], value=None,
                               message=f"{key} is {word}", last_step=last, count=count))
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
        return list(zip(*(a.tolist() for a in self.hits(values))))

    def hits(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`feed`'s flagged values as four arrays (index, value, median, history): 32 bytes a flagged step, not
        a tuple of Python objects each (a loss that stays high flags every step)."""
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
        at, hit, meds, seen = array("q"), array("d"), array("d"), array("q")
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
                        at.append(k)
                        hit.append(value)
                        meds.append(med)
                        seen.append(len(window))
                        since, flagged, k = 0, True, k + 1
                        continue
                window.push(value)
                since, k = since + 1, k + 1
            if k < n:  # the walk ended inside the block
                window = None
        self.window, self.since, self.flagged = window, since, flagged
        self.tail = np.array(ext[-w:], dtype=np.float64) if w else np.zeros(0)
        self.seen = base + n
        index = np.array(at, dtype=np.int64)
        return (index if where is None else where[index], np.array(hit, dtype=np.float64),
                np.array(meds, dtype=np.float64), np.array(seen, dtype=np.int64))


def _spikes(rank: int, recs: _Series, key: str, kind: str, ratio: float, t: Thresholds,
            walk: MedianWalk | None = None) -> list[Anomaly]:
    at, values, meds, seen = (walk or MedianWalk(ratio, t)).hits(recs.view.values(key))
    out = []
    for p, last, count in _runs(recs.steps[at]):
        value, med = float(values[p]), float(meds[p])
        out.append(Anomaly(kind=kind, step=int(recs.steps[at[p]]), field=key, ranks=[rank], value=value,
                           reference=med, message=f"{key} {value:.4g} is {value / med:.2f}x the median {med:.4g} "
                                                  f"of the previous {int(seen[p])} steps", last_step=last, count=count))
    return out


def _slow_steps(rank: int, recs: _Series, t: Thresholds, walk: MedianWalk | None = None,
                skip: int | None = None) -> list[Anomaly]:
    """Steps far slower than the previous ones; `skip` steps of `recs` left out (default: the warm-up)."""
    skip = t.skip_warmup if skip is None else skip
    at, values, meds, _ = (walk or MedianWalk(t.straggler, t)).hits(recs.view.native("per_step_time")[skip:])
    steps = recs.steps[skip:]
    out = []
    for p, last, count in _runs(steps[at]):
        value, med = float(values[p]), float(meds[p])
        out.append(Anomaly(kind="straggler", step=int(steps[at[p]]), field="per_step_time", ranks=[rank],
                           value=value, reference=med, last_step=last, count=count,
                           message=f"step took {value:g} ms, {value / med:.1f}x the median {med:g} ms"))
    return out


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
        jumps = np.array([j for j in i[unexplained].tolist() if _lr_jump_at(lr, j, t)], dtype=np.int64)
        for p, last, count in _runs(steps[jumps]):
            j = int(jumps[p])
            lb, lc = float(lr[j - 1]), float(lr[j])
            out.append(Anomaly(kind="lr_jump", step=int(steps[j]), field="lr", ranks=[rank], value=lc, reference=lb,
                               message=f"lr jumped from {lb:.3e} to {lc:.3e}", last_step=last, count=count))
    return out


def _lr_jump_at(lr: np.ndarray, i: int, t: Thresholds) -> bool:
    """The rest of the lr-jump rule at an unexplained step `i`: large, or against the trend."""
    la, lb, lc = float(lr[i - 2]), float(lr[i - 1]), float(lr[i])
    before, now = lb - la, lc - lb
    large = abs(now) > t.lr_jump * float(np.nanmax(np.abs(lr[max(i - t.window + 1, 0):i + 1])))
    against_trend = before * now < 0 or (before == 0 and now > 0)  # a turn, or up from a plateau
    return large or against_trend


def _rank_checks(series: dict[int, _Series], t: Thresholds) -> list[Anomaly]:
    """Across ranks at one step: losses that disagree (DP divergence) and one rank far slower.

    The ranks' values are laid side by side, a block of steps at a time (a steps x ranks matrix, NaN
    where a rank lacks the step): the per-step medians are NumPy's, the messages are built only for the
    first step of each run of steps flagged."""
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
    rows = np.nonzero(flagged)[0]
    worst = np.argmax(np.where(np.isfinite(dev[rows]), dev[rows], -1.0), axis=1)  # the first of equals
    for p, last, count in _runs(steps[rows], same=worst):
        i, j = int(rows[p]), int(worst[p])
        row = block[i]
        others = [float(v) for k, v in enumerate(row.tolist()) if k != j and math.isfinite(v)]
        out.append(Anomaly(kind="divergence", step=int(steps[i]), field="loss", ranks=[ranks[j]],
                           value=float(row[j]), reference=float(med[i]), last_step=last, count=count,
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
            rows = np.nonzero(several & (med > 0) & (block[:, j] > t.straggler * med))[0]
        for p, last, count in _runs(steps[rows]):
            i = int(rows[p])
            value, ref = float(block[i, j]), float(med[i])
            out.append(Anomaly(kind="straggler", step=int(steps[i]), field="per_step_time", ranks=[rank],
                               value=value, reference=ref, last_step=last, count=count,
                               message=f"rank {rank} took {value:g} ms, {value / ref:.1f}x the other ranks' {ref:g} ms"))
    return out


def _median(values: list[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def merge(found: Iterable[Anomaly]) -> list[Anomaly]:
    """Collapse consecutive steps per (kind, field, rank); then join ranks with the same finding (no cap)."""
    findings = Findings(cap=False)
    findings.add([_copy(a) for a in found])  # `add` takes its items over; the caller's stay as they are
    return findings.result()


@attrs.define
class Omitted:
    """The findings of one kind that `Findings` counted but did not list (those after the first `MAX_LISTED`)."""

    kind: str
    count: int
    first_step: int  # the first step of the earliest left out
    last_step: int  # the last step of the latest left out

    def note(self) -> str:
        """One line for the report, e.g. `12,345 more spike findings (steps 10..7,000,000) not listed`."""
        steps = (f"step {self.first_step:,}" if self.first_step == self.last_step
                 else f"steps {self.first_step:,}..{self.last_step:,}")
        return f"{self.count:,} more {self.kind} finding{'s' if self.count != 1 else ''} ({steps}) not listed"


class Findings:
    """`merge` fed a block of steps at a time, in bounded memory, listing at most `MAX_LISTED` per kind.

    `add` takes the findings that start in one block of steps (every detector, every rank; each block's steps
    after the previous block's; resume/stopped findings may come at any time). A run still open at the block's
    end joins its continuation in the next block; a run that has ended is joined with the other ranks' identical runs
    (`merge`'s rules) and listed if among the first `MAX_LISTED` of its kind by step, else counted (`omitted`).
    So it holds at most `MAX_LISTED` findings per kind, one open run per (kind, field, rank) and one block's new
    findings, whatever the log's length; `result()` is `merge` of everything added, cut to the first
    `MAX_LISTED` of each kind."""

    def __init__(self, *, cap: bool = True) -> None:
        self.limit = MAX_LISTED if cap else None
        self._seq: dict[tuple, int] = {}  # each group's first-seen order: merge's order among equal sort keys
        self._open: dict[tuple, Anomaly] = {}  # per group, its latest run (it may go on in the next block)
        self._ended: list[Anomaly] = []  # runs ended, not yet joined across ranks
        self._once: list[Anomaly] = []  # resume/stopped: never collapsed
        self._upto: int | None = None  # every finding starting at a step up to here has been added
        self._kinds: dict[str, _Kept] = {}
        self._done = False

    def add(self, items: Iterable[Anomaly], *, upto: int | None = None) -> None:
        """The findings of the next block of steps (each a run: `step`..`last_step`, `count` steps; a run may
        reach past the block). Every finding that starts in the block's steps must be in this call, and start
        after the steps of every earlier call (else ValueError); resume/stopped findings may come at any time.
        `upto`: the block's last step, when known (a run ending before it is settled at once).
        The items are taken over, not copied (a run is extended, ranks are joined in place)."""
        if self._done:
            raise RuntimeError("Findings.add after result(): a Findings collects one log")
        fresh = []
        for a in items:
            self._seq.setdefault(_group(a), len(self._seq))
            (self._once if a.kind in _ONCE else fresh).append(a)
        if fresh and self._upto is not None and (first := min(a.step for a in fresh)) <= self._upto:
            raise ValueError(f"Findings.add: a finding at step {first}, but the findings up to step {self._upto} "
                             "were added before (blocks must be added in step order, each with every rank's "
                             "findings)")
        top = max((a.step for a in fresh), default=upto)
        if top is None:
            return
        fresh.sort(key=lambda a: a.step)  # stable: a group's findings at one step keep their order
        for a in fresh:
            key = _group(a)
            run = self._open.get(key)
            if run is not None and a.step <= _end(run) + 1:
                if _end(a) > _end(run):  # a continuation (or an overlapping run of another rule): one run
                    run.count += _end(a) - _end(run)
                    run.last_step = _end(a)
                continue
            if run is not None:
                self._ended.append(run)
            self._open[key] = a
        self._upto = max(x for x in (top, upto, self._upto) if x is not None)
        self._settle(self._upto)

    def _settle(self, upto: float) -> None:
        """Join and keep the runs that cannot go on: ended, or ending before `upto` (every finding starting up to
        there was added: what would extend the run, or be the same run on another rank, came already)."""
        done = [key for key, run in self._open.items() if _end(run) < upto]
        batch, self._ended = self._ended + [self._open.pop(key) for key in done], []
        self._keep(batch)

    def _keep(self, batch: list[Anomaly]) -> None:
        joined: dict[tuple, tuple[int, Anomaly]] = {}
        for seq, a in sorted(((self._seq[_group(a)], a) for a in batch), key=lambda sa: (sa[0], sa[1].step)):
            key = _join_key(a)
            if key in joined:
                first = joined[key][1]
                first.ranks = sorted(set(first.ranks) | set(a.ranks))
            else:
                joined[key] = (seq, a)
        for seq, a in joined.values():
            self._kinds.setdefault(a.kind, _Kept(self.limit)).push(seq, a)

    def _finish(self) -> None:
        if not self._done:
            self._settle(math.inf)
            self._keep(self._once)
            self._once, self._done = [], True

    def result(self) -> list[Anomaly]:
        """Every finding added, merged, sorted by step, `MAX_LISTED` at most per kind; a run's message ends with
        its steps (`(steps a..b, n steps)`). No more `add` after it."""
        self._finish()
        listed = sorted(((a.step, KINDS.index(a.kind), a.ranks, seq, a) for kept in self._kinds.values()
                         for seq, a in kept.items()), key=lambda e: e[:4])
        out = []
        for *_, a in listed:
            a = _copy(a)
            if a.count > 1:
                a.message += f" (steps {a.step}..{a.last_step}, {a.count} steps)"
            out.append(a)
        return out

    def omitted(self) -> dict[str, Omitted]:
        """Per kind, the findings counted but not listed by `result()` (kinds with none left out are absent)."""
        self._finish()
        return {kind: kept.omitted for kind in KINDS if (kept := self._kinds.get(kind)) and kept.omitted}

    def notes(self) -> list[str]:
        """`Omitted.note` of each kind with findings left out, in `KINDS` order (for the summary's notes)."""
        return [o.note() for o in self.omitted().values()]


class _Kept:
    """One kind's listed findings (the first `limit` by step, then ranks) and a count of the rest."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._listed: list[tuple] = []  # (step, ranks, group order, arrival, finding), sorted (unless no limit)
        self._order = 0
        self.omitted: Omitted | None = None

    def push(self, seq: int, a: Anomaly) -> None:
        entry = (a.step, a.ranks, seq, self._order, a)
        self._order += 1
        if self.limit is None:
            self._listed.append(entry)
            return
        if len(self._listed) >= self.limit:
            if not self._listed or entry[:4] > self._listed[-1][:4]:
                self._omit(a)
                return
            self._omit(self._listed.pop()[4])
        bisect.insort(self._listed, entry, key=lambda e: e[:4])

    def _omit(self, a: Anomaly) -> None:
        o = self.omitted
        if o is None:
            self.omitted = Omitted(a.kind, 1, a.step, _end(a))
            return
        o.count, o.first_step, o.last_step = o.count + 1, min(o.first_step, a.step), max(o.last_step, _end(a))

    def items(self) -> Iterator[tuple[int, Anomaly]]:
        return ((seq, a) for _, _, seq, _, a in self._listed)


def _group(a: Anomaly) -> tuple:
    """What `merge` collapses over consecutive steps: one kind, field and ranks (resume/stopped: one message)."""
    return a.kind, a.field, a.message if a.kind in _ONCE else "", tuple(a.ranks)


def _join_key(a: Anomaly) -> tuple:
    """What must agree for `merge` to report runs of several ranks as one finding."""
    return a.kind, a.field, a.step, a.last_step, a.count, a.message if a.kind in ("nan", "resume", "stopped") else ""


def _end(a: Anomaly) -> int:
    return a.step if a.last_step is None else a.last_step


def _copy(a: Anomaly) -> Anomaly:
    return attrs.evolve(a, ranks=list(a.ranks))
