"""Context parallel: each CP rank holds part of every sequence; attention sees the keys of the whole sequence.

The reference's ``colossal`` method: the sequence is cut into ``2·cp`` chunks and CP rank ``i`` holds chunks
``i`` and ``2cp−1−i``, so under the causal mask every rank has the same attention work. Each rank embeds
its own tokens, applies RoPE at their global positions (`ColossalSequence`, the model's ``seq`` part), and
attends with its queries to the keys and values of the whole sequence, all-gathered over the CP group
(`ColossalAttention`; the gradient travels back as a reduce-scatter). The mask is built on global
positions and cut to (this rank's queries × the gathered key order).

The loss: rank ``i`` weights its tokens by ``cp / Σ_global m`` (every rank holds the whole batch, so the
global count needs no message); the trainer's average over dp×cp then gives exactly the single-process
masked mean, for the logged loss and for the gradients. Sums over the tokens of a sequence (MoE
load-balancing statistics) cover the ranks holding its other parts (`SequenceShards`).
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn

from mftk.engine.parallel import comm
from mftk.engine.parallel.groups import AxisGroup


def colossal_positions(seq_length: int, cp: int, rank: int) -> np.ndarray:
    """Global token positions held by CP rank ``rank``: chunks ``rank`` and ``2cp−1−rank`` of ``2cp``."""
    if seq_length % (2 * cp):
        raise ValueError(f"seq_length {seq_length} does not split into 2·cp = {2 * cp} chunks")
    c = seq_length // (2 * cp)
    a, b = rank, 2 * cp - 1 - rank
    return np.concatenate([np.arange(a * c, (a + 1) * c), np.arange(b * c, (b + 1) * c)])


class ColossalSequence:
    """The model's ``seq`` part under context parallel (same methods as `models.gpt.WholeSequence`)."""

    def __init__(self, group: AxisGroup) -> None:
        self.group = group
        self.scale = float(group.size)  # undone by the trainer's average over dp×cp
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def positions(self, seq: int) -> tuple[np.ndarray, np.ndarray]:
        """(this rank's positions, the gathered key order: every rank's positions in group-rank order)."""
        if seq not in self._cache:
            cp = self.group.size
            mine = colossal_positions(seq, cp, self.group.rank)
            keys = np.concatenate([colossal_positions(seq, cp, r) for r in range(cp)])
            self._cache[seq] = (mine, keys)
        return self._cache[seq]

    def local(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a[:, self.positions(a.shape[1])[0]])

    def rope(self, cos, sin):
        mine = Tensor(self.positions(cos.shape[1])[0])
        return cos[:, mine], sin[:, mine]  # (1, S_local, 1, D) at the global positions

    def mask(self, mask: np.ndarray) -> np.ndarray:
        mine, keys = self.positions(mask.shape[-1])
        return mask[:, :, mine][:, :, :, keys]


class ColossalAttention(nn.Cell):
    """A core-attention cell whose keys and values are all-gathered over CP first (dim 2 of ``(B, heads, S, d)``);
    the plain cell's parameters (the tracked max logits, if any) are adopted under their names."""

    def __init__(self, plain: nn.Cell, group: AxisGroup) -> None:
        super().__init__()
        for name, p in plain.parameters_and_names(expand=False):
            setattr(self, name.rsplit(".", 1)[-1], p)
        self._attend = plain.construct
        self.gather = comm.GatherFromGroup(group, 2)

    def construct(self, q, k, v, mask):
        return self._attend(q, self.gather(k), self.gather(v), mask)


class SumOverShards(nn.Cell):
    """All-reduce (sum) over the ranks holding parts of the same sequences; the backward passes the gradient
    through, times ``grad_scale`` (the CP degree: gradients are averaged over CP but summed over TP)."""

    def __init__(self, group: AxisGroup, grad_scale: float) -> None:
        super().__init__()
        self.group, self.grad_scale = group, float(grad_scale)

    def construct(self, x):
        return comm.all_reduce(x, self.group)

    def bprop(self, x, out, dout):
        return (dout * self.grad_scale,)


class SequenceShards(nn.Cell):
    """`layers.moe.LocalTokens` when each sequence is spread over the ``group`` (TP with sequence parallel,
    CP, or both): sums cover the whole sequences."""

    def __init__(self, group: AxisGroup, cp: int) -> None:
        super().__init__()
        self.group, self.shards = group, group.size
        self.sum = SumOverShards(group, cp)

    def construct(self, x):
        return self.sum(x)

    def total(self, x):
        return comm.all_reduce(x, self.group)
