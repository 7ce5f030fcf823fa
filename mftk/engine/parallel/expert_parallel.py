"""Expert parallel: this rank holds experts ``[r·E/ep, (r+1)·E/ep)`` and computes them for the tokens of every
rank of its EP group (the reference's sparse mesh: EP is carved out of dp_shard·cp·tp, innermost).

Tokens sorted by expert are already grouped by owner, so one uneven all-to-all sends each owner its rows
(dispatch), the owner runs its experts on the rows of every sender, and a second all-to-all returns the
results in the original sorted order (combine). `ExpertParallelDispatch` is swapped in for the plain
`layers.moe.LocalExperts` of a `GroupedMLP`; the router, the aux loss and the shared experts stay as they
are (replicated, or tensor-parallel).
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn

from mftk.engine.parallel import comm
from mftk.engine.parallel.groups import AxisGroup


class ExpertParallelDispatch(nn.Cell):
    all_local = False  # the rows go to their owners; `GroupedMLP` loops over what this rank receives

    def __init__(self, group: AxisGroup, num_experts: int) -> None:
        super().__init__()
        if num_experts % group.size:
            raise ValueError(f"num_experts {num_experts} does not split over expert_parallel={group.size}")
        self.group, self.e, self.local = group, num_experts, num_experts // group.size
        self.send, self.back = comm.AllToAllUneven(group), comm.AllToAllUneven(group)
        self._returning: np.ndarray | None = None

    def dispatch(self, xs, counts: np.ndarray) -> tuple:
        """Rows sorted by expert → the rows of this rank's experts from every sender (sender-major), and their
        ``[(local expert, row count), ...]`` in that order."""
        p, el, me = self.group.size, self.local, self.group.rank
        send = counts.reshape(p, el).sum(1).astype(np.int32)
        every = comm.all_gather(Tensor(counts.astype(np.int32)).reshape(1, -1), self.group, 0).asnumpy()
        mine = every[:, me * el:(me + 1) * el]  # (sender, local expert)
        self._returning = mine.sum(1).astype(np.int32)
        rows = self.send(xs, Tensor(send))
        return rows, [(j, int(mine[s, j])) for s in range(p) for j in range(el)]

    def combine(self, ys):
        """The experts' outputs back to their senders, in each sender's sorted order."""
        return self.back(ys, Tensor(self._returning))
