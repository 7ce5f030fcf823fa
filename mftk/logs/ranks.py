"""Which rank wrote each line of a file that holds several: ranks interleaved in lockstep, or whole logs appended.

A step line names no rank, so a file that several ranks wrote into is told apart by its steps:

- msrun's console (``--tail_worker_log``), ``tee`` of a job's output or ``cat worker_*.log`` put every rank's
  step line into one file *interleaved*: each step R >= 2 times in lockstep (`split_interleaved`), the k-th
  line of a step being rank ``base + k``;
- ``cat worker_0.log worker_1.log`` puts whole logs one after another: the step and the logger's clock both go
  back where the next log starts (`concatenated_ranks`), which a resume never does (its lines are logged later
  than those they replace).

The reader (`mftk.logs.parse.LogReader`) applies these to the rows it holds when it spills them to disk a
segment at a time (`spill_plan`), and to the rows left at the end (`mftk.logs.parse.split_ranks`), so a file
of any length is told apart the same way.
"""
from __future__ import annotations

from typing import Any

import attrs
import numpy as np

INTERLEAVE_LAG = 2  # ranks of one job log a step at most this many steps apart
MAX_SPILL_RESUMES = 64  # resumes in one segment's rows that still spill (more: the rows are held)


def split_interleaved(steps: list[int], summary: Any) -> list[int] | None:
    """The rank of each of one file's records when several ranks' lines were written into it, else None.

    Such a file shows each step R >= 2 times in lockstep: every step (but the last two, which a stop may cut
    short) exactly R times, and never a step more than `INTERLEAVE_LAG` steps behind the newest one. Then the
    k-th line of a step is rank ``summary.rank + k``. A resumed run does not look like that (its replayed
    steps repeat, the others do not; a restart from scratch goes back further than the lag) and keeps one
    rank. Sets ``summary.interleaved`` to R (0 when not interleaved).
    """
    summary.interleaved = 0
    order: dict[int, int] = {}
    counts: dict[int, int] = {}
    newest = None
    for step in steps:
        if step not in order:
            order[step] = len(order)
        counts[step] = counts.get(step, 0) + 1
        if newest is not None and order[step] < order[newest] - INTERLEAVE_LAG:
            return None
        if newest is None or order[step] > order[newest]:
            newest = step
    distinct = list(order)
    ranks = counts[distinct[0]] if distinct else 0
    body = distinct[:-2] if len(distinct) > 2 else distinct[:1]
    if ranks < 2 or any(counts[s] != ranks for s in body) or any(counts[s] > ranks for s in distinct):
        return None
    summary.interleaved = ranks
    return occurrence_ranks(np.asarray(steps, dtype=np.int64), summary.rank).tolist()


def occurrence_ranks(steps: np.ndarray, base: int) -> np.ndarray:
    """``base + k`` for the k-th line of each step (in file order): the rank of interleaved lines."""
    if not len(steps):
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(steps, kind="stable")
    sorted_steps = steps[order]
    starts = np.r_[0, np.nonzero(sorted_steps[1:] != sorted_steps[:-1])[0] + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(steps)]))
    out = np.empty(len(steps), dtype=np.int64)
    out[order] = base + np.arange(len(steps)) - group_start
    return out


def interleave_cut(steps: np.ndarray) -> int:
    """Where interleaved rows can be cut so that no step has lines on both sides, keeping at least the last
    `INTERLEAVE_LAG` + 1 steps (a late rank may still log them) after the cut; 0 when there is none."""
    _, first, inverse = np.unique(steps, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))[inverse]  # each row's step, numbered in order of appearance
    limit = int(np.argmax(order == max(int(order.max()) - INTERLEAVE_LAG, 0)))
    before = np.maximum.accumulate(order)[:-1]  # the newest step before each possible cut
    after = np.minimum.accumulate(order[::-1])[::-1][1:]  # the oldest step from it on
    cuts = np.nonzero(before < after)[0] + 1
    cuts = cuts[cuts <= limit]
    return int(cuts[-1]) if len(cuts) else 0


def concatenated_ranks(n: int, cuts: list[int], base: int) -> np.ndarray:
    """``base`` up to the first cut, ``base + 1`` up to the next, ...: the rank of each row of appended logs."""
    out = np.full(n, base, dtype=np.int64)
    for k, cut in enumerate(cuts, start=1):
        out[cut:] = base + k
    return out


@attrs.define
class SpillPlan:
    """How a reader's held rows go to disk: each row's rank, and the rows from `keep` on stay held."""

    ranks: np.ndarray
    keep: int
    interleaved: int = 0  # R when the rows are R ranks interleaved
    appended: list[int] = attrs.field(factory=list)  # rows where another log starts (`cat`)


def spill_plan(steps: np.ndarray, back_steps: list[tuple[int, bool]], *, base: int, interleaved: int,
               summary: Any, max_back: int) -> SpillPlan | str | None:
    """The plan for one reader's held rows (`steps`), or why they stay held (None: not yet, try again later).

    `back_steps` are (row, clock went back) where the step went back; `base` is the held rows' first rank;
    `interleaved` the R found at an earlier spill (0: none yet)."""
    n = len(steps)
    if n and bool(np.all(np.diff(steps) > 0)) and not interleaved:
        return SpillPlan(np.full(n, base, dtype=np.int64), n - 1)
    if interleaved or len(back_steps) > MAX_SPILL_RESUMES:
        ranks = split_interleaved(steps.tolist(), summary)
        if ranks is None or (interleaved and summary.interleaved != interleaved):
            summary.interleaved = interleaved
            return "steps that go back too often to be a resume, and not ranks in lockstep"
        keep = interleave_cut(steps)
        return SpillPlan(np.asarray(ranks, dtype=np.int64), keep, interleaved=summary.interleaved) if keep else None
    if len(back_steps) >= max_back:
        return "more points where the step went back than are remembered"
    appended = [row for row, clock_back in back_steps if clock_back and 0 < row < n]
    return SpillPlan(concatenated_ranks(n, appended, base), n - 1, appended=appended)
