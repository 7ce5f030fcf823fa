"""Context parallel: each CP rank holds part of every sequence; attention sees the keys of the whole sequence.

The three methods of the reference, as one attention with two sub-groups of the CP group (ulysses degree
``u``; CP index ``c`` is ring ``c // u`` and ulysses ``c % u``):
- ``colossal`` (u = 1): the sequence is cut into ``2·cp`` chunks and CP rank ``i`` holds chunks ``i`` and
  ``2cp−1−i``, so under the causal mask every rank has the same attention work; each rank attends with its
  queries to the keys and values of the whole sequence, all-gathered over the CP group (the ring group);
- ``ulysses`` (u = cp): rank ``i`` holds the ``i``-th contiguous ``S/cp`` positions; an all-to-all swaps the
  sequence split for a head split (each rank attends over the whole sequence with ``1/cp`` of the heads)
  and a second all-to-all swaps back;
- ``hybrid`` (1 < u < cp): colossal's chunks; the all-to-all within each ulysses group, then the keys and
  values all-gathered over the ring group.
Each rank embeds its own tokens and applies RoPE at their global positions (`ContextSequence`, the model's
``seq`` part); the mask is built on global positions and cut to (the queries × the keys attention sees).

The loss: rank ``i`` weights its tokens by ``cp / Σ_global m`` (every rank holds the whole batch, so the
global count needs no message); the trainer's average over dp×cp then gives exactly the single-process
masked mean, for the logged loss and for the gradients. Sums over the tokens of a sequence (MoE
load-balancing statistics) cover the ranks holding its other parts (`SequenceShards`).
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops

from mftk.engine.parallel import comm
from mftk.engine.parallel.groups import AxisGroup


def colossal_positions(seq_length: int, cp: int, rank: int) -> np.ndarray:
    """Global token positions held by CP rank ``rank``: chunks ``rank`` and ``2cp−1−rank`` of ``2cp``."""
    if seq_length % (2 * cp):
        raise ValueError(f"seq_length {seq_length} does not split into 2·cp = {2 * cp} chunks")
    c = seq_length // (2 * cp)
    a, b = rank, 2 * cp - 1 - rank
    return np.concatenate([np.arange(a * c, (a + 1) * c), np.arange(b * c, (b + 1) * c)])


def context_positions(seq_length: int, cp: int, rank: int, ulysses: int) -> np.ndarray:
    """Global positions CP rank ``rank`` holds between blocks: contiguous under pure ulysses, colossal's chunks
    otherwise."""
    if ulysses == cp:
        if seq_length % cp:
            raise ValueError(f"seq_length {seq_length} does not split over cp = {cp}")
        n = seq_length // cp
        return np.arange(rank * n, (rank + 1) * n)
    return colossal_positions(seq_length, cp, rank)


class ContextSequence:
    """The model's ``seq`` part under context parallel (same methods as `models.gpt.WholeSequence`).

    ``queries``: the positions of this rank's ulysses group in member order (what attention sees after the
    all-to-all); ``keys``: those of every ulysses group of its ring, in ring order (after the all-gather)."""

    def __init__(self, cp_group: AxisGroup, ulysses: int = 1) -> None:
        self.group, self.ulysses = cp_group, int(ulysses)
        self.scale = float(cp_group.size)  # undone by the trainer's average over dp×cp
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def positions(self, seq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(this rank's positions, the query order, the key order)."""
        if seq not in self._cache:
            cp, u, c = self.group.size, self.ulysses, self.group.rank
            pos = [context_positions(seq, cp, r, u) for r in range(cp)]
            group_of = [np.concatenate(pos[ring * u:(ring + 1) * u]) for ring in range(cp // u)]
            self._cache[seq] = (pos[c], group_of[c // u], np.concatenate(group_of))
        return self._cache[seq]

    def local(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a[:, self.positions(a.shape[1])[0]])

    def rope(self, cos, sin):
        mine = Tensor(self.positions(cos.shape[1])[0])
        return cos[:, mine], sin[:, mine]  # (1, S_local, 1, D) at the global positions

    def mask(self, mask: np.ndarray) -> np.ndarray:
        _, queries, keys = self.positions(mask.shape[-1])
        return mask[:, :, queries][:, :, :, keys]


class AllToAll(nn.Cell):
    """`comm.all_to_all` with autograd: the gradient goes back by the inverse exchange."""

    def __init__(self, group: AxisGroup, split_dim: int, concat_dim: int) -> None:
        super().__init__()
        self.group, self.split_dim, self.concat_dim = group, split_dim, concat_dim

    def construct(self, x):
        return comm.all_to_all(x, self.group, self.split_dim, self.concat_dim)

    def bprop(self, x, out, dout):
        return (comm.all_to_all(dout, self.group, self.concat_dim, self.split_dim),)


class ContextAttention(nn.Cell):
    """A core-attention cell under context parallel: ``q, k, v (B, heads, S_local, d)`` trade the sequence split
    for a head split over the ulysses group, the keys and values are all-gathered over the ring group, and the
    output ``(B, S, heads·dv)`` trades back. The plain cell's parameters (tracked max logits, if any) are adopted
    under their names."""

    def __init__(self, plain: nn.Cell, ulysses: AxisGroup, ring: AxisGroup) -> None:
        super().__init__()
        for name, p in plain.parameters_and_names(expand=False):
            setattr(self, name.rsplit(".", 1)[-1], p)
        self._attend = plain.construct
        self.scatter_heads = None if ulysses.is_trivial else AllToAll(ulysses, 1, 2)
        self.gather_heads = None if ulysses.is_trivial else AllToAll(ulysses, 1, 2)
        self.gather = None if ring.is_trivial else comm.GatherFromGroup(ring, 2)

    def construct(self, q, k, v, mask):
        if self.scatter_heads is not None:
            q, k, v = self.scatter_heads(q), self.scatter_heads(k), self.scatter_heads(v)
        if self.gather is not None:
            k, v = self.gather(k), self.gather(v)
        out = self._attend(q, k, v, mask)  # (B, S_queries, heads·dv)
        return out if self.gather_heads is None else self.gather_heads(out)


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

    def __init__(self, group: AxisGroup, cp: int, tp: AxisGroup | None = None) -> None:
        super().__init__()
        self.group, self.shards = group, group.size
        self.sum = SumOverShards(group, cp)
        self.tp = tp  # sequence parallel cuts each rank's positions over TP (token ids: `ids`)

    def construct(self, x):
        return self.sum(x)

    def ids(self, input_ids):
        """``(B, S_local)`` ids (this rank's CP positions) → those of its TP block, in its hidden states' order."""
        return input_ids if self.tp is None or self.tp.size <= 1 else comm.split(input_ids, self.tp, 1)

    def total(self, x):
        return comm.all_reduce(x, self.group)


class WholeAttentionSequence(ContextSequence):
    """DeepSeek-V4's ``seq`` part under context parallel: this rank's colossal positions between the attentions
    (embedding, hyper-connections, norms, MoE, loss), but the attention runs whole on the gathered sequence
    (`GatherPositions` … `KeepPositions`, `parallelize.whole_sequence_v4_attention`), so it takes the RoPE
    tables and the mask of the whole sequence (the attention builds its tables from its input's length)."""

    def __init__(self, cp_group: AxisGroup) -> None:
        super().__init__(cp_group, 1)

    def rope(self, cos, sin):
        return cos, sin

    def mask(self, mask: np.ndarray) -> np.ndarray:
        return mask

    def order(self, seq: int) -> np.ndarray:
        """The global positions of the CP ranks' hidden states concatenated in CP-rank order (what an all-gather
        over CP, or over CP·TP with each CP rank's positions cut in TP blocks, puts in a row)."""
        return self.positions(seq)[2]


class _Positions:
    """Index tables of `GatherPositions` / `KeepPositions` per sequence length, from ``order(S)``: the global
    position of each row of the gathered tensor (member order)."""

    def __init__(self, group: AxisGroup, order) -> None:
        self.group, self.order_of = group, order
        self._cache: dict[tuple[str, int], Tensor] = {}

    def table(self, kind: str, s: int) -> Tensor:
        if (kind, s) not in self._cache:
            order = np.asarray(self.order_of(s))
            n = s // self.group.size
            mine = order[self.group.rank * n:(self.group.rank + 1) * n]
            if kind == "order":  # gathered row i ← sequence position order[i]
                t = order
            elif kind == "inverse":  # sequence position p ← gathered row argsort(order)[p]
                t = np.argsort(order, kind="stable")
            elif kind == "mine":  # this rank's rows ← sequence positions mine
                t = mine
            else:  # "spread": sequence position p ← this rank's row k where mine[k] = p, else row n (a zero row)
                t = np.full((s,), n)
                t[mine] = np.arange(n)
            self._cache[(kind, s)] = Tensor(np.ascontiguousarray(t, np.int32))
        return self._cache[(kind, s)]


class GatherPositions(nn.Cell):
    """All-gather along the sequence (dim 1) over ``group`` and put the rows back in sequence order (``order``:
    `WholeAttentionSequence.order`): the entry of a block that runs whole on the full sequence under context
    parallel. Backward: the gradient in the gathered order, reduce-scattered (each rank's is a part of the sum)."""

    def __init__(self, group: AxisGroup, order) -> None:
        super().__init__()
        self.group, self.tables = group, _Positions(group, order)

    def construct(self, x):
        g = comm.all_gather(x, self.group, 1)
        return ops.gather(g, self.tables.table("inverse", g.shape[1]), 1)

    def bprop(self, x, out, dout):
        d = ops.gather(dout, self.tables.table("order", dout.shape[1]), 1)
        return (comm.reduce_scatter(d, self.group, 1),)


class KeepPositions(nn.Cell):
    """Keep this rank's positions (in its hidden states' order) of a ``(B, S, …)`` tensor every rank of ``group``
    computed alike on the full sequence: the exit of the block `GatherPositions` entered. Backward: this rank's
    positions' gradient, zeros elsewhere (as `comm.KeepSlice`)."""

    def __init__(self, group: AxisGroup, order) -> None:
        super().__init__()
        self.group, self.tables = group, _Positions(group, order)

    def construct(self, y):
        return ops.gather(y, self.tables.table("mine", y.shape[1]), 1)

    def bprop(self, y, out, dout):
        s = y.shape[1]
        zero = ops.zeros((dout.shape[0], 1) + tuple(dout.shape[2:]), dout.dtype)
        return (ops.gather(ops.concat((dout, zero), 1), self.tables.table("spread", s), 1),)
