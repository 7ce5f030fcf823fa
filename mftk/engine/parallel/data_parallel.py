"""Data parallel (gradient all-reduce), FSDP/HSDP (per-parameter Shard(0) of params, grads and
optimizer state), and the global gradient norm, as plain functions the trainer calls between
backward and the optimizer.

Numerics: with every rank's loss a masked mean over its micro-batch (and `accum` micro-batches
averaged), the mean over data-parallel ranks of the gradients equals the gradient of the mean
loss over the whole global batch — exactly the single-process run with the same global batch and
`accum·dp` micro-batches. So DP and FSDP both reduce with "avg" over the `dp_cp` group.

The training engine's FSDP (parameters sharded between steps, gathered per unit) is `parallel.fsdp`;
`FsdpParams` here is the stand-alone ZeRO-3 arithmetic on a list of parameters (reduce-scatter, update
the row blocks, all-gather), kept for the collective tests.
"""
from __future__ import annotations

import math
from typing import Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops

from mftk.engine.parallel import comm
from mftk.engine.parallel.groups import AxisGroup, ParallelGroups


def flatten(tensors: Sequence[Tensor]) -> Tensor:
    return ops.concat([t.reshape(-1) for t in tensors], 0)


def unflatten(flat: Tensor, shapes: Sequence[tuple[int, ...]]) -> list[Tensor]:
    out, start = [], 0
    for shape in shapes:
        n = int(np.prod(shape)) if len(shape) else 1
        out.append(flat[start:start + n].reshape(shape))
        start += n
    return out


def all_reduce_flat(tensors: Sequence[Tensor], group: AxisGroup, op: str = "avg") -> tuple[Tensor, ...]:
    """One all-reduce of every tensor through a flat buffer (one message beats hundreds on TCP)."""
    if group.is_trivial or not tensors:
        return tuple(tensors)
    flat = comm.all_reduce(flatten(tensors), group, op)
    return tuple(unflatten(flat, [tuple(t.shape) for t in tensors]))


def sync_gradients(grads: Sequence[Tensor], groups: ParallelGroups, *, op: str = "avg") -> tuple[Tensor, ...]:
    """DP: average (or sum) gradients over the data-parallel × context-parallel ranks."""
    return all_reduce_flat(grads, groups.dp_cp, op)


def sync_flat_gradients(flat: np.ndarray, groups: ParallelGroups, *, op: str = "avg") -> np.ndarray:
    """DP for a trainer that accumulates every gradient into one flat fp32 numpy buffer: one message."""
    return comm.all_reduce_numpy(flat, groups.dp_cp, op)  # in the buffer's own memory: no copy


def mean_over(value: float, group: AxisGroup) -> float:
    """A scalar averaged over a group (the logged loss over dp×cp, reference §2.3)."""
    if group.is_trivial:
        return float(value)
    return float(comm.all_reduce(Tensor(np.array([value], np.float32)), group, "avg").asnumpy()[0])


# ---------------------------------------------------------------- FSDP / HSDP


def shard_rows(n_rows: int, size: int, rank: int) -> tuple[int, int]:
    """Rows [start, end) of a Shard(0) block: ceil-sized blocks, the last ones shorter or empty."""
    block = math.ceil(n_rows / size) if n_rows else 0
    start = min(rank * block, n_rows)
    return start, min(start + block, n_rows)


class FsdpParams:
    """Shard(0) of each parameter over `groups.fsdp`, replicated over `groups.dp_replicate` (HSDP).

    ``local`` holds one Parameter per model parameter (same name, this rank's row block) for the
    optimizer and the checkpoint; ``reduce_scatter`` turns full gradients into local ones and
    ``all_gather`` writes the updated blocks back into the full model parameters.
    Scalars (0-d) are kept whole on every rank.
    """

    def __init__(self, params: Sequence[Parameter], groups: ParallelGroups) -> None:
        self.params = list(params)
        self.groups = groups
        self.shard, self.replicate = groups.fsdp, groups.dp_replicate
        self.bounds = [self._bounds(p) for p in self.params]
        self.local = [Parameter(Tensor(self._slice_np(p.asnumpy(), b)), name=p.name)
                      for p, b in zip(self.params, self.bounds)]

    def _bounds(self, p: Parameter) -> tuple[int, int]:
        if len(p.shape) == 0:
            return 0, 0
        return shard_rows(p.shape[0], self.shard.size, self.shard.rank)

    @staticmethod
    def _slice_np(a: np.ndarray, b: tuple[int, int]) -> np.ndarray:
        return a.copy() if a.ndim == 0 else a[b[0]:b[1]].copy()

    def _block(self, p_shape: tuple[int, ...]) -> int:
        return math.ceil(p_shape[0] / self.shard.size) if p_shape and p_shape[0] else 0

    def reduce_scatter(self, grads: Sequence[Tensor], *, op: str = "avg") -> tuple[Tensor, ...]:
        """Full per-rank grads → this rank's averaged row blocks (all-reduce + slice on CPU)."""
        full = all_reduce_flat(grads, self.groups.dp_cp, op)  # the CPU reduce_scatter is all-reduce + slice
        return tuple(g if len(g.shape) == 0 else g[b[0]:b[1]] for g, b in zip(full, self.bounds))

    def all_gather(self) -> None:
        """Write every rank's updated block back into the full model parameters (one message)."""
        if self.shard.is_trivial:
            for p, loc in zip(self.params, self.local):
                ops.assign(p, loc)
            return
        padded = []
        for p, loc in zip(self.params, self.local):
            if len(p.shape) == 0:
                padded.append(loc.reshape(1))
                continue
            block, rows = self._block(tuple(p.shape)), loc.shape[0]
            pad = ops.zeros((block - rows,) + tuple(p.shape[1:]), p.dtype)
            piece = loc if rows == block else (pad if rows == 0 else ops.concat([loc, pad], 0))
            padded.append(piece.reshape(-1))  # every rank sends `block` rows, so the gather is even
        parts = comm.all_gather_list(ops.concat(padded, 0), self.shard)  # one flat buffer per rank
        offsets = [int(o) for o in np.cumsum([0] + [int(t.shape[0]) for t in padded])]
        for i, p in enumerate(self.params):
            if len(p.shape) == 0:
                ops.assign(p, parts[0][offsets[i]:offsets[i + 1]].reshape(()))
                continue
            block = self._block(tuple(p.shape))
            rows = [part[offsets[i]:offsets[i + 1]].reshape((block,) + tuple(p.shape[1:])) for part in parts]
            ops.assign(p, ops.concat(rows, 0)[:p.shape[0]])

    def shard_layout(self) -> dict[str, dict]:
        """Per-name global shape, row range and fragmentation for metadata.json (reference §3.4)."""
        return {p.name: {"global_shape": list(p.shape), "rows": list(b),
                         "axis_fragmentations": ([self.shard.size] + [1] * (len(p.shape) - 1)) if len(p.shape) else []}
                for p, b in zip(self.params, self.bounds)}


# ---------------------------------------------------------------- gradient norm


def param_replicas(groups: ParallelGroups, sharded_over: Sequence[str] = ()) -> int:
    """How many ranks hold an identical copy of a gradient: the product of the dense-mesh degrees
    (dp_replicate, dp_shard, cp, tp) it is *not* sharded over (PP stages hold different params)."""
    lay = groups.layout
    sizes = {"dp_replicate": lay.dp_replicate, "dp_shard": lay.dp_shard, "cp": lay.cp, "tp": lay.tp}
    if "ep" in sharded_over:  # expert weights: sharded over ep inside the (dp_shard, cp, tp) block
        block = lay.dp_shard * lay.cp * lay.tp
        return lay.dp_replicate * (block // max(lay.ep, 1))
    n = 1
    for axis, size in sizes.items():
        if axis not in sharded_over:
            n *= size
    return n


def global_grad_norm(grads: Sequence[Tensor], replicas: Sequence[int], groups: ParallelGroups) -> float:
    """sqrt(Σ_world Σ_i ‖g_i,local‖² / replicas_i): the norm of the full gradient, each copy counted once
    (the reference's rule, §2.6). `grads` are the post-sync local gradients."""
    total = None
    for g, r in zip(grads, replicas):
        g32 = g.astype(ms.float32)
        sq = (g32 * g32).sum() / float(r) if g.size else None
        if sq is not None:
            total = sq if total is None else total + sq
    if total is None:
        total = Tensor(np.zeros((), np.float32))
    total = comm.all_reduce(total.reshape(1), groups.world, "sum")
    return float(np.sqrt(total.asnumpy()[0]))
