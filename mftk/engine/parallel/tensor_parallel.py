"""Tensor parallel with sequence parallel, applied to a built model's plain cells (Megatron's layouts,
torchtitan's "parallel styles").

Weights are stored ``[out, in]`` (`layers.linear.Linear`, the checkpoints), so:
- column-wise: keep a row block of ``weight`` (and ``bias``): this rank computes a block of the outputs;
- row-wise: keep a column block of ``weight``: this rank's output is a partial sum;
- vocabulary-parallel embedding / LM head: rows ``[r·V/tp, (r+1)·V/tp)`` of the table.

Sequence parallel keeps the activations between blocks split along the sequence (dim 1 of ``(B, S, H)``):
a column-wise cell gathers the sequence first (backward: reduce-scatter), a row-wise cell reduce-scatters
its partial output (backward: all-gather). Every parameter left whole sees only this rank's tokens, so its
gradient is partial: the trainer sums those over TP (`distributed.DistContext.sync_grads`). No cell uses
Megatron's ``f`` (identity forward, all-reduce backward) — that sum would count them twice.

`Sharded` runs the plain cell's own forward between the communication steps, holding its (cut)
parameters under their own names, so layers need no parallel code and checkpoints keep the reference's
names (`parallelize.rename_parameters`).
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mftk.engine.parallel import comm
from mftk.engine.parallel.groups import AxisGroup

SEQ_DIM = 1  # activations are (B, S, H)


def block(array: np.ndarray, group: AxisGroup, dim: int) -> np.ndarray:
    """This rank's contiguous block of a full numpy array along ``dim``."""
    if array.shape[dim] % group.size:
        raise ValueError(f"dim {dim} of shape {array.shape} does not split over {group.size} ranks")
    return np.ascontiguousarray(np.split(array, group.size, axis=dim)[group.rank])


def cut_parameter(p: Parameter, group: AxisGroup, dim: int) -> None:
    """Keep this rank's block of ``p`` along ``dim`` (in place: the same Parameter object, a smaller tensor)."""
    p.set_data(Tensor(block(p.asnumpy(), group, dim)))


class Sharded(nn.Cell):
    """A plain cell's forward between an ``enter`` and a ``leave`` communication step.

    The plain cell's parameters are adopted under their attribute names (so the parameter names stay
    the plain cell's); its forward runs as a bound function, not as a child cell. ``bias``: a row-wise
    cell's bias, added after the reduction (inside, it would be summed once per rank)."""

    def __init__(self, plain: nn.Cell, *, enter: nn.Cell | None = None, leave: nn.Cell | None = None,
                 bias: Parameter | None = None) -> None:
        super().__init__()
        for name, p in plain.parameters_and_names(expand=False):
            setattr(self, name.rsplit(".", 1)[-1], p)
        if bias is not None:
            self.bias = bias
        self._add_bias = bias is not None
        self._forward = plain.construct  # a bound method: plain stays out of the cell tree
        self.enter, self.leave = enter, leave

    def construct(self, x):
        if self.enter is not None:
            x = self.enter(x)
        y = self._forward(x)
        if self.leave is not None:
            y = self.leave(y)
        if self._add_bias:
            y = y + self.bias
        return y


def columnwise(linear: nn.Cell, group: AxisGroup, *, gather_input: bool) -> Sharded:
    """Row block of ``weight`` (and ``bias``); ``gather_input``: the input is sequence-split (SP)."""
    cut_parameter(linear.weight, group, 0)
    if getattr(linear, "bias", None) is not None:
        cut_parameter(linear.bias, group, 0)
    return Sharded(linear, enter=comm.GatherFromGroup(group, SEQ_DIM) if gather_input else None)


def rowwise(linear: nn.Cell, group: AxisGroup) -> Sharded:
    """Column block of ``weight``; the partial outputs are reduce-scattered along the sequence (SP)."""
    cut_parameter(linear.weight, group, 1)
    bias = getattr(linear, "bias", None)
    if bias is not None:
        linear.bias = None
    return Sharded(linear, leave=comm.ReduceScatterToGroup(group, SEQ_DIM), bias=bias)


def replicated(cell: nn.Cell, group: AxisGroup) -> Sharded:
    """Whole weights on the whole sequence: the sequence-split input is gathered first (MLA's latent
    down-projection, whose outputs feed column-wise up-projections without another gather)."""
    return Sharded(cell, enter=comm.GatherFromGroup(group, SEQ_DIM))


def columnwise_gathered(linear: nn.Cell, group: AxisGroup) -> Sharded:
    """Row block of ``weight`` on a whole (already gathered) input, the output blocks all-gathered along the last
    dim (backward: the summed gradient's block): DeepSeek-V4's query up-projection, whose heads the replicated
    compressed attention reads all of (mindformers 2.1.0 pynative/base_models/gpt/parallelize.py,
    ``_DSv4QUpParallel``: ColwiseParallel with ``gather_output``)."""
    cut_parameter(linear.weight, group, 0)
    if getattr(linear, "bias", None) is not None:
        cut_parameter(linear.bias, group, 0)
    return Sharded(linear, leave=comm.GatherFromGroup(group, -1))


def gather_sequence_after(cell: nn.Cell, group: AxisGroup) -> Sharded:
    """``cell`` on this rank's positions, its output all-gathered along the sequence (backward: the summed
    gradient's block): the entry of a block that runs whole on the full sequence."""
    return Sharded(cell, leave=comm.GatherFromGroup(group, SEQ_DIM))


def keep_sequence_block_after(cell: nn.Cell, group: AxisGroup) -> Sharded:
    """``cell`` on the full sequence (every rank alike), keeping this rank's positions (`comm.KeepSlice`): the
    exit of a block that runs whole on the full sequence."""
    return Sharded(cell, leave=comm.KeepSlice(group, SEQ_DIM))


class ScaleGradient(nn.Cell):
    """Identity forward; the gradient times ``factor`` backward. A loss every TP rank computes alike from whole
    parameters (DeepSeek-V4's indexer KL under TP) enters each rank's objective with its gradient divided by
    tp, so the sum over TP of the whole parameters' gradients is the single-process one; its value (the
    logged loss) is unchanged."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = float(factor)

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (dout * self.factor,)


class VocabParallelEmbedding(nn.Cell):
    """Lookup in this rank's vocabulary block, zero elsewhere, reduce-scattered along the sequence (SP)."""

    def __init__(self, plain: nn.Cell, group: AxisGroup) -> None:
        super().__init__()
        cut_parameter(plain.weight, group, 0)
        self.weight = plain.weight
        self.v_local = int(plain.weight.shape[0])
        self.start = group.rank * self.v_local
        self.leave = comm.ReduceScatterToGroup(group, SEQ_DIM)

    def construct(self, ids):
        local = ids - self.start
        mask = (local >= 0) & (local < self.v_local)
        local = ops.where(mask, local, ops.zeros_like(local))
        h = ops.gather(self.weight, local, 0) * mask.astype(self.weight.dtype).expand_dims(-1)  # (B, S, H)
        return self.leave(h)


class VocabParallelCrossEntropy(nn.Cell):
    """Per-token ``logsumexp(z) − z_label`` with the vocabulary split over TP.

    logits ``(N, V/tp)`` (this rank's block), labels ``(N,)`` global ids (out-of-range ones — another rank's,
    or ignored — contribute no picked logit; the caller weights ignored tokens 0). The max and the exp-sum
    are all-reduced; the gradient is ``softmax − onehot`` on this rank's block. Returns ``(loss, z, sumexp)``:
    the shifted logits and the exp-sum ride along as outputs only so the backward needs no collective of
    its own (callers use ``[0]``; their gradients are ignored).
    """

    def __init__(self, group: AxisGroup) -> None:
        super().__init__()
        self.group = group

    def _labels(self, labels, v_local: int):
        local = labels.reshape(-1, 1) - self.group.rank * v_local
        mask = (local >= 0) & (local < v_local)
        return ops.where(mask, local, ops.zeros_like(local)), mask

    def construct(self, logits, labels):
        zmax = comm.all_reduce(ops.stop_gradient(logits.max(axis=-1, keepdims=True)), self.group, "max")
        z = logits - zmax  # (N, V/tp)
        sumexp = comm.all_reduce(ops.exp(z).sum(-1, keepdims=True), self.group)  # (N, 1)
        safe, mask = self._labels(labels, logits.shape[-1])
        picked = comm.all_reduce(ops.gather_elements(z, 1, safe) * mask.astype(z.dtype), self.group)  # (N, 1)
        return (ops.log(sumexp) - picked).reshape(-1), z, sumexp

    def bprop(self, logits, labels, out, dout):
        z, sumexp, dloss = out[1], out[2], dout[0]
        safe, mask = self._labels(labels, z.shape[-1])
        onehot = ops.one_hot(safe.reshape(-1), z.shape[-1], Tensor(1.0, z.dtype), Tensor(0.0, z.dtype))
        grad = (ops.exp(z) / sumexp - onehot * mask.astype(z.dtype)) * dloss.reshape(-1, 1)
        return grad, ops.zeros_like(labels)


class VocabParallelHeadLoss(nn.Cell):
    """`layers.loss.HeadLoss` with this rank's vocabulary block of the head: the sequence-split ``h`` is
    gathered, this rank's logits ``(N, V/tp)`` computed and the vocabulary-parallel CE weighted and summed
    (the same value on every TP rank)."""

    def __init__(self, group: AxisGroup) -> None:
        super().__init__()
        self.enter = comm.GatherFromGroup(group, SEQ_DIM)
        self.ce = VocabParallelCrossEntropy(group)
        self._mm = ops.MatMul(transpose_b=True)

    def construct(self, h, weight, labels, weights):
        h = self.enter(h)
        logits = self._mm(h.reshape(-1, h.shape[-1]), weight)  # (N, V/tp)
        return (self.ce(logits, labels)[0] * weights).sum()


def vocab_parallel_masked_mean_ce(logits_local, labels, loss_mask, ce: VocabParallelCrossEntropy, eps: float = 1e-8):
    """Masked-mean CE like `layers.loss.masked_mean_ce`, with vocab-parallel logits ``(B, S, V/tp)`` (the
    plain form the TP parity job checks `VocabParallelCrossEntropy` with)."""
    labels = labels.reshape(-1)
    m = loss_mask.reshape(-1).astype(logits_local.dtype) * (labels != -100).astype(logits_local.dtype)
    tok = ce(logits_local.reshape(-1, logits_local.shape[-1]), labels)[0]
    return (tok * m).sum() / (m.sum() + eps)
