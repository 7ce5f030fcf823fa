"""``train_dataset.balance_enabled``: even out attention work across data-parallel ranks (2.1 §1.6).

Within each optimizer step the dp·accum micro-batches of the baseline order are redistributed over the
data-parallel ranks so that each rank's attention work (Σ over its documents of length², from the
compressed-EOD boundaries) is about the same. A micro-batch is moved whole, so its contents and its loss
denominator do not change, and every rank still gets ``accum`` of them: the step's gradient (the mean over
all of the step's micro-batches) is the unbalanced run's, to float32 summation order.

The assignment is mftk's (the reference's planner is not specified beyond its load proxy): micro-batches
by descending load, each to the rank with the least load that still has room (ties to the lower rank) —
deterministic, so every rank computes the same plan without talking.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def sample_load(actual_seq_len: np.ndarray) -> int:
    """Σ doc_len² of one sample from its compressed-EOD ends (padded with the sample length)."""
    ends = np.asarray(actual_seq_len, np.int64)
    ends = np.unique(ends)  # the padding repeats the length; ends are increasing
    lengths = np.diff(np.concatenate(([0], ends)))
    return int(np.sum(lengths * lengths))


def assign(loads: Sequence[float], dp: int, per_rank: int) -> list[list[int]]:
    """Indices of ``loads`` (dp·per_rank micro-batches) for each rank: ``per_rank`` each, loads balanced."""
    if len(loads) != dp * per_rank:
        raise ValueError(f"{len(loads)} micro-batches cannot be split into {dp} ranks of {per_rank}")
    order = sorted(range(len(loads)), key=lambda i: (-loads[i], i))
    out: list[list[int]] = [[] for _ in range(dp)]
    total = [0.0] * dp
    for i in order:
        rank = min((r for r in range(dp) if len(out[r]) < per_rank), key=lambda r: (total[r], r))
        out[rank].append(i)
        total[rank] += loads[i]
    return [sorted(x) for x in out]
