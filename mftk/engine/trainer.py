"""The training loop: one optimizer step is a list of named component calls (reference §2.3).

    plan     = batches.at(consumed_samples)        # static or ramp-up gbs → accumulation steps
    grads    = forward_backward(plan)             # data fetch + fwd/bwd per micro-batch, fp32 accumulation
    norm     = global_norm(grads)                  # reported *before* clipping
    nan_guard(norm, loss)                          # skip-on-NaN (budgeted) or stop with TrainingError
    clip(grads, norm)                              # max_norm <= 0 disables clipping (reference: zeroes/flips)
    optimizer_step(grads)                          # lr = schedule(global_step) before the increment
    expert_bias_update(tokens_per_expert)          # after the optimizer, every step (reference LossCallback)
    advance(state)                                 # consumed_samples += gbs; global_step += 1
    report(metrics)                                # the MF log line + JSON metrics through StepSinks
    checkpointer.after_step(state)                 # every save_interleaved_steps, and at the end
    stop.check()                                   # SIGTERM/SIGINT: save, then TrainingInterrupted

Every policy lives in its component; the loop body only calls them in order.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Iterator

import attrs
import numpy as np

from mftk.ckpt.common import CommonInfo
from mftk.engine.dispatch import Dispatcher, low_priority_applies
from mftk.engine.optim import AdamW, clip_factor, global_norm
from mftk.engine.state import TrainState, model_tensors, write_masters
from mftk.errors import CheckpointError, TrainingError, TrainingInterrupted
from mftk.plan.layout import rampup_gbs
from mftk.progress import FanOut, StepSink

log = logging.getLogger("mftk.train")

MODEL_INPUTS = ("input_ids", "labels", "loss_mask", "position_ids", "attention_mask")


# --------------------------------------------------------------------------------------- batches
@attrs.frozen
class BatchPlan:
    global_batch_size: int
    accumulation: int


@attrs.frozen
class BatchSchedule:
    """Static gbs, or ``rampup_batch_size: [start, increment, samples]`` up to gbs (reference §2.8)."""

    global_batch_size: int
    local_batch_size: int
    dp: int = 1
    rampup: tuple[int, int, int] | None = None

    def at(self, consumed_samples: int) -> BatchPlan:
        gbs = self.global_batch_size
        if self.rampup is not None:
            start, inc, samples = self.rampup
            gbs = rampup_gbs(consumed_samples, start, inc, samples, self.global_batch_size)
        return BatchPlan(gbs, max(1, gbs // (self.dp * self.local_batch_size)))


@attrs.frozen
class NanPolicy:
    """``use_skip_step_on_nan``: drop the update of a step whose loss or grad norm is not finite,
    at most ``max_consecutive_skipped_steps`` times in a row; otherwise a NaN stops the run."""

    skip: bool
    max_consecutive: int


# --------------------------------------------------------------------------------------- stop flag
class StopFlag:
    """Set by a signal handler; the loop saves and raises TrainingInterrupted at the next step end."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def request(self, name: str) -> None:
        self.signal_name = name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


# --------------------------------------------------------------------------------------- checkpoints
@attrs.define
class Checkpointer:
    """Save policy + crash-safe writes through `mftk.ckpt.save` (temp dir → rename → tracker → retention).

    ``async_save`` writes from one background thread; the tracker is updated by that thread once
    the step dir is complete (the reference never writes the last one's). Errors stop the run.
    """

    root: str
    interval: int
    save_max: int = 5
    start_step: int = 0  # the reference counts save_interleaved_steps from the step a run starts (or resumes) at
    prefix: str | None = "checkpoint"
    save_optim: bool = True
    async_save: bool = False
    dist: Any = None  # distributed.DistContext: every rank writes its files, rank 0 publishes
    last_saved_step: int | None = None
    last_path: str = ""
    _retention: Any = None
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def __attrs_post_init__(self) -> None:
        from mftk.ckpt.save import Retention

        self._retention = Retention(self.root, self.save_max)

    def due(self, step: int) -> bool:
        return step > self.start_step and (step - self.start_step) % self.interval == 0

    def save(self, step: int, payload: dict[str, Any], sink: StepSink) -> None:
        self.wait()
        self.last_saved_step = step
        if self.async_save and self.dist is None:  # a multi-process save needs barriers: synchronous
            self._thread = threading.Thread(target=self._write_async, args=(step, payload, sink),
                                            name=f"mftk-save-{step}", daemon=True)
            self._thread.start()
        else:
            self._write(step, payload, sink)

    def wait(self) -> None:
        """Join a pending async save; its error, if any, is raised here."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _write_async(self, step: int, payload: dict[str, Any], sink: StepSink) -> None:
        try:
            self._write(step, payload, sink)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by wait()
            self._error = exc

    def _write(self, step: int, payload: dict[str, Any], sink: StepSink) -> None:
        from mftk.ckpt.save import save_checkpoint

        t0 = time.perf_counter()
        try:
            if self.dist is not None:
                saved = self._write_distributed(step, payload)
            else:
                saved = save_checkpoint(self.root, step=step, prefix=self.prefix, **payload)
            removed = self._retention.record(step) if self.dist is None or self.dist.rank == 0 else []
        except CheckpointError as exc:
            raise TrainingError(message=f"checkpoint save at step {step} failed: {exc.message}",
                                hint=exc.hint or "check checkpoint.save_path", step=step) from exc
        self.last_path = saved.path
        for old in removed:
            log.info("save_max=%d: removed the oldest checkpoint %s", self.save_max, old)
        log.info("Checkpoint saved at step %d to %s (async=%s, remove_redundancy=False) in %.2fs",
                 step, self.root, self.async_save and self.dist is None, time.perf_counter() - t0)
        sink.on_checkpoint(step, saved.path)

    def _write_distributed(self, step: int, payload: dict[str, Any]) -> Any:
        """Reference order (§3.1): rank 0 prepares the dir → barrier → every rank writes its files →
        barrier → rank 0 writes common.json + metadata.json, publishes, tracker, retention → barrier."""
        from pathlib import Path

        from mftk.ckpt.layout import iteration_dir_name
        from mftk.ckpt.metadata import build_metadata
        from mftk.ckpt.save import SavedCheckpoint, begin_save, finalize_save, temp_dir_for, write_rank_files

        d = self.dist
        if d.rank == 0:
            begin_save(self.root, step)
        d.barrier()
        write_rank_files(temp_dir_for(self.root, step), rank=d.rank, world=d.world, step=step, model=payload["model"],
                         optimizer=payload["optimizer"], extra=payload["extra"], prefix=self.prefix)
        d.barrier()
        saved = None
        if d.rank == 0:
            model_specs, opt_specs = d.metadata_specs(payload["model"], payload["optimizer"])
            meta = build_metadata(model_specs, opt_specs, world=d.world, prefix=self.prefix)
            saved = finalize_save(self.root, step, common=payload["common"], world=d.world,
                                  optimizer_saved=payload["optimizer"] is not None, metadata=meta)
        d.barrier()
        if saved is None:
            path = Path(self.root) / iteration_dir_name(step)
            saved = SavedCheckpoint(step=step, path=str(path), files=(), bytes=0)
        return saved


# --------------------------------------------------------------------------------------- timing
class PhaseTimer:
    """Seconds spent per phase within one step (data, forward_backward, optimizer, save)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds


@attrs.frozen
class StepOutput:
    loss: float
    aux: list[float]  # per MoE layer, mean over micro-batches (α-free)
    mtp: list[float]  # per MTP depth, mean over micro-batches (× λ/D)
    tokens_per_expert: np.ndarray | None  # (n_moe, E) summed over micro-batches
    local_losses: list[float]
    indexer: list[float] = attrs.field(factory=list)  # DeepSeek-V4: [mean over indexer layers × coeff] or []


# --------------------------------------------------------------------------------------- trainer
JIT_MIN_PARAMS = 10_000_000


def kernel_bound(model: Any, dist: Any) -> bool:
    """A single-process run of a model of at least ``JIT_MIN_PARAMS`` parameters: big enough that its
    step is bound by the kernels rather than by dispatching them (bench/train_step.py)."""
    return dist is None and sum(int(np.prod(p.shape)) for p in model.trainable_params()) >= JIT_MIN_PARAMS


def auto_jit_blocks(model: Any, dist: Any) -> bool:
    """Compile the dense blocks (``GPTModel.jit_blocks``) when `kernel_bound`: 1.2–1.3× faster steps on
    a 29 M model (bench/train_step.py) for a one-off ~4–6 s compile that a tiny model never repays.
    Multi-process runs stay eager: TP/CP put communication inside the blocks."""
    return hasattr(model, "jit_blocks") and kernel_bound(model, dist)


def auto_low_priority_dispatch(model: Any, dist: Any) -> bool:
    """Dispatch from an idle-class thread (`dispatch.Dispatcher`) when `kernel_bound` on CPU: 1.06–1.19×
    faster steps on the 29 M model; a tiny model's step is dispatch-bound and gets 10–25 % slower.
    Multi-process runs keep normal priority: an idle-class thread of one worker would wait behind the
    kernels of the others."""
    return kernel_bound(model, dist) and low_priority_applies()


class Trainer:
    """Runs steps ``state.global_step + 1 .. total_steps`` on one process."""

    def __init__(self, *, model: Any, optimizer: AdamW, schedule: Callable[[int], float], batches: Iterator[dict],
                 batch_schedule: BatchSchedule, total_steps: int, max_norm: float, sinks: StepSink | None = None,
                 checkpointer: Checkpointer | None = None, extra_state: Callable[[TrainState, int], dict] | None = None,
                 flops_per_sample: float = 0.0,
                 nan_policy: NanPolicy, columns: tuple[str, ...] = ("input_ids", "labels"),
                 monitor: Any = None, stop: StopFlag | None = None, epoch_micro_batches: int = 0,
                 show_mtp: bool = True, seq_length: int = 0, dist: Any = None,
                 jit_blocks: bool | None = None, low_priority_dispatch: bool | None = None) -> None:
        import mindspore as ms

        self.model, self.optimizer, self.schedule = model, optimizer, schedule
        self.batches, self.batch_schedule = batches, batch_schedule
        self.total_steps, self.max_norm = int(total_steps), float(max_norm)
        self.sink = sinks if sinks is not None else FanOut()
        self.checkpointer, self.extra_state = checkpointer, extra_state
        self.flops_per_sample, self.nan_policy, self.monitor = flops_per_sample, nan_policy, monitor
        self.stop = stop or StopFlag()
        self.columns = tuple(c for c in MODEL_INPUTS if c in columns)
        self.epoch_micro_batches = epoch_micro_batches
        self.show_mtp, self.seq_length = show_mtp, seq_length
        self.last_gbs = batch_schedule.global_batch_size
        self.params = list(model.trainable_params())
        self.jit_blocks = auto_jit_blocks(model, dist) if jit_blocks is None else jit_blocks
        if self.jit_blocks:
            model.jit_blocks()
        self.grad_fn = ms.value_and_grad(model, None, self.params, has_aux=True)
        low = auto_low_priority_dispatch(model, dist) if low_priority_dispatch is None else low_priority_dispatch
        self.dispatch = Dispatcher(low_priority=low)
        self.micro_batches_read = 0
        self.first_step_seconds: float | None = None
        self.dist = dist  # distributed.DistContext for a data-parallel (DP/FSDP) job, else None
        self.sharded = dist is not None and dist.sharding.enabled
        self._norm_weights = dist.sharding.norm_weights(optimizer) if self.sharded else None

    # ------------------------------------------------------------------------------- the loop
    def fit(self, state: TrainState) -> TrainState:
        try:
            while state.global_step < self.total_steps:
                self.train_step(state)
                self.stop_if_requested(state)
        finally:
            self.dispatch.close()
        self.save_final(state)
        return state

    def train_step(self, state: TrainState) -> dict[str, Any]:
        t0 = time.perf_counter()
        timer = PhaseTimer()
        plan = self.batch_schedule.at(state.consumed_samples)
        grads, out = self.forward_backward(plan, timer)
        norm = self.grad_norm(grads)
        applied = self.nan_guard(state, out.loss, norm)
        lr = None
        if applied:
            self.clip(grads, norm)
            lr = self.optimizer_step(grads, timer)
        self.expert_bias_update(out.tokens_per_expert)
        self.advance(state, plan)
        step_ms = (time.perf_counter() - t0) * 1000.0
        metrics = self.metrics(state, plan, out, norm if applied else None, step_ms, timer, lr)
        self.report(state, metrics, out, grads)
        if self.first_step_seconds is None:
            self.first_step_seconds = step_ms / 1000.0
        self.checkpoint_policy(state, timer)
        return metrics

    # ------------------------------------------------------------------------------- components
    def forward_backward(self, plan: BatchPlan, timer: PhaseTimer) -> tuple[np.ndarray, StepOutput]:
        """Every micro-batch's gradient, scaled by 1/accum and summed in fp32 (reference §2.5)."""
        from mindspore import Tensor

        # FSDP: a full-size buffer (then this rank's rows are kept); else the optimizer's own flat layout
        layout = self.dist.sharding if self.sharded else self.optimizer
        acc = layout.zeros_full() if self.sharded else self.optimizer.grad_buffer()  # reused; filled below
        scale = 1.0 / plan.accumulation
        losses, aux_sum, mtp_sum, counts, indexer = [], None, None, None, []
        for _ in range(plan.accumulation):
            t = time.perf_counter()
            batch = next(self.batches)
            self.micro_batches_read += 1
            timer.add("data", time.perf_counter() - t)
            t = time.perf_counter()
            inputs = [Tensor(np.ascontiguousarray(batch[c])) if c in self.columns and c in batch else None
                      for c in MODEL_INPUTS]
            try:
                outputs, grads = self.dispatch.call(self.gradients, inputs)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise TrainingError(message=f"error in the forward/backward pass: {exc}",
                                    hint="run with MFTK_DEBUG=1 for the traceback") from exc
            _, lm, aux, mtp, tpe = outputs
            fill = layout.add_grads if self.sharded or len(losses) else self.optimizer.put_grads
            fill(acc, grads, scale)
            losses.append(float(lm.asnumpy()))
            a = np.array([float(x.asnumpy()) for x in aux], np.float64)
            m = np.array([float(x.asnumpy()) for x in mtp], np.float64)
            aux_sum = a if aux_sum is None else aux_sum + a
            mtp_sum = m if mtp_sum is None else mtp_sum + m
            if tpe:
                c = np.stack([x.asnumpy() for x in tpe]).astype(np.float64)
                counts = c if counts is None else counts + c
            if getattr(self.model, "last_indexer_loss", None) is not None:
                indexer.append(self.model.last_indexer_loss)
            timer.add("forward_backward", time.perf_counter() - t)
        n = plan.accumulation
        out = StepOutput(loss=float(np.mean(losses)), aux=list(aux_sum / n), mtp=list(mtp_sum / n),
                         tokens_per_expert=counts, local_losses=[x * scale for x in losses],
                         indexer=[float(np.mean(indexer))] if indexer else [])
        if self.dist is not None:
            t = time.perf_counter()
            acc, out = self.sync(acc, out)
            timer.add("communication", time.perf_counter() - t)
        return acc, out

    def gradients(self, inputs: list[Any]) -> tuple[Any, list[np.ndarray]]:
        """One micro-batch's model outputs and parameter gradients (on the dispatch thread)."""
        outputs, grads = self.grad_fn(*inputs)
        return outputs, [g.asnumpy() for g in grads]

    def sync(self, acc: np.ndarray, out: StepOutput) -> tuple[np.ndarray, StepOutput]:
        """Data parallel: gradients and logged losses averaged over dp×cp, expert counts summed;
        FSDP keeps this rank's rows of the averaged gradient."""
        d = self.dist
        acc = d.sync_grads(acc)
        if self.sharded:
            acc = d.sharding.scatter(acc, self.optimizer)
        means = d.mean([out.loss, *out.aux, *out.mtp, *out.indexer])
        na, nm = len(out.aux), len(out.mtp)
        counts = d.sum_counts(out.tokens_per_expert) if out.tokens_per_expert is not None else None
        return acc, StepOutput(loss=float(means[0]), aux=[float(x) for x in means[1:1 + na]],
                               mtp=[float(x) for x in means[1 + na:1 + na + nm]], tokens_per_expert=counts,
                               local_losses=out.local_losses, indexer=[float(x) for x in means[1 + na + nm:]])

    def grad_norm(self, grads: np.ndarray) -> float:
        if self.sharded or getattr(self.dist, "model_parallel", False):  # TP/EP: summed over ranks
            return self.dist.grad_norm(grads, self._norm_weights)
        return global_norm(grads)

    def nan_guard(self, state: TrainState, loss: float, norm: float) -> bool:
        """True when the update may be applied; a non-finite loss/norm is skipped or stops the run."""
        if math.isfinite(loss) and math.isfinite(norm):
            state.consecutive_skipped = 0
            return True
        step = state.global_step + 1
        if not self.nan_policy.skip:
            raise TrainingError(message=f"loss {loss} / grad_norm {norm} is not finite at step {step}; training stopped "
                                "before applying the update", step=step,
                                hint="lower lr_scheduler.learning_rate or training.max_norm, or set "
                                "training.use_skip_step_on_nan: true to skip such steps")
        state.consecutive_skipped += 1
        state.skipped_steps += 1
        log.warning("step %d: loss %s / grad_norm %s is not finite; update skipped (%d in a row, max %d)",
                    step, loss, norm, state.consecutive_skipped, self.nan_policy.max_consecutive)
        if state.consecutive_skipped > self.nan_policy.max_consecutive:
            raise TrainingError(message=f"{state.consecutive_skipped} consecutive steps had a non-finite loss or "
                                f"gradient (max_consecutive_skipped_steps={self.nan_policy.max_consecutive})",
                                step=step, hint="resume from the last checkpoint with a lower learning rate")
        return False

    def clip(self, grads: np.ndarray, norm: float) -> None:
        c = clip_factor(norm, self.max_norm)
        if c < 1.0:
            grads *= np.float32(c)

    def optimizer_step(self, grads: np.ndarray, timer: PhaseTimer) -> float:
        t = time.perf_counter()
        lr = self.schedule(self.optimizer.global_step)
        self.optimizer.step(grads, lr)
        if self.sharded:
            t1 = time.perf_counter()
            full = self.dist.gather_params(self.optimizer)
            timer.add("communication", time.perf_counter() - t1)
            t -= time.perf_counter() - t1  # keep the optimizer phase free of communication time
        else:
            full = self.optimizer.masters()
        self.dispatch.call(write_masters, self.model, self.params, full)
        timer.add("optimizer", time.perf_counter() - t)
        return lr

    def expert_bias_update(self, tokens_per_expert: np.ndarray | None) -> None:
        if tokens_per_expert is not None and len(tokens_per_expert):
            self.model.update_expert_bias(tokens_per_expert)

    def advance(self, state: TrainState, plan: BatchPlan) -> None:
        state.consumed_samples += plan.global_batch_size
        state.global_step += 1
        self.last_gbs = plan.global_batch_size
        if self.epoch_micro_batches:
            state.epoch = self.micro_batches_read // self.epoch_micro_batches

    def metrics(self, state: TrainState, plan: BatchPlan, out: StepOutput, norm: float | None, step_ms: float,
                timer: PhaseTimer, lr_used: float | None) -> dict[str, Any]:
        m: dict[str, Any] = {"step": state.global_step, "consumed_samples": state.consumed_samples,
                             "global_batch_size": plan.global_batch_size, "loss": out.loss,
                             "per_step_time": int(step_ms)}
        if out.aux:
            m["load_balancing_loss"] = float(np.mean(out.aux))
        if out.indexer:
            m["indexer_loss"] = out.indexer[0]
        if self.show_mtp:
            for k, v in enumerate(out.mtp, start=1):
                m[f"mtp_{k}_loss"] = v
        m["lr"] = self.schedule(state.global_step)  # the reference logs the *next* update's LR
        m["grad_norm"] = norm
        if self.flops_per_sample:
            m["throughput"] = self.flops_per_sample * plan.global_batch_size / (max(step_ms, 1e-3) * 1e9)
        m.update({"lr_used": lr_used, "skipped": norm is None, "total_steps": self.total_steps,
                  "accumulation": plan.accumulation, "epoch": state.epoch,
                  "tokens": plan.global_batch_size * self.seq_length,
                  **{f"time_{k}_ms": v * 1000.0 for k, v in timer.seconds.items()}})
        return m

    def report(self, state: TrainState, metrics: dict[str, Any], out: StepOutput, grads: np.ndarray) -> None:
        if self.monitor is not None:
            self.monitor.flush(state.global_step, out, grads, self.optimizer)
        self.sink.on_step(metrics)

    def checkpoint_policy(self, state: TrainState, timer: PhaseTimer | None = None) -> None:
        if self.checkpointer is not None and self.checkpointer.due(state.global_step):
            t = time.perf_counter()
            self.save(state)
            if timer is not None:
                timer.add("save", time.perf_counter() - t)

    def stop_if_requested(self, state: TrainState) -> None:
        if self.dist is not None:  # every rank must stop (and save) at the same step
            if self.dist.any_flag(self.stop.requested) and not self.stop.requested:
                self.stop.request("SIGTERM (on another rank)")
        if not self.stop.requested:
            return
        path = ""
        if self.checkpointer is not None:
            if self.checkpointer.last_saved_step != state.global_step:
                self.save(state)
            self.checkpointer.wait()
            path = self.checkpointer.last_path
        raise TrainingInterrupted(message=f"{self.stop.signal_name} received: stopped after step {state.global_step}"
                                  + (f", checkpoint saved to {path}" if path else " (checkpoints disabled: nothing saved)"),
                                  step=state.global_step, saved_path=path,
                                  hint="continue with: mftk resume CONFIG" if path else "")

    def save_final(self, state: TrainState) -> None:
        if self.checkpointer is None:
            return
        if self.checkpointer.last_saved_step != state.global_step:
            self.save(state)
        self.checkpointer.wait()

    def model_tensors_to_save(self) -> dict[str, np.ndarray]:
        """The model tensors this rank writes (all of them; a pipeline stage narrows this)."""
        return model_tensors(self.model)

    def save(self, state: TrainState) -> None:
        gbs = self.last_gbs
        common = CommonInfo.for_step(step=state.global_step, max_steps=self.total_steps, global_batch_size=gbs,
                                     consumed_samples=state.consumed_samples, epoch=state.epoch)
        opt = None
        if self.checkpointer.save_optim:
            from mftk.engine.state import low_precision

            opt = self.optimizer.state_dict(with_masters=low_precision(self.params))
        model = self.model_tensors_to_save()
        if self.sharded:  # this rank's rows of each sharded parameter; the rest whole
            model = self.dist.sharding.cut(model)
        payload = {"common": common, "model": model, "optimizer": opt,
                   "extra": self.extra_state(state, gbs) if self.extra_state else None}
        self.checkpointer.save(state.global_step, payload, self.sink)
