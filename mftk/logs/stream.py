"""A run too long to hold, analyzed a segment at a time: memory bounded whatever the log's length.

A run whose readers spilled their oldest steps to disk (`mftk.logs.spill`: the files share `SEGMENT_ROWS`
rows) holds only the rows read since each file's last segment. Each rank's series is then its segments, read
back one at a time, followed by the kept rows (`series_views`; after a resume, the sequences of segments
merged by step where they overlap, the later line winning), and every ranks' series is walked together a
block of steps at a time (`aligned`), so the checks across ranks see every rank's rows of a step:

- summary: running first/last/min loss and rate sums (`RateSums`); the step-time percentiles are exact: the
  steady-state times go to a temporary file, and `select` finds each order statistic there in four passes of
  16 bits (a radix selection), never holding more than one chunk;
- anomalies: the per-rank detectors run on each rank's rows of a block, the cross-rank ones on the block; the
  rolling-median ones (`MedianWalk`) and the lr rule (its `window` previous values as context) carry their state
  across views, so they flag what one pass over the whole series would;
- the step table holds the first and last `HEAD_ROWS` rows; the plot draws `Downsample`'s buckets (at most
  2 x `PLOT_BUCKETS`, merged pairwise when full), each keeping the rows where a field is at its smallest and
  largest, so spikes stay visible;
- CSV, JSON lines and the JSON file are written row by row from the segments (`iter_steps`).

A log under `SEGMENT_ROWS` steps never spills and takes the in-memory path unchanged (the existing outputs).
What differs on a spilled run: the mean step time and the rates are sums added per segment (float rounding,
~1e-15 relative); the table's middle rows (`--every`) and the plot's points between bucket extremes are not
held; a warm-up (`--skip-warmup`) longer than the first segment is counted from the series start as given.
"""
from __future__ import annotations

import heapq
import itertools
import math
import os
import tempfile
from typing import Any, Iterator, Sequence

import numpy as np

from mftk.logs.anomalies import (Anomaly, MedianWalk, Thresholds, _flagged, _non_finite, _rank_checks, _resumes,
                                 _Series, _slow_steps, _spikes, _stops, Findings, lr_jumps_in, resume)
from mftk.logs.parse import Run
from mftk.logs.summary import RateSums, Summary, _Steady, rates_from
from mftk.logs.spill import load
from mftk.logs.table import StepTable, TableView

HEAD_ROWS = 1000  # rows kept at each end of a spilled series for the step table
BLOCK_ROWS = 1 << 16  # rows of one rank in one block of `aligned` (the detectors' findings per block stay small)
PLOT_BUCKETS = 512  # the plot's buckets: between this many and twice as many
_CHUNK = 1 << 20  # values read at a time from the step-times file


def series_views(run: Run, rank: int) -> Iterator[TableView]:
    """One rank's series by step, a view at a time: the sequences of segments each file spilled for it
    (`Spill`: each a run of steps that go up, a resume starting the next), in file order, then the rows
    held, merged by step, a later source's line winning. Only segments that hold the step reached are
    loaded: as many as sequences overlap there (a resume's replayed range), whatever the log's length."""
    sources = [_Source([(first, last, path) for (seq, first, last), path in zip(spill.segments, spill.paths)
                        if seq == k]) for spill in run.spills.get(rank, []) for k in range(spill.sequence + 1)]
    tail = run.series(rank)
    if len(tail):
        steps = tail.values("step")
        sources.append(_Source([(int(steps[0]), int(steps[-1]), tail)]))
    active = [s for s in sources if s.items]
    while active:
        bound = min(s.last() for s in active)
        pieces = [(k, piece) for k, s in enumerate(sources) if s.items and s.first() <= bound
                  and len(piece := s.take(bound))]
        if len(pieces) == 1:
            yield pieces[0][1]
        else:
            yield _merged(pieces)
        active = [s for s in sources if s.items]


class _Cursor:
    """A rank's series (`series_views`) taken by step bound: the rows up to a step, one view held at a time."""

    def __init__(self, views: Iterator[TableView]) -> None:
        self.views, self.view, self.pos = views, None, 0
        self.steps = np.zeros(0)
        self._next()

    def _next(self) -> None:
        self.view = next((v for v in self.views if len(v)), None)
        self.pos = 0
        self.steps = self.view.values("step") if self.view is not None else np.zeros(0)

    def last(self, rows: int) -> float | None:
        """The step `rows` rows on (or the held view's last), None when the series is done."""
        return None if self.view is None else float(self.steps[min(self.pos + rows, len(self.steps)) - 1])

    def take(self, bound: float) -> TableView:
        if self.view is None:
            return _EMPTY
        end = int(np.searchsorted(self.steps, bound, side="right"))
        view = self.view
        piece = view if self.pos == 0 and end == len(view) else TableView(view.table, view.index[self.pos:end])
        self.pos = end
        if end == len(view):
            self._next()
        return piece


_EMPTY = TableView(StepTable(), np.zeros(0, dtype=np.int64))


def aligned(run: Run) -> Iterator[tuple[float, dict[int, TableView]]]:
    """Every rank's series a block of steps at a time, (its last step, each rank's rows): each block holds
    every rank's rows of its steps (up to the lowest last step of the views held, at most `BLOCK_ROWS` rows of
    any rank: one block's findings stay small), the blocks in step order. The per-step checks across ranks
    (`_rank_checks`) flag on blocks what they flag on the whole run; each rank's rows come in order."""
    cursors = {rank: _Cursor(series_views(run, rank)) for rank in run.ranks}
    while True:
        lasts = [last for c in cursors.values() if (last := c.last(BLOCK_ROWS)) is not None]
        if not lasts:
            return
        bound = min(lasts)
        yield bound, {rank: c.take(bound) for rank, c in cursors.items()}


class _Source:
    """One sequence's views in step order: (first step, last step, segment path or view) each, loaded when
    the merge reaches it and dropped once read."""

    def __init__(self, items: list[tuple[int, int, Any]]) -> None:
        self.items = items
        self.view: TableView | None = None
        self.pos = 0

    def first(self) -> int:
        return int(self.view.values("step")[self.pos]) if self.view is not None else self.items[0][0]

    def last(self) -> int:
        return self.items[0][1]

    def take(self, bound: int) -> TableView:
        """Its rows with step <= `bound` not taken yet (the current item's; the next item's steps are higher)."""
        if self.view is None:
            item = self.items[0][2]
            self.view = item if isinstance(item, TableView) else TableView(load(item), None)
            self.pos = 0
        steps = self.view.values("step")
        end = int(np.searchsorted(steps, bound, side="right"))
        piece = self.view if self.pos == 0 and end == len(steps) else TableView(
            self.view.table, self.view.index[self.pos:end])
        self.pos = end
        if end == len(steps):
            self.items, self.view = self.items[1:], None
        return piece


def _merged(pieces: list[tuple[int, TableView]]) -> TableView:
    """Pieces of several sequences covering the same steps, as one view by step, a later sequence's row
    winning where a step repeats (`Run.series`: the later line wins)."""
    tables, index, order, offset = [], [], [], 0
    seen: dict[int, int] = {}
    for k, view in pieces:
        if id(view.table) not in seen:
            seen[id(view.table)] = offset
            tables.append(view.table)
            offset += view.table.n
        index.append(view.index + seen[id(view.table)])
        order.append(np.full(len(view), k))
    table = StepTable.concat(tables)
    rows, source = np.concatenate(index), np.concatenate(order)
    steps = table.values("step")[rows]
    by_step = np.lexsort((-source, steps))
    sorted_steps = steps[by_step]
    keep = np.ones(len(by_step), dtype=bool)
    keep[1:] = sorted_steps[1:] != sorted_steps[:-1]
    return TableView(table, rows[by_step[keep]])


def iter_steps(run: Run) -> Iterator[dict[str, Any]]:
    """Every rank's records of a spilled run sorted by step then rank (`RunReport.all_steps`), one at a time."""
    ranks = [itertools.chain.from_iterable(series_views(run, rank)) for rank in run.ranks]
    return ranks[0] if len(ranks) == 1 else heapq.merge(*ranks, key=lambda r: (r["step"], r["rank"]))


def column_keys(run: Run) -> list[str]:
    """Every field any step of the run has (its segments' and kept rows' columns), in first-seen order."""
    spilled = [k for spills in run.spills.values() for spill in spills for k in spill.column_names()]
    return list(dict.fromkeys([*spilled, *run.records.columns]))


class HeadTail(Sequence):
    """The first and last rows of a long series, and its length: what the step table shows. Rows between
    are not held; indexing one raises IndexError, iteration yields the held rows."""

    def __init__(self, keep: int = HEAD_ROWS) -> None:
        self.keep, self.n = keep, 0
        self.head: list[dict[str, Any]] = []
        self._last: list[TableView] = []  # the latest views holding the last `keep` rows (rows made when read)
        self._tail: list[dict[str, Any]] | None = []

    def feed(self, view: TableView) -> None:
        m = len(view)
        if len(self.head) < self.keep:
            self.head += view[:self.keep - len(self.head)]
        self._last.append(view)
        while len(self._last) > 1 and sum(map(len, self._last[1:])) >= self.keep:
            self._last.pop(0)
        self._tail = None
        self.n += m

    @property
    def tail(self) -> list[dict[str, Any]]:
        """The last `keep` rows, as dicts (made once, from the views held)."""
        if self._tail is None:
            rows = [r for view in self._last for r in view[max(len(view) - self.keep, 0):]]
            self._tail = rows[-self.keep:]
        return self._tail

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (r for _, r in self.indexed())

    def indexed(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(index in the series, row) of each row held."""
        skip = max(len(self.head) + len(self.tail) - self.n, 0)
        return itertools.chain(enumerate(self.head),
                               ((self.n - len(self.tail) + j, r) for j, r in enumerate(self.tail) if j >= skip))

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(self.n)
            return [self[j] for j in range(start, stop, step) if j < len(self.head) or j >= self.n - len(self.tail)]
        if i < 0:
            i += self.n
        if 0 <= i < len(self.head):
            return self.head[i]
        if self.n - len(self.tail) <= i < self.n:
            return self.tail[i - (self.n - len(self.tail))]
        raise IndexError(f"row {i} of a spilled series is not held (only the first and last {self.keep})")


class Downsample:
    """A bounded plot series: buckets of consecutive steps, each keeping the rows where a field is at its
    smallest and largest (so a one-step spike is drawn); when there are twice `buckets`, neighbours merge
    pairwise and the bucket width doubles."""

    def __init__(self, buckets: int = PLOT_BUCKETS) -> None:
        self.max = buckets
        self.width = 0
        self.buckets: list[list[dict[str, Any]]] = []

    def feed(self, view: TableView) -> None:
        m = len(view)
        if not m:
            return
        self.width = self.width or max(1, -(-m // self.max))
        w = self.width
        starts = np.arange(0, m, w)
        chosen: list[set[int]] = [set() for _ in starts]
        for key in _plotted(view):
            v = view.values(key)
            for which, fill in ((np.argmin, np.inf), (np.argmax, -np.inf)):
                filled = np.where(np.isfinite(v), v, fill)
                full = (m // w) * w
                picks = list(which(filled[:full].reshape(-1, w), axis=1) + starts[:m // w]) if full else []
                if full < m:
                    picks.append(full + int(which(filled[full:])))
                for b, i in enumerate(picks):
                    if np.isfinite(v[i]):
                        chosen[b].add(int(i))
        for rows in chosen:
            self.buckets.append([view[i] for i in sorted(rows)])
        while len(self.buckets) > 2 * self.max:
            self.buckets = [_extremes(a + b) for a, b in itertools.zip_longest(
                self.buckets[0::2], self.buckets[1::2], fillvalue=[])]
            self.width *= 2

    def series(self) -> list[dict[str, Any]]:
        return [r for bucket in self.buckets for r in bucket]


def _plotted(view: TableView) -> list[str]:
    return [k for k, col in view.table.columns.items() if k not in ("step", "rank", "total_steps")
            and col.kind != "bool"]


def _extremes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of consecutive rows, those where some field is at its smallest or largest (first of equals), in order."""
    keep: set[int] = set()
    fields = {k for r in rows for k, v in r.items() if k not in ("step", "rank", "total_steps")
              and isinstance(v, (int, float)) and not isinstance(v, bool)}
    for key in fields:
        vals = [(v, j) for j, r in enumerate(rows) if isinstance(v := r.get(key), (int, float)) and np.isfinite(v)]
        if vals:
            keep.add(min(vals)[1])
            keep.add(max(vals, key=lambda p: (p[0], -p[1]))[1])
    return [rows[j] for j in sorted(keep)]


class _Times:
    """The steady-state step times, on disk (float64), for exact percentiles of any number of steps."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()
        self.n, self.total, self.max = 0, 0.0, -np.inf

    def add(self, times: np.ndarray) -> None:
        if len(times):
            self.file.write(np.asarray(times, dtype=np.float64).tobytes())
            self.n += len(times)
            self.total += float(np.sum(times, dtype=np.float64))
            self.max = max(self.max, float(np.max(times)))

    def chunks(self) -> Iterator[np.ndarray]:
        self.file.flush()
        fd = self.file.fileno()
        for start in range(0, self.n, _CHUNK):
            count = min(_CHUNK, self.n - start)
            yield np.frombuffer(os.pread(fd, 8 * count, 8 * start), dtype=np.float64)


def _keys(values: np.ndarray) -> np.ndarray:
    """float64 values as uint64 keys in the same order (IEEE bits, negatives flipped)."""
    bits = values.view(np.uint64)
    return np.where(bits >> np.uint64(63), ~bits, bits | np.uint64(1 << 63))


def _value(key: int) -> float:
    bits = np.uint64(key)
    bits = bits & ~np.uint64(1 << 63) if bits >> np.uint64(63) else ~bits
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def select(chunks: Any, ks: list[int]) -> dict[int, float]:
    """The k-th smallest value (0-based) for each k of `ks`, over the values `chunks()` yields: a radix
    selection, 16 bits of the sort key per pass over the chunks, a 65536-bin histogram per distinct prefix."""
    prefix = {k: 0 for k in ks}
    rank = dict(prefix) | {k: k for k in ks}
    for shift in (48, 32, 16, 0):
        hists = {p: np.zeros(1 << 16, dtype=np.int64) for p in set(prefix.values())}
        for chunk in chunks():
            keys = _keys(chunk)
            for p, hist in hists.items():
                sel = keys if shift == 48 else keys[(keys >> np.uint64(shift + 16)) == np.uint64(p)]
                hist += np.bincount(((sel >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.intp),
                                    minlength=1 << 16)
        for k in ks:
            cum = np.cumsum(hists[prefix[k]])
            digit = int(np.searchsorted(cum, rank[k], side="right"))
            rank[k] -= int(cum[digit - 1]) if digit else 0
            prefix[k] = (prefix[k] << 16) | digit
    return {k: _value(prefix[k]) for k in ks}


def percentiles(times: _Times, qs: tuple[int, ...]) -> dict[str, float]:
    """`summary.percentile` of the sorted times for each q (the same interpolation), from `select`."""
    n = times.n
    spots = {q: (n - 1) * q / 100.0 for q in qs}
    ks = sorted({math.floor(p) for p in spots.values()} | {min(math.floor(p) + 1, n - 1) for p in spots.values()})
    at = select(times.chunks, ks)
    out = {}
    for q, pos in spots.items():
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        out[f"p{q}"] = at[lo] + (at[hi] - at[lo]) * (pos - lo)
    return out


class _Anomalies:
    """The per-rank detectors fed the spilled rank's series a view at a time, their state carried."""

    def __init__(self, rank: int, t: Thresholds) -> None:
        self.rank, self.t, self.rows = rank, t, 0
        self.walks = {"loss": MedianWalk(t.spike, t), "grad_norm": MedianWalk(t.grad_spike, t),
                      "time": MedianWalk(t.straggler, t)}
        self.lr_context = (np.zeros(0, dtype=np.int64), np.zeros(0))  # the previous `window` steps and lrs

    def feed(self, view: TableView) -> list[Anomaly]:
        """The findings (runs) that start in `view`, the rank's next rows."""
        rank, t, recs = self.rank, self.t, _Series(view)
        found = _non_finite(rank, recs) + _flagged(rank, recs)
        found += _spikes(rank, recs, "loss", "spike", t.spike, t, walk=self.walks["loss"])
        found += _spikes(rank, recs, "grad_norm", "grad_spike", t.grad_spike, t, walk=self.walks["grad_norm"])
        found += _slow_steps(rank, recs, t, walk=self.walks["time"], skip=max(t.skip_warmup - self.rows, 0))
        steps = np.concatenate((self.lr_context[0], recs.steps))
        lr = np.concatenate((self.lr_context[1], view.values("lr")))
        found += lr_jumps_in(rank, steps, lr, t, start=len(self.lr_context[0]))
        keep = t.window + 2
        self.lr_context = (steps[-keep:].copy(), lr[-keep:].copy())
        self.rows += len(view)
        return found


def analyze_spilled(run: Run, *, thresholds: Thresholds, skip_warmup: int, seq_length: int | None,
                    world_size: int | None, peak_tflops: float | None, plot: bool) -> tuple[
                        Summary, list[Anomaly], HeadTail, list[dict[str, Any]] | None]:
    """(summary, anomalies, table rows, plot series) of a spilled run, reading its segments once: every rank's
    series a block of steps at a time (`aligned`), the primary rank's also summarized, tabled and plotted."""
    rank = run.primary_rank
    rows, sample, times = HeadTail(), Downsample() if plot else None, _Times()
    detectors = {r: _Anomalies(r, thresholds) for r in run.ranks}
    sums, loss, findings, last_steps = RateSums(), _Loss(), Findings(), {}
    try:
        for bound, block in aligned(run):
            found = []
            for r, piece in block.items():
                if len(piece):
                    found += detectors[r].feed(piece)
                    last_steps[r] = int(piece.values("step")[-1])
            if len(block) > 1:
                found += _rank_checks({r: _Series(piece) for r, piece in block.items()}, thresholds)
            findings.add(found, upto=int(bound))
            view = block[rank]
            if not len(view):
                continue
            skip = max(skip_warmup - rows.n, 0)
            loss.feed(view)
            time = view.native("per_step_time")[skip:]
            times.add(time if time.dtype.kind == "i" else time[np.isfinite(time)])
            with np.errstate(invalid="ignore"):
                timed = np.isfinite(time) & (time > 0)
            sums.add(RateSums.of(_Steady(view, skip, timed), first=not sums.timed))
            rows.feed(view)
            if sample is not None:
                sample.feed(view)
        first, last, n = rows.head[0], rows.tail[-1], rows.n
        s = Summary(steps=n, first_step=first["step"], last_step=last["step"], total_steps=last.get("total_steps"),
                    ranks=run.ranks, primary_rank=rank, warmup_skipped=min(skip_warmup, max(n - 1, 0)),
                    seq_length=seq_length, world_size=world_size or (len(run.ranks) if len(run.ranks) > 1 else None),
                    peak_tflops=peak_tflops)
        s.loss_first, s.loss_last, s.loss_min, s.loss_min_step = loss.first, loss.last, loss.min, loss.min_step
        if times.n:
            s.step_time_ms = percentiles(times, (50, 90, 99))
            s.step_time_ms.update(mean=times.total / times.n, max=times.max)
    finally:
        times.file.close()
    rates_from(s, sums)
    findings.add(_resumes(run) + _stops(run, last_steps)
                 + [resume(r, *pair) for r, spills in run.spills.items() for spill in spills for pair in spill.resumes])
    found = findings.result()
    s.notes += findings.notes()
    s.notes.append(f"{n:,} steps read a segment at a time (bounded memory): the table holds the first and last "
                   f"{HEAD_ROWS} steps" + ("; the plot draws each step range's extremes" if plot else ""))
    return s, found, rows, (sample.series() if sample is not None else None)


class _Loss:
    """First, last and smallest finite loss (the first step where the smallest was), a view at a time."""

    def __init__(self) -> None:
        self.first = self.last = self.min = None
        self.min_step: int | None = None

    def feed(self, view: TableView) -> None:
        loss = view.values("loss")
        finite = np.isfinite(loss)
        if not finite.any():
            return
        if self.first is None:
            self.first = float(loss[int(np.argmax(finite))])
        self.last = float(loss[len(finite) - 1 - int(np.argmax(finite[::-1]))])
        best = int(np.argmin(np.where(finite, loss, np.inf)))
        if self.min is None or loss[best] < self.min:
            self.min, self.min_step = float(loss[best]), view[best]["step"]
