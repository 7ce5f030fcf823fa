"""`DevicePath`: the gradient path of the device-resident update (``mftk.update_on_device``; `device_optim`).

Each micro-batch's gradients stay MindSpore tensors, accumulated in fp32 on the device; several processes
sync them on the device (`distributed.DistContext.sync_grad_tensors`, the host path's steps) and sum the
squared norm over the world there too. Then the host reads ONE small vector per step: every micro-batch's
logged values (loss, aux/MTP terms, named outputs), the expert counts and the squared norm — which the NaN
guard, the clip factor and the log need — and the update runs on the device (`device_optim.DeviceAdamW.step`).

The logged values are reduced by the host path's `step.reduce_step` (float64 means of the same float32
per-micro-batch values), so both paths log the same losses.
"""
from __future__ import annotations

import math
import time
from typing import Any

import attrs
import numpy as np

from mftk.engine.host_path import HostPath
from mftk.engine.state import TrainState
from mftk.engine.step import BatchPlan, PhaseTimer, StepOutput, output_row, reduce_step


@attrs.frozen
class DeviceGrads:
    """The step's gradient tensors (the optimizer's layout) and their global norm, read with the step's values."""

    tensors: list[Any]
    norm: float


class DevicePath(HostPath):
    """Gradients, norm, clip and update on the device (its optimizer is a `DeviceAdamW`)."""

    def accumulate(self, plan: BatchPlan, state: TrainState, timer: PhaseTimer) -> tuple[DeviceGrads, StepOutput]:
        """Every micro-batch's gradient, scaled by 1/accum and summed in fp32 on the device; synced, and the
        step's values and squared norm read in one transfer."""
        acc = self.optimizer.grad_buffer()
        scale = 1.0 / plan.accumulation
        rows, counts, n_aux, names = [], None, 0, ()
        for k in range(plan.accumulation):
            t, (outputs, grads) = self.micro.run(state, timer, self.gradients)
            row, n_aux, names, tpe = output_row(outputs)
            (self.optimizer.add_grads if k else self.optimizer.put_grads)(acc, grads, scale)
            grads = None
            rows.append(row)
            if tpe:
                c = _stack(tpe)
                counts = c if counts is None else counts + c
            timer.add("forward_backward", time.perf_counter() - t)
        t = time.perf_counter()
        if self.dist is not None:
            acc = self.dist.sync_grad_tensors(acc)
            sq = self.dist.norm_squared(acc, self.optimizer)
        else:
            sq = self.optimizer.squared_norm(acc)
        per_mb, counts_np, sq_np = _read(rows, counts, sq)
        out = reduce_step(per_mb, n_aux, names, counts_np, scale)
        if self.dist is not None:  # the values as the host path syncs them; the gradients were synced above
            out = out.across(self.dist.mean, self.dist.sum_counts)
            timer.add("communication", time.perf_counter() - t)
        return DeviceGrads(acc, math.sqrt(float(sq_np))), out

    def gradients(self, inputs: list[Any]) -> tuple[Any, Any]:
        """One micro-batch's outputs and gradient tensors (left on the device)."""
        return self.grad_fn(*inputs)

    def norm(self, grads: DeviceGrads) -> float:
        return grads.norm

    def clip(self, grads: DeviceGrads, factor: float) -> None:
        self.optimizer.scale(grads.tensors, factor)

    def update(self, grads: DeviceGrads, lr: float, timer: PhaseTimer) -> None:
        super().update(grads.tensors, lr, timer)

    def host_grads(self, grads: DeviceGrads) -> Any:
        from mftk.engine.device_optim import HostGrads

        return HostGrads(grads.tensors, self.optimizer)


def _stack(tensors: Any) -> Any:
    import mindspore as ms
    from mindspore import ops

    return ops.stack([t.astype(ms.float32) for t in tensors])


def _read(rows: list[list[Any]], counts: Any, sq: Any) -> tuple[np.ndarray, np.ndarray | None, float]:
    """The step's one device→host transfer: every micro-batch's row of values, expert counts, squared norm."""
    import mindspore as ms
    from mindspore import ops

    parts = [ops.stack([x.astype(ms.float32).reshape(()) for row in rows for x in row]),
             sq.astype(ms.float32).reshape(1)]
    if counts is not None:
        parts.append(counts.reshape(-1))
    flat = ops.concat(parts).asnumpy()
    n = sum(len(row) for row in rows)
    per_mb = flat[:n].reshape(len(rows), -1)
    got = flat[n + 1:].reshape(tuple(counts.shape)).astype(np.float64) if counts is not None else None
    return per_mb, got, float(flat[n])
