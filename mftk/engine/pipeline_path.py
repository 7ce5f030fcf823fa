"""`PipelinePath`: the gradient path of one pipeline rank (reference §1.3, §2.9).

The step's micro-batches (= the accumulation steps, as the reference overwrites
``pipeline_parallel_microbatch_size``) run through `parallel.pipeline.PipelineStage` in the GPipe, 1F1B or
interleaved 1F1B order; everything after the gradients is the host path's (sync over dp, global norm,
clip, AdamW). Each stage knows the logged values of its own layers only: the loss (last stage), the aux
losses of its MoE layers, the MTP losses (last stage), its layers' named outputs and tokens per expert are
summed over the stages (float64, each stage adding zeros for the others'), so every rank agrees on the NaN
guard, updates every expert bias alike and reports the same `TrainResult`, while the log line of a
non-last stage is the reference's ``loss: N/A (non-last PP stage ...)`` (`holds_loss`).
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np

from mftk.engine.host_path import HostPath
from mftk.engine.state import TrainState
from mftk.engine.step import BatchPlan, PhaseTimer, StepOutput
from mftk.errors import TrainingError


class PipelinePath(HostPath):
    def __init__(self, model: Any, optimizer: Any, batches: Iterator[dict], *, dist: Any, stage: Any,
                 schedule_name: str, local_batch_size: int, seq_length: int, low_priority: bool = False) -> None:
        super().__init__(model, optimizer, batches, dist=dist, low_priority=low_priority)
        from mftk.engine.parallel.pipeline import PipelineStage

        self.batches = batches
        self.stage_model, self.schedule_name = stage, schedule_name or "1f1b"
        dtype = model.embedding.word_embeddings.weight.dtype
        lay = dist.groups.layout
        shape = stage.act_shape(local_batch_size, seq_length, lay.cp * lay.tp)
        self.pipe = PipelineStage(stage.fn, [stage.chunk_params(c) for c in range(len(stage.chunks))],
                                  dist.groups.pp, act_shape=shape, act_dtype=dtype)
        self.holds_loss = bool(stage.is_last)

    def accumulate(self, plan: BatchPlan, state: TrainState, timer: PhaseTimer) -> tuple[np.ndarray, StepOutput]:
        from mftk.engine.parallel.pipeline import make_schedule

        n = plan.accumulation
        t = time.perf_counter()
        batches = []
        for _ in range(n):
            batches.append(next(self.batches))
            state.micro_batches_read += 1
        self.stage_model.set_micro_batches(batches, 1.0 / n)
        timer.add("data", time.perf_counter() - t)
        t = time.perf_counter()
        pipe = self.pipe

        def schedule_of(rank: int) -> list:
            return make_schedule(self.schedule_name, n, pipe.pp, rank, pipe.chunks)

        try:
            grads = pipe.step(n, schedule_of)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise TrainingError(message=f"error in the pipeline forward/backward pass: {exc}",
                                hint="run with MFTK_DEBUG=1 for the traceback") from exc
        arrays = [grads[id(p)].asnumpy() if id(p) in grads else np.zeros(p.shape, np.float32) for p in self.params]
        acc = self.optimizer.grad_buffer()
        self.optimizer.put_grads(acc, arrays)
        timer.add("forward_backward", time.perf_counter() - t)
        t = time.perf_counter()
        acc = self.dist.sync_grads(acc)
        out = self.stage_values().across(self.dist.stage_sum).across(self.dist.mean, self.dist.sum_counts)
        timer.add("communication", time.perf_counter() - t)
        return acc, out

    def stage_values(self) -> StepOutput:
        """This stage's part of the logged values (zeros for the other stages' layers)."""
        losses, aux, mtp, counts = self.stage_model.step_values()
        mine = float(np.mean(losses)) if self.stage_model.is_last and losses else 0.0
        # the mean over every indexer layer is this stage's layers' share of it: summed over the stages
        named = self.model.named_outputs(self.stage_model.indexer_values())
        return StepOutput(loss=mine, aux=[float(x) for x in aux], mtp=[float(x) for x in mtp],
                          tokens_per_expert=counts, local_losses=[x * self.stage_model.scale for x in losses],
                          named=named)
