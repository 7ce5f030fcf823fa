"""Pipeline parallel: GPipe and 1F1B schedules over point-to-point send/recv, stage backward by `ms.vjp`.

A stage is a function ``fn(x, *extra) -> y`` over the stage's parameters. The first stage gets
each micro-batch's inputs, later stages receive the previous stage's activation (shape agreed up
front: activations of every micro-batch have the same shape). The last stage returns the scalar
micro-batch loss; its cotangent is 1, so callers scale the loss (``/ num_micro``) themselves,
exactly as the reference scales by ``sense/accum``. Weight gradients are summed over micro-batches.
The forward is run again inside each backward (see `_backward`), so only stage inputs are kept.

Sends are asynchronous (`isend`, waited at the end of the step) so the 1F1B order, in which a
stage sends its next activation while its neighbour is sending a gradient back, cannot deadlock.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import mindspore as ms
from mindspore import Tensor, ops
from mindspore.mint import distributed as dist

from mftk.engine.parallel import comm
from mftk.engine.parallel.groups import AxisGroup, StagePosition

Action = tuple[str, int]  # ("F" | "B", micro-batch index)


def schedule_gpipe(num_micro: int) -> list[Action]:
    """All forwards, then all backwards (highest activation memory, simplest)."""
    return [("F", i) for i in range(num_micro)] + [("B", i) for i in range(num_micro)]


def schedule_1f1b(num_micro: int, pp: int, stage: int) -> list[Action]:
    """Warm-up forwards (pp − stage − 1), then one-forward-one-backward, then the remaining backwards."""
    warm = min(pp - stage - 1, num_micro)
    actions: list[Action] = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < num_micro:
        actions += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    actions += [("B", i) for i in range(b, num_micro)]
    return actions


def make_schedule(name: str, num_micro: int, pp: int, stage: int) -> list[Action]:
    key = (name or "1f1b").lower()
    if key == "gpipe":
        return schedule_gpipe(num_micro)
    if key == "1f1b":
        return schedule_1f1b(num_micro, pp, stage)
    raise ValueError(f"unsupported pipeline schedule {name!r} (gpipe, 1f1b)")


class PipelineStage(StagePosition):
    """Runs one stage's part of a schedule; `step` returns (last-stage losses, summed weight grads)."""

    def __init__(self, fn: Callable[..., Any], params: Sequence[ms.Parameter], group: AxisGroup, *,
                 act_shape: Sequence[int], act_dtype=ms.float32) -> None:
        self.fn, self.params, self.group = fn, list(params), group
        self.act_shape, self.act_dtype = tuple(act_shape), act_dtype
        self.stage, self.pp = group.rank, group.size

    def step(self, micro_inputs: Sequence[tuple], schedule: Sequence[Action]) -> tuple[list[float], list[Tensor]]:
        """`micro_inputs[i]`: (x, *extra) on the first stage, (*extra,) elsewhere (e.g. labels on the last)."""
        pending, vjps, losses = [], {}, []
        grads = [ops.zeros(p.shape, p.dtype) for p in self.params]
        for kind, i in schedule:
            if kind == "F":
                vjps[i] = self._forward(micro_inputs[i], pending, losses)
            else:
                dw = self._backward(vjps.pop(i), pending)
                grads = [g + d for g, d in zip(grads, dw)]
        for handle, _buffer in pending:  # the buffer stays referenced until its send completes
            if handle is not None:
                handle.wait()
        return losses, grads

    def _forward(self, inputs: tuple, pending: list, losses: list) -> Any:
        if self.is_first:
            x, extra = inputs[0], tuple(inputs[1:])
        else:
            x, extra = comm.recv(self.act_shape, self.act_dtype, self.stage - 1, self.group), tuple(inputs)
        out = self.fn(x, *extra)
        if self.is_last:
            losses.append(float(out.asnumpy()))
        else:
            pending.append((dist.isend(out, dst=self.group.ranks[self.stage + 1], group=self.group.name), out))
        return (x, extra, out)

    def _backward(self, saved: Any, pending: list) -> list[Tensor]:
        # PyNative keeps one differentiable graph at a time ("Can not find top cell for backward" when
        # 1F1B holds several), so the stage forward is recomputed here: full activation recompute.
        x, extra, out = saved
        if self.is_last:
            dout = ops.ones(out.shape, out.dtype)
        else:
            dout = comm.recv(tuple(out.shape), out.dtype, self.stage + 1, self.group)
        _, vjp_fn = ms.vjp(lambda a: self.fn(a, *extra), x, weights=self.params)
        dx, dw = vjp_fn(dout)
        dx = dx[0] if isinstance(dx, (tuple, list)) else dx  # one input: some versions wrap it
        if not self.is_first:
            pending.append((dist.isend(dx, dst=self.group.ranks[self.stage - 1], group=self.group.name), dx))
        return list(dw)


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
