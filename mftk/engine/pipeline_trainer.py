"""`PipelineTrainer`: the training loop of one pipeline rank (reference §1.3, §2.9).

The step's micro-batches (= the accumulation steps, as the reference overwrites
``pipeline_parallel_microbatch_size``) run through `parallel.pipeline.PipelineStage` in the GPipe, 1F1B or
interleaved 1F1B order; everything after the gradients is the base `Trainer`'s (sync over dp, global
norm, clip, AdamW, expert-bias update). Each stage knows the logged values of its own layers only: the
loss (last stage), the aux losses of its MoE layers, the MTP losses (last stage) and its layers' tokens
per expert are summed over the stages (float64, each stage adding zeros for the others'), so every rank
agrees on the NaN guard, updates every expert bias alike and reports the same `TrainResult`, while the log
line of a non-last stage is the reference's ``loss: N/A (non-last PP stage ...)``.
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
        lay = self.dist.groups.layout
        shape = stage.act_shape(local_batch_size, self.seq_length, lay.cp * lay.tp)
        self.pipe = PipelineStage(stage.fn, [stage.chunk_params(c) for c in range(len(stage.chunks))],
                                  self.dist.groups.pp, act_shape=shape, act_dtype=dtype)

    def forward_backward(self, plan: BatchPlan, timer: PhaseTimer) -> tuple[np.ndarray, StepOutput]:
        from mftk.engine.parallel.pipeline import make_schedule

        n = plan.accumulation
        t = time.perf_counter()
        batches = []
        for _ in range(n):
            batches.append(next(self.batches))
            self.state.micro_batches_read += 1
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
        out = self._stage_values()
        acc, out = self.sync(acc, out)
        timer.add("communication", time.perf_counter() - t)
        return acc, out

    def _stage_values(self) -> StepOutput:
        """The logged values of the whole pipeline: this stage's, summed with every other stage's."""
        losses, aux, mtp, counts = self.stage_model.step_values()
        indexer = self.stage_model.indexer_values()
        mine = float(np.mean(losses)) if self.stage_model.is_last and losses else 0.0
        total = self.dist.stage_sum([mine, *aux, *mtp, *indexer])
        na, nm = len(aux), len(mtp)
        # DeepSeek-V4: the mean over indexer layers × its coefficient, as one process logs it (`GPTModel.finish`)
        idx = [float(np.mean(total[1 + na + nm:])) * self.model.spec.indexer_loss_coeff] if len(indexer) else []
        return StepOutput(loss=float(total[0]), aux=[float(x) for x in total[1:1 + na]],
                          mtp=[float(x) for x in total[1 + na:1 + na + nm]], tokens_per_expert=counts,
                          local_losses=[x * self.stage_model.scale for x in losses], indexer=idx)

    def metrics(self, *args: Any, **kw: Any) -> dict[str, Any]:
        m = super().metrics(*args, **kw)
        if not self.stage_model.is_last:  # the reference's non-last-stage line; the real values stay in the JSON
            m["pipeline_loss"], m["loss"] = m["loss"], None
        return m
