"""Tensor parallel with sequence parallel: Megatron-style column/row linears, vocab-parallel
embedding and cross-entropy, over one TP `AxisGroup`.

Layouts (weights stored ``[out, in]`` like `layers.linear.Linear` and the checkpoints):
- column-parallel: ``weight[out/tp, in]`` (rows block ``tp_rank``); output features are split;
- row-parallel: ``weight[out, in/tp]`` (columns block ``tp_rank``); output is a partial sum;
- vocab-parallel embedding: ``weight[V/tp, H]``, this rank owns ids ``[r·V/tp, (r+1)·V/tp)``.

Sequence parallel keeps activations between blocks split along the sequence (``seq_dim``, 1 for
``[B, S, H]``): a column linear all-gathers the sequence first (backward: reduce-scatter), a row
linear reduce-scatters its partial output (backward: all-gather). Replicated parameters that
see only this rank's tokens under SP (norm weights, row-linear biases) then hold partial
gradients: `sp_param_names` lists them and `data_parallel.sync_sequence_parallel_grads` sums them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mftk.engine.parallel import comm
from mftk.engine.parallel.groups import AxisGroup


def shard(array: np.ndarray, group: AxisGroup, dim: int) -> np.ndarray:
    """This rank's contiguous block of a full numpy array along `dim`."""
    if array.shape[dim] % group.size:
        raise ValueError(f"dim {dim} of shape {array.shape} does not split over tp={group.size}")
    return np.split(array, group.size, axis=dim)[group.rank]


def shard_fused(array: np.ndarray, sizes: Sequence[int], group: AxisGroup, dim: int = 0) -> np.ndarray:
    """Shard a fused weight (e.g. ``[q; k; v]`` or ``[gate; up]`` along `dim`) piece by piece, so each
    rank gets its block of every piece rather than a block of the concatenation."""
    pieces = np.split(array, np.cumsum(sizes)[:-1], axis=dim)
    return np.concatenate([shard(p, group, dim) for p in pieces], axis=dim)


class ColumnParallelLinear(nn.Cell):
    """``y[..., out/tp] = x @ W_localᵀ``; input replicated, or sequence-split when `sequence_parallel`."""

    def __init__(self, in_dim: int, out_dim: int, group: AxisGroup, *, bias: bool = False,
                 sequence_parallel: bool = False, gather_output: bool = False, seq_dim: int = 1) -> None:
        super().__init__()
        if out_dim % group.size:
            raise ValueError(f"out_dim {out_dim} does not split over tp={group.size}")
        self.in_dim, self.out_local = in_dim, out_dim // group.size
        self.weight = Parameter(Tensor(np.zeros((self.out_local, in_dim), np.float32)), name="weight")
        self.bias = Parameter(Tensor(np.zeros((self.out_local,), np.float32)), name="bias") if bias else None
        self.enter = comm.GatherFromGroup(group, seq_dim) if sequence_parallel else comm.CopyToGroup(group)
        self.leave = comm.GatherReplicated(group, -1) if gather_output else None
        self._mm = ops.MatMul(transpose_b=True)

    def construct(self, x):
        x = self.enter(x)  # (B, S, in) full sequence
        lead = x.shape[:-1]
        y = self._mm(x.reshape(-1, self.in_dim), self.weight)
        if self.bias is not None:
            y = y + self.bias
        y = y.reshape(*lead, self.out_local)
        return self.leave(y) if self.leave is not None else y


class RowParallelLinear(nn.Cell):
    """``y = Σ_tp x_local @ W_localᵀ``; output replicated, or sequence-split when `sequence_parallel`."""

    def __init__(self, in_dim: int, out_dim: int, group: AxisGroup, *, bias: bool = False,
                 sequence_parallel: bool = False, seq_dim: int = 1) -> None:
        super().__init__()
        if in_dim % group.size:
            raise ValueError(f"in_dim {in_dim} does not split over tp={group.size}")
        self.in_local, self.out_dim = in_dim // group.size, out_dim
        self.weight = Parameter(Tensor(np.zeros((out_dim, self.in_local), np.float32)), name="weight")
        self.bias = Parameter(Tensor(np.zeros((out_dim,), np.float32)), name="bias") if bias else None
        self.leave = comm.ReduceScatterToGroup(group, seq_dim) if sequence_parallel else comm.ReduceFromGroup(group)
        self.sequence_parallel = sequence_parallel
        self._mm = ops.MatMul(transpose_b=True)

    def construct(self, x):
        lead = x.shape[:-1]
        y = self._mm(x.reshape(-1, self.in_local), self.weight).reshape(*lead, self.out_dim)
        y = self.leave(y)
        if self.bias is not None:
            y = y + self.bias
        return y


class VocabParallelEmbedding(nn.Cell):
    """Lookup in this rank's vocabulary block, zero elsewhere, summed over TP (reduce-scattered
    along the sequence under SP)."""

    def __init__(self, vocab_size: int, hidden_size: int, group: AxisGroup, *, sequence_parallel: bool = False,
                 seq_dim: int = 1) -> None:
        super().__init__()
        if vocab_size % group.size:
            raise ValueError(f"vocab_size {vocab_size} does not split over tp={group.size}")
        self.v_local = vocab_size // group.size
        self.start = group.rank * self.v_local
        self.weight = Parameter(Tensor(np.zeros((self.v_local, hidden_size), np.float32)), name="weight")
        self.leave = comm.ReduceScatterToGroup(group, seq_dim) if sequence_parallel else comm.ReduceFromGroup(group)

    def construct(self, ids):
        local = ids - self.start
        mask = (local >= 0) & (local < self.v_local)
        local = ops.where(mask, local, ops.zeros_like(local))
        h = ops.gather(self.weight, local, 0) * mask.astype(self.weight.dtype).expand_dims(-1)  # (B, S, H)
        return self.leave(h)


class VocabParallelCrossEntropy(nn.Cell):
    """Per-token ``logsumexp(z) − z_label`` with the vocabulary split over TP.

    logits ``(N, V/tp)`` (this rank's block), labels ``(N,)`` global ids (−100 allowed; the caller
    masks them). The max and the exp-sum are all-reduced; the gradient is ``softmax − onehot``
    on this rank's block, recomputed in `bprop` so no state is kept between forward and backward.
    """

    def __init__(self, group: AxisGroup) -> None:
        super().__init__()
        self.group = group

    def _parts(self, logits, labels):
        v_local = logits.shape[-1]
        start = self.group.rank * v_local
        zmax = comm.all_reduce(ops.stop_gradient(logits.max(axis=-1, keepdims=True)), self.group, "max")
        z = logits - zmax  # (N, V/tp)
        sumexp = comm.all_reduce(ops.exp(z).sum(-1, keepdims=True), self.group)  # (N, 1)
        local = labels.reshape(-1, 1) - start
        mask = (local >= 0) & (local < v_local)
        safe = ops.where(mask, local, ops.zeros_like(local))
        return z, sumexp, safe, mask

    def construct(self, logits, labels):
        z, sumexp, safe, mask = self._parts(logits, labels)
        picked = ops.gather_elements(z, 1, safe) * mask.astype(z.dtype)  # (N, 1)
        picked = comm.all_reduce(picked, self.group)
        return (ops.log(sumexp) - picked).reshape(-1)

    def bprop(self, logits, labels, out, dout):
        z, sumexp, safe, mask = self._parts(logits, labels)
        grad = ops.exp(z) / sumexp
        onehot = ops.one_hot(safe.reshape(-1), z.shape[-1], Tensor(1.0, z.dtype), Tensor(0.0, z.dtype))
        grad = (grad - onehot * mask.astype(z.dtype)) * dout.reshape(-1, 1)
        return grad, ops.zeros_like(labels)


def vocab_parallel_masked_mean_ce(logits_local, labels, loss_mask, ce: VocabParallelCrossEntropy, eps: float = 1e-8):
    """Masked-mean CE like `layers.loss.masked_mean_ce`, with vocab-parallel logits ``(B, S, V/tp)`` — the
    plain form of what `GPTModel.head_loss` computes under TP (the TP parity jobs check the parts with it)."""
    labels = labels.reshape(-1)
    m = loss_mask.reshape(-1).astype(logits_local.dtype) * (labels != -100).astype(logits_local.dtype)
    tok = ce(logits_local.reshape(-1, logits_local.shape[-1]), labels)
    return (tok * m).sum() / (m.sum() + eps)


def sp_param_names(cell: nn.Cell, replicated_suffixes: Sequence[str] = ("norm.weight", "layernorm.weight")) -> list[str]:
    """Names of parameters whose gradients are partial per TP rank under SP: row-parallel biases and
    replicated norm weights (by name suffix)."""
    names = []
    for name, sub in cell.cells_and_names():
        if isinstance(sub, RowParallelLinear) and sub.sequence_parallel and sub.bias is not None:
            names.append(sub.bias.name)
    for p in cell.get_parameters():
        if p.name.endswith(tuple(replicated_suffixes)) and p.name not in names:
            names.append(p.name)
    return names
