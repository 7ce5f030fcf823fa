"""`HostPath`: the gradient path with the update on the host (reference §2.5).

Each micro-batch's gradients are copied into the optimizer's flat fp32 buffer (FSDP: this rank's rows,
which its units put there themselves, `parallel.fsdp.GradSink`), scaled by 1/accumulation and summed;
several processes average them over dp×cp (`DistContext.sync_grads`). The numpy optimizer updates its
masters and the model's weights are set to them (unless they share memory, `optimizer.shares_weights`).
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np

from mftk.engine.dispatch import Dispatcher
from mftk.engine.grad_path import MicroBatches
from mftk.engine.optim import global_norm
from mftk.engine.state import TrainState, write_masters
from mftk.engine.step import BatchPlan, PhaseTimer, StepOutput, output_row, reduce_step


class HostPath:
    """Gradients, norm, clip and update on the host (`grad_path.GradientPath`)."""

    holds_loss = True

    def __init__(self, model: Any, optimizer: Any, batches: Iterator[dict], *, dist: Any = None,
                 columns: tuple[str, ...] = ("input_ids", "labels"), low_priority: bool = False) -> None:
        import mindspore as ms

        self.model, self.optimizer, self.dist = model, optimizer, dist
        self.params = list(model.trainable_params())
        self.grad_fn = ms.value_and_grad(model, None, self.params, has_aux=True)
        self.dispatch = Dispatcher(low_priority=low_priority)
        self.micro = MicroBatches(batches, columns, self.dispatch)

    def accumulate(self, plan: BatchPlan, state: TrainState, timer: PhaseTimer) -> tuple[np.ndarray, StepOutput]:
        """Every micro-batch's gradient, scaled by 1/accum and summed in fp32 (reference §2.5)."""
        acc = self.optimizer.grad_buffer()  # the optimizer's flat layout (FSDP: this rank's rows), reused
        scale = 1.0 / plan.accumulation
        rows, counts, n_aux, names = [], None, 0, ()
        sink = getattr(self.dist, "grad_sink", None)  # FSDP units put their gradients in ``acc``
        for _ in range(plan.accumulation):
            if sink is not None:
                sink.begin(acc, scale, first=not rows)
            t, (outputs, grads) = self.micro.run(state, timer, self.gradients)
            row, n_aux, names, tpe = output_row(outputs)
            (self.optimizer.add_grads if rows else self.optimizer.put_grads)(acc, grads, scale)
            grads = None  # the framework's gradients go before the next micro-batch (and the sync)
            rows.append([float(x.asnumpy()) for x in row])
            if tpe:
                c = np.stack([x.asnumpy() for x in tpe]).astype(np.float64)
                counts = c if counts is None else counts + c
            timer.add("forward_backward", time.perf_counter() - t)
        out = reduce_step(np.array(rows, np.float64), n_aux, names, counts, scale)
        if self.dist is not None:  # data parallel: gradients and logged values over dp×cp, counts summed
            t = time.perf_counter()
            acc = self.dist.sync_grads(acc)
            out = out.across(self.dist.mean, self.dist.sum_counts)
            timer.add("communication", time.perf_counter() - t)
        return acc, out

    def gradients(self, inputs: list[Any]) -> tuple[Any, list[np.ndarray | None]]:
        """One micro-batch's model outputs and parameter gradients (on the dispatch thread); None for those an
        FSDP unit put in the buffer already (`parallel.fsdp.GradSink`)."""
        sink = getattr(self.dist, "grad_sink", None)
        try:
            outputs, grads = self.grad_fn(*inputs)
        finally:
            done = sink.end() if sink is not None else set()
        return outputs, [None if i in done else g.asnumpy() for i, g in enumerate(grads)]

    def norm(self, grads: np.ndarray) -> float:
        if self.dist is not None:  # each element counted once over the whole world
            return self.dist.grad_norm(grads)
        return global_norm(grads)

    def clip(self, grads: np.ndarray, factor: float) -> None:
        grads *= np.float32(factor)

    def update(self, grads: Any, lr: float, timer: PhaseTimer) -> None:
        t = time.perf_counter()
        self.optimizer.step(grads, lr)
        if not getattr(self.optimizer, "shares_weights", False):  # else the update has written the weights
            # (and reading the masters would copy every one to the host: the device path's whole model)
            self.dispatch.call(write_masters, self.model, self.params, self.optimizer.masters())
        timer.add("optimizer", time.perf_counter() - t)

    def host_grads(self, grads: Any) -> Any:
        return grads

    def close(self) -> None:
        self.dispatch.close()
