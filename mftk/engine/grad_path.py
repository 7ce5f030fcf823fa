"""`GradientPath`: how a step's gradients are made, measured, clipped and applied — the `Trainer`'s one strategy.

Three implementations, each in its own module, picked by `trainer_build.build_path`:

- `host_path.HostPath`: fp32 numpy gradients in the optimizer's flat buffer, synced over dp on the host;
- `device_path.DevicePath`: gradients, norm, clip and update left on the device (``mftk.update_on_device``);
- `pipeline_path.PipelinePath`: the micro-batches run through the pipeline stages, then the host path.

The loop (`Trainer.train_step`) only calls ``accumulate → norm → clip → update`` in order; the policies
(NaN guard, clip factor, learning rate) stay in the loop, the mechanics in the path.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from mftk.engine.step import BatchPlan, PhaseTimer, StepOutput
from mftk.engine.state import TrainState
from mftk.errors import TrainingError

MODEL_INPUTS = ("input_ids", "labels", "loss_mask", "position_ids", "attention_mask")


class GradientPath(Protocol):
    """What the loop needs of a gradient path; ``grads`` is whatever its ``accumulate`` returned."""

    model: Any
    optimizer: Any
    dist: Any  # distributed.DistContext of a multi-process job, else None
    params: list[Any]
    holds_loss: bool  # False on a pipeline stage without the LM head: its log line shows no loss

    def accumulate(self, plan: BatchPlan, state: TrainState, timer: PhaseTimer) -> tuple[Any, StepOutput]:
        """Every micro-batch of the step read (counted in ``state``), its gradients summed × 1/accumulation,
        synced over the ranks, with the step's logged values (`step.reduce_step`, `StepOutput.across`)."""

    def norm(self, grads: Any) -> float:
        """The global gradient norm over the whole world (each element counted once)."""

    def clip(self, grads: Any, factor: float) -> None:
        """Scale ``grads`` by ``factor`` (< 1) in place."""

    def update(self, grads: Any, lr: float, timer: PhaseTimer) -> None:
        """The optimizer step with ``lr``, and the model's weights set to the result."""

    def host_grads(self, grads: Any) -> Any:
        """``grads`` as the monitors read them (numpy slices of the flat layout)."""

    def close(self) -> None:
        """Release what the path holds between steps (its dispatch thread)."""


class MicroBatches:
    """The next micro-batch read (timed as ``data``) and run through ``fn`` on the ``dispatch`` thread."""

    def __init__(self, batches: Iterator[dict], columns: tuple[str, ...], dispatch: Any) -> None:
        self.batches, self.dispatch = batches, dispatch
        self.columns = tuple(c for c in MODEL_INPUTS if c in columns)

    def run(self, state: TrainState, timer: PhaseTimer, fn: Callable[[list[Any]], Any]) -> tuple[float, Any]:
        """``fn(inputs)``'s result; returns the time its compute started, for the caller's
        ``forward_backward`` phase."""
        from mindspore import Tensor

        t = time.perf_counter()
        batch = next(self.batches)
        state.micro_batches_read += 1
        timer.add("data", time.perf_counter() - t)
        t = time.perf_counter()
        inputs = [Tensor(np.ascontiguousarray(batch[c])) if c in self.columns and c in batch else None
                  for c in MODEL_INPUTS]
        try:
            return t, self.dispatch.call(fn, inputs)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise TrainingError(message=f"error in the forward/backward pass: {exc}",
                                hint="run with MFTK_DEBUG=1 for the traceback") from exc
