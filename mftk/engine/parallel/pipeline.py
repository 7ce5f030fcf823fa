"""Pipeline parallel: GPipe, 1F1B and interleaved 1F1B schedules over point-to-point messages, stage backward by
`ms.vjp` (reference §1.3: the micro-batches of a step are its accumulation steps).

Virtual stages: with ``v`` chunks per rank (``pipeline_parallel_interleave_num``), chunk ``c`` of rank ``r`` is
virtual stage ``c·pp + r`` (reference's layer split); ``v = 1`` is plain pipelining. An action is
``(kind, micro, chunk)``. The first virtual stage gets each micro-batch's inputs, later ones receive the
previous stage's activation (every micro-batch's activation has the same agreed shape, and so does its
gradient). The last virtual stage returns the scalar micro-batch objective, already scaled by the caller
(``/ num_micro``, as the reference scales by ``sense/accum``); other stages may add a scalar term of their
own (MoE aux losses), whose cotangent is 1. Weight gradients are summed over micro-batches. The forward is
run again inside each backward (see `PipelineStage._backward`), so only stage inputs are kept.

Messages: sends are asynchronous (`isend`, waited at the end of the step) so no schedule order can block
on a send. Receives are matched by order, not by tag — MindSpore's CPU backend delivers the messages of
one sender in the order they were sent, whatever their tags (measured) — so each rank computes, from the
other ranks' schedules, the order in which each neighbour sends to it, and `Mailbox` receives in that
order and keeps what arrives early.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import mindspore as ms
from mindspore import Tensor, ops
from mindspore.mint import distributed as dist

from mftk.engine.parallel import comm
from mftk.engine.parallel.groups import AxisGroup

Action = tuple[str, int, int]  # ("F" | "B", micro-batch, chunk)
SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b")


def schedule_gpipe(num_micro: int) -> list[Action]:
    """All forwards, then all backwards (highest activation memory, simplest)."""
    return [("F", i, 0) for i in range(num_micro)] + [("B", i, 0) for i in range(num_micro)]


def schedule_1f1b(num_micro: int, pp: int, stage: int) -> list[Action]:
    """Warm-up forwards (pp − stage − 1), then one-forward-one-backward, then the remaining backwards."""
    warm = min(pp - stage - 1, num_micro)
    actions: list[Action] = [("F", i, 0) for i in range(warm)]
    f, b = warm, 0
    while f < num_micro:
        actions += [("F", f, 0), ("B", b, 0)]
        f, b = f + 1, b + 1
    actions += [("B", i, 0) for i in range(b, num_micro)]
    return actions


def schedule_interleaved(num_micro: int, pp: int, stage: int, chunks: int) -> list[Action]:
    """Megatron's interleaved 1F1B: micro-batches go through the chunks in groups of ``pp``; warm-up of
    ``2·(pp − stage − 1) + (chunks − 1)·pp`` forwards, then 1F1B, then the remaining backwards.
    Needs ``num_micro % pp == 0`` (as Megatron does)."""
    if num_micro % pp:
        raise ValueError(f"interleaved 1F1B needs the micro-batch count ({num_micro}) to be a multiple of "
                         f"pipeline_parallel ({pp})")
    total, group = num_micro * chunks, pp * chunks

    def action(kind: str, k: int) -> Action:
        in_group = k % group
        chunk = in_group // pp
        if kind == "B":
            chunk = chunks - 1 - chunk
        return kind, (k // group) * pp + in_group % pp, chunk

    warm = min(2 * (pp - stage - 1) + (chunks - 1) * pp, total)
    actions = [action("F", k) for k in range(warm)]
    for i in range(total - warm):
        actions += [action("F", warm + i), action("B", i)]
    actions += [action("B", k) for k in range(total - warm, total)]
    return actions


def make_schedule(name: str, num_micro: int, pp: int, stage: int, chunks: int = 1) -> list[Action]:
    key = (name or "1f1b").lower()
    if chunks > 1:
        if key not in ("1f1b", "interleaved_1f1b"):
            raise ValueError(f"pipeline schedule {name!r} does not interleave chunks (use interleaved_1f1b)")
        return schedule_interleaved(num_micro, pp, stage, chunks)
    if key == "gpipe":
        return schedule_gpipe(num_micro)
    if key == "1f1b":
        return schedule_1f1b(num_micro, pp, stage)
    raise ValueError(f"unsupported pipeline schedule {name!r} ({', '.join(SCHEDULES)})")


# ------------------------------------------------------------------------------ who sends what to whom
def virtual_stage(chunk: int, rank: int, pp: int) -> int:
    return chunk * pp + rank


def sends(schedule: Sequence[Action], rank: int, pp: int, chunks: int) -> list[tuple[int, tuple]]:
    """``(destination rank, message key)`` of every message ``rank`` sends, in order. Keys are
    ``("act", micro, receiving virtual stage)`` and ``("grad", micro, receiving virtual stage)``."""
    last = pp * chunks - 1
    out = []
    for kind, micro, chunk in schedule:
        vs = virtual_stage(chunk, rank, pp)
        if kind == "F" and vs < last:
            out.append(((vs + 1) % pp, ("act", micro, vs + 1)))
        elif kind == "B" and vs > 0:
            out.append(((vs - 1) % pp, ("grad", micro, vs - 1)))
    return out


class Mailbox:
    """Receives each neighbour's messages in the order it sends them; returns the one asked for."""

    def __init__(self, group: AxisGroup, expected: dict[int, list[tuple]], shape: Sequence[int], dtype) -> None:
        self.group, self.shape, self.dtype = group, tuple(shape), dtype
        self.expected = {src: list(keys) for src, keys in expected.items()}
        self.stash: dict[tuple, Tensor] = {}

    def get(self, src: int, key: tuple) -> Tensor:
        while key not in self.stash:
            queue = self.expected.get(src) or []
            if not queue:
                raise RuntimeError(f"pipeline: rank {src} never sends {key} (schedule mismatch)")
            self.stash[queue.pop(0)] = comm.recv(self.shape, self.dtype, src, self.group)
        return self.stash.pop(key)


# ------------------------------------------------------------------------------ one rank's stage
StageFn = Callable[[int, Any, int], Any]  # (chunk, x, micro) -> scalar (last virtual stage) or (y, extra scalar)


class PipelineStage:
    """Runs one rank's part of a schedule; `step` returns the summed weight gradients of every chunk.

    ``fn(chunk, x, micro)``: the chunk's forward on micro-batch ``micro`` (``x`` is the received activation,
    or a float zero on the first virtual stage so that its input is differentiable). ``params[c]``: chunk
    ``c``'s parameters (a parameter may appear in several chunks; its gradients are added)."""

    def __init__(self, fn: StageFn, params: Sequence[Sequence[ms.Parameter]], group: AxisGroup, *,
                 act_shape: Sequence[int], act_dtype=ms.float32) -> None:
        self.fn, self.params, self.group = fn, [list(p) for p in params], group
        self.act_shape, self.act_dtype = tuple(act_shape), act_dtype
        self.rank, self.pp, self.chunks = group.rank, group.size, len(self.params)
        self.last = self.pp * self.chunks - 1

    def is_last_virtual(self, chunk: int) -> bool:
        return virtual_stage(chunk, self.rank, self.pp) == self.last

    def step(self, num_micro: int, schedule_of: Callable[[int], Sequence[Action]]) -> dict[int, Tensor]:
        """Runs ``schedule_of(self.rank)``; ``schedule_of(r)`` must give every rank's schedule (to know
        the order of the messages). Returns ``id(param) → summed gradient``."""
        expected: dict[int, list[tuple]] = {}
        for r in range(self.pp):
            if r != self.rank:
                for dst, key in sends(schedule_of(r), r, self.pp, self.chunks):
                    if dst == self.rank:
                        expected.setdefault(r, []).append(key)
        mail = Mailbox(self.group, expected, self.act_shape, self.act_dtype)
        pending: list = []
        saved: dict[tuple[int, int], tuple] = {}
        grads: dict[int, Tensor] = {}
        for kind, micro, chunk in schedule_of(self.rank):
            vs = virtual_stage(chunk, self.rank, self.pp)
            if kind == "F":
                x = (Tensor(0.0, self.act_dtype) if vs == 0 else
                     mail.get((vs - 1) % self.pp, ("act", micro, vs)))
                out = self.fn(chunk, x, micro)
                if vs < self.last:
                    y = out[0]
                    pending.append((dist.isend(y, dst=self.group.ranks[(vs + 1) % self.pp], group=self.group.name), y))
                saved[(micro, chunk)] = (x,)
            else:
                (x,) = saved.pop((micro, chunk))
                dout = None if vs == self.last else mail.get((vs + 1) % self.pp, ("grad", micro, vs))
                dx, dw = self._backward(chunk, x, micro, dout)
                for p, g in zip(self.params[chunk], dw):
                    grads[id(p)] = g if id(p) not in grads else grads[id(p)] + g
                if vs > 0:
                    pending.append((dist.isend(dx, dst=self.group.ranks[(vs - 1) % self.pp], group=self.group.name),
                                    dx))
        for handle, _buffer in pending:  # the buffer stays referenced until its send completes
            if handle is not None:
                handle.wait()
        return grads

    def _backward(self, chunk: int, x, micro: int, dout) -> tuple[Any, list]:
        # PyNative keeps one differentiable graph at a time ("Can not find top cell for backward" when
        # 1F1B holds several), so the chunk's forward is recomputed here: full activation recompute.
        out, vjp_fn = ms.vjp(lambda a: self.fn(chunk, a, micro), x, weights=self.params[chunk])
        if dout is None:  # the last virtual stage: d(objective) = 1
            cotangent = ops.ones(out.shape, out.dtype)
        else:
            cotangent = (dout, ops.ones(out[1].shape, out[1].dtype))
        dx, dw = vjp_fn(cotangent)
        dx = dx[0] if isinstance(dx, (tuple, list)) else dx  # one input: some versions wrap it
        return dx, list(dw)


def split_micro_batches(t: Tensor, num_micro: int, dim: int = 0) -> list[Tensor]:
    """Equal micro-batches along `dim` (the reference concatenates `accum` micro-batches on dim 0)."""
    n = t.shape[dim]
    if n % num_micro:
        raise ValueError(f"dim {dim} of size {n} does not split into {num_micro} micro-batches")
    step = n // num_micro
    index = [slice(None)] * t.ndim
    out = []
    for i in range(num_micro):
        index[dim] = slice(i * step, (i + 1) * step)
        out.append(t[tuple(index)])
    return out
