"""Collectives that work between CPU msrun workers (mccl), each on any `AxisGroup`.

Chosen from what was measured to work on CPU (mindspore-cpu.md §4, §10):

| need            | implementation here                                            |
|-----------------|----------------------------------------------------------------|
| all_reduce      | `mint.distributed.all_reduce` on a copy (sum/avg/max; subgroups) |
| all_gather      | `mint.distributed.all_gather` list form, then concat            |
| reduce_scatter  | all_reduce + own slice (no CPU kernel for the real one)         |
| all_to_all      | all_gather + own slices (world× traffic; no CPU kernel)          |
| broadcast       | `mint.distributed.broadcast` (subgroups ok)                     |
| send / recv     | `mint.distributed.send/recv` (needs `launch.init_distributed`'s patch) |
| barrier         | 1-element all_reduce + `.asnumpy()` (`barrier()` is a no-op)    |

Every function is the identity on a size-1 group, so single-process code paths need no branches.
`CLOCK` adds up the wall time spent inside the collectives of this process (they are synchronous
under ``launch_blocking``, so it includes waiting for the other ranks) and counts them: the trainer
reports both per step (``time_collectives_ms``, ``collectives``), wherever the collective ran (model
forward/backward or gradient sync).
The plain functions do not take part in autograd; the `*Cell` classes at the bottom do (custom
`bprop`, the Megatron f/g pattern), for use inside model forwards.
"""
from __future__ import annotations

import time
from typing import Sequence

from mindspore import Tensor, nn, ops
from mindspore.mint import distributed as dist

from mftk.engine.heartbeat import BEAT
from mftk.engine.parallel.groups import AxisGroup

_OPS = ("sum", "avg", "max", "min")


class _Clock:
    """Seconds spent in collectives by this process, and how many were called (both only grow)."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def run(self, fn, *args, **kw):
        t = time.perf_counter()
        previous = BEAT.enter_collective()  # the hang watchdog's view: inside a collective, and how many so far
        try:
            return fn(*args, **kw)
        finally:
            BEAT.leave_collective(previous)
            self.seconds += time.perf_counter() - t
            self.calls += 1


CLOCK = _Clock()


def all_reduce(t: Tensor, group: AxisGroup, op: str = "sum") -> Tensor:
    """Element-wise reduction over the group; returns a new tensor."""
    if op not in _OPS:
        raise ValueError(f"all_reduce op must be one of {_OPS}, got {op!r}")
    if group.is_trivial:
        return t
    out = ops.zeros_like(t) + t  # a fresh buffer: the collective writes in place
    CLOCK.run(dist.all_reduce, out, op=op, group=group.name)
    return out


REDUCE_CHUNK = 1 << 22  # elements per message of `all_reduce_numpy` (16 MiB of fp32)


def all_reduce_numpy(a, group: AxisGroup, op: str = "sum"):
    """A float32 numpy array reduced over the group in its own memory, ``REDUCE_CHUNK`` elements per message.

    In place (``Tensor.from_numpy`` shares the array's memory on CPU and the collective writes into it), and in
    chunks because mccl's all-reduce allocates 1.5–2.5× its message in buffers of its own (measured on 19 MiB
    messages): one whole-model message would add that much to the peak. Returns the result (the same array
    where the memory is shared)."""
    import numpy as np

    if op not in _OPS:
        raise ValueError(f"all_reduce op must be one of {_OPS}, got {op!r}")
    if group.is_trivial or not a.size:
        return a
    a = np.ascontiguousarray(a, np.float32)
    flat = a.reshape(-1)
    # a view of memory numpy does not own (a framework tensor's ``asnumpy``) goes through an owned staging
    # chunk: ``Tensor.from_numpy`` of a part of such a view at an offset reads nothing (mccl: "dest size is 0")
    staged = not a.flags["OWNDATA"] and a.base is not None and not _numpy_owned(a)
    stage = np.empty(min(a.size, REDUCE_CHUNK), np.float32) if staged else None
    for start in range(0, a.size, REDUCE_CHUNK):
        part = flat[start:start + REDUCE_CHUNK]
        if stage is not None:
            view = part
            part = stage[:view.size]
            np.copyto(part, view)
        t = Tensor.from_numpy(part)
        CLOCK.run(dist.all_reduce, t, op=op, group=group.name)
        done = t.asnumpy()
        if not np.shares_memory(done, part):  # a backend that did not write in place
            part[...] = done
        if stage is not None:
            np.copyto(view, part)
    return a


def _numpy_owned(a) -> bool:
    """Whether the memory under view ``a`` belongs to a numpy array (the end of its ``base`` chain)."""
    import numpy as np

    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base, np.ndarray) and base.flags["OWNDATA"]


def all_gather_rows(a, group: AxisGroup):
    """Every member's row block of a numpy array (same shape on each), stacked along dim 0 in group-rank order
    into one new array, ``REDUCE_CHUNK`` elements per message: no concatenated copy and no whole-tensor message
    buffers beside the result (FSDP's per-unit gather)."""
    import numpy as np

    a = np.ascontiguousarray(a)
    if group.is_trivial:
        return a.copy()
    rows = a.shape[0]
    out = np.empty((rows * group.size,) + a.shape[1:], a.dtype)
    per_row = max(int(np.prod(a.shape[1:])), 1)
    step = max(REDUCE_CHUNK // per_row, 1)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        parts = all_gather_list(Tensor.from_numpy(a[start:stop]), group)
        for r, part in enumerate(parts):
            out[r * rows + start:r * rows + stop] = part.asnumpy()
    return out


def packs(arrays) -> list[list[int]]:
    """Consecutive indices of ``arrays`` grouped into messages of at most ``REDUCE_CHUNK`` elements of one
    dtype (an array larger than that stands alone): a unit of a small model is a dozen small tensors, and
    on CPU every collective costs a round trip through all ranks, whatever its size."""
    out: list[list[int]] = []
    n, dtype = 0, None
    for i, a in enumerate(arrays):
        if out and out[-1] and (n + a.size > REDUCE_CHUNK or a.dtype != dtype):
            out.append([])
            n = 0
        if not out:
            out.append([])
        out[-1].append(i)
        n, dtype = n + a.size, a.dtype
    return out


def all_gather_rows_many(arrays, group: AxisGroup) -> list:
    """`all_gather_rows` of several numpy arrays, the small ones packed into one message (`packs`)."""
    import numpy as np

    if group.is_trivial:
        return [np.array(a) for a in arrays]
    out = []
    for pack in packs(arrays):
        if len(pack) == 1:
            out.append(all_gather_rows(arrays[pack[0]], group))
            continue
        flat = np.concatenate([np.ascontiguousarray(arrays[i]).reshape(-1) for i in pack])
        parts = [p.asnumpy() for p in all_gather_list(Tensor.from_numpy(flat), group)]
        off = 0
        for i in pack:
            a = arrays[i]
            out.append(np.concatenate([p[off:off + a.size].reshape(a.shape) for p in parts]))
            off += a.size
    return out


def all_reduce_many(arrays, group: AxisGroup, op: str = "sum") -> list:
    """`all_reduce_numpy` of several float32 numpy arrays: one message per pack of small ones (the results
    are views of the packed copy), a large one reduced alone in its own memory."""
    import numpy as np

    if group.is_trivial or not arrays:
        return list(arrays)
    out = []
    for pack in packs(arrays):
        if len(pack) == 1:
            out.append(all_reduce_numpy(arrays[pack[0]], group, op))
            continue
        flat = all_reduce_numpy(np.concatenate([np.asarray(arrays[i], np.float32).reshape(-1) for i in pack]),
                                group, op)
        off = 0
        for i in pack:
            out.append(flat[off:off + arrays[i].size].reshape(arrays[i].shape))
            off += arrays[i].size
    return out


def all_gather(t: Tensor, group: AxisGroup, dim: int = 0) -> Tensor:
    """Concatenate every member's (same-shaped) tensor along `dim`, in group-rank order."""
    parts = all_gather_list(t, group)
    return parts[0] if len(parts) == 1 else ops.concat(parts, axis=dim)


def all_gather_list(t: Tensor, group: AxisGroup) -> list[Tensor]:
    if group.is_trivial:
        return [t]
    parts = [ops.zeros(t.shape, t.dtype) for _ in range(group.size)]
    CLOCK.run(dist.all_gather, parts, t, group=group.name)
    return parts


def split(t: Tensor, group: AxisGroup, dim: int = 0) -> Tensor:
    """This member's contiguous 1/size slice of `t` along `dim` (size must divide it)."""
    if group.is_trivial:
        return t
    n = t.shape[dim]
    if n % group.size:
        raise ValueError(f"dim {dim} of size {n} does not split evenly over {group.size} ranks")
    step = n // group.size
    index = [slice(None)] * t.ndim
    index[dim] = slice(group.rank * step, (group.rank + 1) * step)
    return t[tuple(index)]


def reduce_scatter(t: Tensor, group: AxisGroup, dim: int = 0, op: str = "sum") -> Tensor:
    """Reduce over the group and keep this member's slice along `dim` (all_reduce + slice on CPU)."""
    return split(all_reduce(t, group, op), group, dim)


def broadcast(t: Tensor, group: AxisGroup, src_index: int = 0) -> Tensor:
    """Every member gets the tensor of group member `src_index` (an index into `group.ranks`)."""
    if group.is_trivial:
        return t
    out = ops.zeros_like(t) + t
    CLOCK.run(dist.broadcast, out, src=group.ranks[src_index], group=group.name)
    return out


def all_to_all(t: Tensor, group: AxisGroup, split_dim: int, concat_dim: int) -> Tensor:
    """Member i sends chunk j of `t` (split along `split_dim`) to member j; received chunks are
    concatenated along `concat_dim` in sender order. Emulated with an all_gather (world× traffic)."""
    if group.is_trivial:
        return t
    gathered = all_gather_list(t, group)
    mine = [split(g, group, split_dim) for g in gathered]
    return ops.concat(mine, axis=concat_dim)


def all_to_all_uneven(t: Tensor, send_counts: Sequence[int], group: AxisGroup) -> tuple[Tensor, list[int]]:
    """Variable-size all_to_all along dim 0 (MoE dispatch): rows [Σcounts[:j], Σcounts[:j+1]) go to member j.

    Emulation: all_gather the counts, pad every send buffer to the largest total, all_gather the
    buffers, and cut out the rows addressed to this member. Returns (rows received in sender
    order, number received from each sender).
    """
    import numpy as np

    if group.is_trivial:
        return t, [int(send_counts[0])]
    counts = all_gather(Tensor(np.asarray(send_counts, np.int32)).reshape(1, -1), group, 0).asnumpy()
    totals = counts.sum(1)
    pad = int(totals.max())
    if pad == 0:
        return t[:0], [0] * group.size
    rows = t.shape[0]
    buf = t if rows == pad else ops.concat([t, ops.zeros((pad - rows,) + tuple(t.shape[1:]), t.dtype)], 0)
    parts = all_gather_list(buf, group)
    me = group.rank
    pieces, received = [], []
    for sender, part in enumerate(parts):
        start = int(counts[sender, :me].sum())
        n = int(counts[sender, me])
        received.append(n)
        if n:
            pieces.append(part[start:start + n])
    out = ops.concat(pieces, 0) if pieces else t[:0]
    return out, received


def send(t: Tensor, dst_index: int, group: AxisGroup, tag: int = 0) -> None:
    """Point-to-point send to group member `dst_index` (pipeline stages)."""
    CLOCK.run(dist.send, t, dst=group.ranks[dst_index], group=group.name, tag=tag)


def recv(shape: Sequence[int], dtype, src_index: int, group: AxisGroup, tag: int = 0) -> Tensor:
    """Receive a tensor of a pre-agreed shape from group member `src_index`."""
    buf = ops.zeros(tuple(shape), dtype)
    CLOCK.run(dist.recv, buf, src=group.ranks[src_index], group=group.name, tag=tag)
    return buf


def barrier(group: AxisGroup) -> None:
    """A real barrier: `mint.distributed.barrier()` is a no-op on CPU."""
    import numpy as np

    if not group.is_trivial:
        all_reduce(Tensor(np.zeros((1,), np.float32)), group).asnumpy()


# ---------------------------------------------------------------- autograd-aware (custom bprop)


class CopyToGroup(nn.Cell):
    """Megatron's f: identity forward, all-reduce (sum) of the gradient backward."""

    def __init__(self, group: AxisGroup) -> None:
        super().__init__()
        self.group = group

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (all_reduce(dout, self.group),)


class ReduceFromGroup(nn.Cell):
    """Megatron's g: all-reduce (sum) forward, identity backward."""

    def __init__(self, group: AxisGroup) -> None:
        super().__init__()
        self.group = group

    def construct(self, x):
        return all_reduce(x, self.group)

    def bprop(self, x, out, dout):
        return (dout,)


class GatherFromGroup(nn.Cell):
    """All-gather along `dim` forward; backward keeps this rank's slice of the summed gradient.

    Used for sequence parallel (gather the sequence before a column-parallel linear): each rank's
    gradient for the full sequence is partial, so the slice must be of the sum (reduce-scatter).
    """

    def __init__(self, group: AxisGroup, dim: int) -> None:
        super().__init__()
        self.group, self.dim = group, dim

    def construct(self, x):
        return all_gather(x, self.group, self.dim)

    def bprop(self, x, out, dout):
        return (reduce_scatter(dout, self.group, self.dim),)


class ReduceScatterToGroup(nn.Cell):
    """Reduce-scatter along `dim` forward (after a row-parallel linear under SP); all-gather backward."""

    def __init__(self, group: AxisGroup, dim: int) -> None:
        super().__init__()
        self.group, self.dim = group, dim

    def construct(self, x):
        return reduce_scatter(x, self.group, self.dim)

    def bprop(self, x, out, dout):
        return (all_gather(dout, self.group, self.dim),)


class ScatterToGroup(nn.Cell):
    """Keep this rank's slice along `dim` forward (enter SP/CP); all-gather the gradient backward."""

    def __init__(self, group: AxisGroup, dim: int) -> None:
        super().__init__()
        self.group, self.dim = group, dim

    def construct(self, x):
        return split(x, self.group, self.dim)

    def bprop(self, x, out, dout):
        return (all_gather(dout, self.group, self.dim),)


class KeepSlice(ScatterToGroup):
    """Keep this rank's slice along `dim` of a tensor every rank of the group computed alike (a block run whole
    on the gathered sequence, DeepSeek-V4's attention under TP); backward: this slice's gradient, zeros
    elsewhere. Each rank's gradients inside the replicated block are then its part of the sum: the whole
    parameters' are summed over TP like every other whole parameter's, and the `GatherFromGroup` that entered
    the block reduce-scatters its input's."""

    def bprop(self, x, out, dout):
        if self.group.size <= 1:
            return (dout,)
        parts = [ops.zeros(dout.shape, dout.dtype) for _ in range(self.group.size)]
        parts[self.group.rank] = dout
        return (ops.concat(parts, axis=self.dim),)


class GatherReplicated(nn.Cell):
    """All-gather along `dim` forward where every rank computes the same loss from the result
    (e.g. leaving SP before a replicated loss); backward takes this rank's slice of the gradient as is."""

    def __init__(self, group: AxisGroup, dim: int) -> None:
        super().__init__()
        self.group, self.dim = group, dim

    def construct(self, x):
        return all_gather(x, self.group, self.dim)

    def bprop(self, x, out, dout):
        return (split(dout, self.group, self.dim),)


class AllToAllUneven(nn.Cell):
    """`all_to_all_uneven` with autograd: rows ``x`` go out by ``send_counts`` (an int32 tensor, one per
    member); the gradient of what was received travels back by the counts each member received.

    Counts are tensor inputs (not attributes) so one cell can serve many calls in one forward: `bprop`
    gets the counts of its own call. Returns only the received rows; `received_counts` tells how many
    came from each sender (all_gather of the counts, cheap next to the rows).
    """

    def __init__(self, group: AxisGroup) -> None:
        super().__init__()
        self.group = group

    def construct(self, x, send_counts):
        out, _ = all_to_all_uneven(x, [int(c) for c in send_counts.asnumpy()], self.group)
        return out

    def bprop(self, x, send_counts, out, dout):
        back = received_counts(send_counts, self.group)
        grad, _ = all_to_all_uneven(dout, back, self.group)
        return grad, ops.zeros_like(send_counts)


def received_counts(send_counts: Tensor, group: AxisGroup) -> list[int]:
    """How many rows this member gets from each member when every member sends by its ``send_counts``."""
    counts = all_gather(send_counts.reshape(1, -1), group, 0).asnumpy()  # (size, size): [sender, receiver]
    return [int(c) for c in counts[:, group.rank]]
