"""`PipelineTrainer`: the training loop of one pipeline stage (reference §1.3, §2.9).

The step's micro-batches (= the accumulation steps, as the reference overwrites
``pipeline_parallel_microbatch_size``) run through `parallel.pipeline.PipelineStage` in the 1F1B or
GPipe order; everything after the gradients is the base `Trainer`'s (sync over dp, global norm,
clip, AdamW). Only the last stage computes the loss: it is shared with the other stages (a float64
sum over the pp group) so every rank agrees on the NaN guard and reports the same `TrainResult`,
while the log line of a non-last stage is the reference's ``loss: N/A (non-last PP stage ...)``.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from mftk.engine.trainer import BatchPlan, PhaseTimer, StepOutput, Trainer
from mftk.errors import TrainingError


class PipelineTrainer(Trainer):
    def __init__(self, *, stage: Any, schedule_name: str, local_batch_size: int, **kw: Any) -> None:
        super().__init__(**kw)
        from mftk.engine.parallel.pipeline import PipelineStage

        self.stage_model, self.schedule_name = stage, schedule_name or "1f1b"
        dtype = self.model.embedding.word_embeddings.weight.dtype
        self.pipe = PipelineStage(stage.fn, self.params, self.dist.groups.pp,
                                  act_shape=stage.act_shape(local_batch_size, self.seq_length), act_dtype=dtype)

    def forward_backward(self, plan: BatchPlan, timer: PhaseTimer) -> tuple[np.ndarray, StepOutput]:
        from mftk.engine.parallel.pipeline import make_schedule

        n = plan.accumulation
        t = time.perf_counter()
        micro = []
        for _ in range(n):
            batch = next(self.batches)
            self.state.micro_batches_read += 1
            micro.append(self.stage_model.micro_inputs(batch, 1.0 / n))
        timer.add("data", time.perf_counter() - t)
        t = time.perf_counter()
        schedule = make_schedule(self.schedule_name, n, self.pipe.pp, self.pipe.stage)
        try:
            losses, grads = self.pipe.step(micro, schedule)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise TrainingError(message=f"error in the pipeline forward/backward pass: {exc}",
                                hint="run with MFTK_DEBUG=1 for the traceback") from exc
        if self.sharded:
            acc = self.dist.sharding.zeros_full()
            self.dist.sharding.add_grads(acc, [g.asnumpy() for g in grads])
        else:
            acc = self.optimizer.grad_buffer()
            self.optimizer.put_grads(acc, [g.asnumpy() for g in grads])
        timer.add("forward_backward", time.perf_counter() - t)
        loss = float(np.sum(np.asarray(losses, np.float64))) if self.pipe.is_last else float("nan")
        out = StepOutput(loss=loss, aux=[], mtp=[], tokens_per_expert=None, local_losses=list(losses))
        t = time.perf_counter()
        acc, out = self.sync(acc, out)
        out = StepOutput(loss=self._share_loss(out.loss), aux=[], mtp=[], tokens_per_expert=None,
                         local_losses=out.local_losses)
        timer.add("communication", time.perf_counter() - t)
        return acc, out

    def _share_loss(self, loss: float) -> float:
        """The last stage's loss on every stage of the pipeline, exactly (float64 sum, others add 0)."""
        from mftk.engine.distributed import _sum_f64

        mine = loss if self.pipe.is_last else 0.0
        return float(_sum_f64(np.array([mine], np.float64), self.dist.groups.pp)[0])

    def metrics(self, *args: Any, **kw: Any) -> dict[str, Any]:
        m = super().metrics(*args, **kw)
        if not self.pipe.is_last:  # the reference's non-last-stage line; the real values stay in the JSON
            m["pipeline_loss"], m["loss"] = m["loss"], None
        return m

    def model_tensors_to_save(self) -> dict[str, Any]:
        """Only this stage's tensors go into this rank's files (metadata.json says which stage holds what)."""
        from mftk.engine.state import model_tensors

        return self.stage_model.owned_tensors(model_tensors(self.model))
