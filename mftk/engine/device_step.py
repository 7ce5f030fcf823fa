"""The training step of the device-resident update (``mftk.update_on_device``; `device_optim`).

The loop and its components are the base `trainer.Trainer`'s; only the gradient half differs. Each
micro-batch's gradients stay MindSpore tensors, accumulated in fp32 on the device; several processes sync
them on the device (`distributed.DistContext.sync_grad_tensors`, the host path's steps) and sum the squared
norm over the world there too. Then the host reads ONE small vector per step: every micro-batch's loss and
aux/MTP terms, the expert counts and the squared norm — which the NaN guard, the clip factor and the log
need — and the update runs on the device (`device_optim.DeviceAdamW.step`).

The logged values are reduced on the host exactly as the host path reduces them (float64 means of the
same float32 per-micro-batch values), so both paths log the same losses.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from mftk.engine.trainer import BatchPlan, PhaseTimer, StepOutput, Trainer

log = logging.getLogger("mftk.train")


class DeviceTrainer(Trainer):
    """`Trainer` with gradients, norm, clip and update on the device (its optimizer is a `DeviceAdamW`)."""

    _norm: float = float("nan")

    def forward_backward(self, plan: BatchPlan, timer: PhaseTimer) -> tuple[list[Any], StepOutput]:
        """Every micro-batch's gradient, scaled by 1/accum and summed in fp32 on the device; synced, and the
        step's scalars read in one transfer."""
        acc = self.optimizer.grad_buffer()
        scale = 1.0 / plan.accumulation
        scalars, counts, indexer, n_aux = [], None, [], 0
        for k in range(plan.accumulation):
            t, (outputs, grads) = self.micro_batch(timer)
            _, lm, aux, mtp, tpe = outputs
            (self.optimizer.add_grads if k else self.optimizer.put_grads)(acc, grads, scale)
            grads = None
            scalars.append([lm, *aux, *mtp])
            n_aux = len(aux)
            if tpe:
                c = _stack(tpe)
                counts = c if counts is None else counts + c
            if getattr(self.model, "last_indexer_loss", None) is not None:
                indexer.append(self.model.last_indexer_loss)
            timer.add("forward_backward", time.perf_counter() - t)
        t = time.perf_counter()
        if self.dist is not None:
            acc = self.dist.sync_grad_tensors(acc)
            sq = self.dist.norm_squared(acc, self.optimizer)
        else:
            sq = self.optimizer.squared_norm(acc)
        per_mb, counts_np, sq_np = _read(scalars, counts, sq)
        self._norm = math.sqrt(float(sq_np))
        out = _output(per_mb, n_aux, counts_np, indexer, scale)
        if self.dist is not None:
            out = self.sync_values(out)
            timer.add("communication", time.perf_counter() - t)
        return acc, out

    def gradients(self, inputs: list[Any]) -> tuple[Any, Any]:
        """One micro-batch's outputs and gradient tensors (left on the device)."""
        return self.grad_fn(*inputs)

    def sync_values(self, out: StepOutput) -> StepOutput:
        """The logged values over dp×cp and the expert counts over the world, as the host path does (`sync`
        without the gradients, which `forward_backward` synced on the device)."""
        d = self.dist
        means = d.mean([out.loss, *out.aux, *out.mtp, *out.indexer])
        na, nm = len(out.aux), len(out.mtp)
        counts = d.sum_counts(out.tokens_per_expert) if out.tokens_per_expert is not None else None
        return StepOutput(loss=float(means[0]), aux=[float(x) for x in means[1:1 + na]],
                          mtp=[float(x) for x in means[1 + na:1 + na + nm]], tokens_per_expert=counts,
                          local_losses=out.local_losses, indexer=[float(x) for x in means[1 + na + nm:]])

    def grad_norm(self, grads: Any) -> float:
        """The norm read with the step's scalars (`forward_backward`)."""
        return self._norm

    def clip(self, grads: list[Any], norm: float) -> None:
        from mftk.engine.optim import clip_factor

        c = clip_factor(norm, self.max_norm)
        if c < 1.0:
            self.optimizer.scale(grads, c)

    def report(self, state: Any, metrics: dict[str, Any], out: StepOutput, grads: Any) -> None:
        from mftk.engine.device_optim import HostGrads

        super().report(state, metrics, out, HostGrads(grads, self.optimizer))


def _stack(tensors: Any) -> Any:
    import mindspore as ms
    from mindspore import ops

    return ops.stack([t.astype(ms.float32) for t in tensors])


def _read(scalars: list[list[Any]], counts: Any, sq: Any) -> tuple[np.ndarray, np.ndarray | None, float]:
    """The step's one device→host transfer: per-micro-batch losses and aux terms, expert counts, squared norm."""
    import mindspore as ms
    from mindspore import ops

    parts = [ops.stack([x.astype(ms.float32).reshape(()) for row in scalars for x in row]),
             sq.astype(ms.float32).reshape(1)]
    if counts is not None:
        parts.append(counts.reshape(-1))
    flat = ops.concat(parts).asnumpy()
    n = sum(len(row) for row in scalars)
    per_mb = flat[:n].reshape(len(scalars), -1)
    got = flat[n + 1:].reshape(tuple(counts.shape)).astype(np.float64) if counts is not None else None
    return per_mb, got, float(flat[n])


def _output(per_mb: np.ndarray, n_aux: int, counts: np.ndarray | None, indexer: list[float],
            scale: float) -> StepOutput:
    """`StepOutput` of the read values: the host path's float64 means of the same float32 values (a row per
    micro-batch: loss, aux terms, MTP terms)."""
    losses = [float(x) for x in per_mb[:, 0]]
    n = per_mb.shape[0]
    sums = np.zeros(per_mb.shape[1] - 1, np.float64)
    for row in per_mb[:, 1:]:  # in micro-batch order, as the host path adds them
        sums = sums + row.astype(np.float64)
    return StepOutput(loss=float(np.mean(losses)), aux=list(sums[:n_aux] / n), mtp=list(sums[n_aux:] / n),
                      tokens_per_expert=counts, local_losses=[x * scale for x in losses],
                      indexer=[float(np.mean(indexer))] if indexer else [])
