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
    checkpointer.save(step, INTERVAL)              # every save_interleaved_steps (ckpt.checkpointer), FINAL at the end
    stop.check()                                   # SIGTERM/SIGINT: save (SIGNAL), then TrainingInterrupted

Every policy lives in its component; the loop body only calls them in order. `Trainer.from_config` builds
the trainer of a run from its validated config; its counters live in `TrainState`.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Iterator, Sequence

import attrs
import numpy as np

from mftk.ckpt.checkpointer import Checkpointer, Payload, SaveReason
from mftk.ckpt.common import CommonInfo
from mftk.derive import accumulation_steps, compiles_blocks, rampup_gbs
from mftk.engine.dispatch import Dispatcher, low_priority_applies
from mftk.engine.optim import AdamW, clip_factor, global_norm
from mftk.engine.state import TrainState, extra_state, model_tensors, write_masters
from mftk.errors import DataFormatError, MftkError, TrainingError, TrainingInterrupted
from mftk.logs.sinks import StepLogSink
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
        return BatchPlan(gbs, accumulation_steps(gbs, self.local_batch_size, self.dp)[0] or 1)


@attrs.frozen
class NanPolicy:
    """``use_skip_step_on_nan``: drop the update of a step whose loss or grad norm is not finite, until
    ``max_consecutive_skipped_steps`` (> 0) steps in a row were dropped (0: no limit); otherwise a NaN stops the run."""

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

def kernel_bound(model: Any, dist: Any) -> bool:
    """A single-process run of a model of at least ``derive.JIT_MIN_PARAMS`` parameters: big enough that
    its step is bound by the kernels rather than by dispatching them (bench/train_step.py)."""
    return compiles_blocks(sum(int(np.prod(p.shape)) for p in model.trainable_params()), one_process=dist is None)


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
                 batch_schedule: BatchSchedule, total_steps: int, max_norm: float, nan_policy: NanPolicy,
                 sinks: Sequence[StepSink] = (), checkpointer: Checkpointer | None = None,
                 saved_config: dict | None = None, flops_per_sample: float = 0.0,
                 columns: tuple[str, ...] = ("input_ids", "labels"), monitor: Any = None, stop: StopFlag | None = None,
                 epoch_micro_batches: int = 0, show_mtp: bool = True, seq_length: int = 0, dist: Any = None,
                 jit_blocks: bool | None = None, low_priority_dispatch: bool | None = None,
                 data_check: Callable[[], None] | None = None) -> None:
        import mindspore as ms

        self.model, self.optimizer, self.schedule = model, optimizer, schedule
        self.batches, self.batch_schedule = batches, batch_schedule
        self.total_steps, self.max_norm = int(total_steps), float(max_norm)
        self.step_log = StepLogSink(self.total_steps)  # the reference's step line, and the run's losses
        self.sink = FanOut(self.step_log, *sinks)
        self.checkpointer, self.saved_config = checkpointer, saved_config
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
        self.state = TrainState()  # the state being advanced (given to `fit`)
        self.first_step_seconds: float | None = None
        self._logged_rss = 0  # the peak RSS of the last memory line
        self.dist = dist  # distributed.DistContext of a multi-process job, else None
        self.fault: MftkError | None = None  # a log write or data file failure: save, then stop with it
        self.data_check = data_check  # raises DataFormatError when a data file changed (`DataLoader.check_files`)

    @classmethod
    def from_config(cls, config: Any, *, model: Any, optimizer: AdamW, loader: Any, state: TrainState, dist: Any,
                    layout: Any, checkpointer: Checkpointer | None, sinks: Sequence[StepSink] = (),
                    monitor: Any = None, stop: StopFlag | None = None) -> "Trainer":
        """The trainer of a run: every setting from the validated config, the data from ``state``'s position."""
        from mftk.config.report import resolved
        from mftk.engine.builders import build_schedule
        from mftk.plan.flops import flops_per_step

        tr, m = config.training, config.model
        kind, extra = cls, {}
        if dist is not None and dist.pipeline:
            from mftk.engine.pipeline_trainer import PipelineTrainer

            kind = PipelineTrainer
            extra = {"stage": dist.stage, "schedule_name": config.parallelism.pipeline_parallel_schedule,
                     "local_batch_size": tr.local_batch_size}
        elif getattr(optimizer, "on_device", False):
            from mftk.engine.device_step import DeviceTrainer

            kind = DeviceTrainer
        rampup = tuple(tr.rampup_batch_size) if tr.rampup_batch_size else None
        return kind(
            **extra, model=model, optimizer=optimizer, schedule=build_schedule(config),
            batches=loader.iter_batches(loader.start_batch(state.consumed_samples)),
            batch_schedule=BatchSchedule(tr.global_batch_size, tr.local_batch_size, layout.dp, rampup),
            total_steps=tr.steps, max_norm=tr.max_norm, nan_policy=nan_policy_from(config), sinks=sinks,
            checkpointer=checkpointer, saved_config=resolved(config),
            flops_per_sample=flops_per_step(m, global_batch_size=1) / layout.world, columns=config.model_columns,
            monitor=monitor, stop=stop, epoch_micro_batches=len(loader),
            show_mtp=bool(getattr(model.spec, "mtp_loss_scaling_factor", 0)),
            seq_length=int(getattr(m, "seq_length", 0) or 0), dist=dist,
            low_priority_dispatch=config.mftk.low_priority_dispatch, data_check=getattr(loader, "check_files", None))

    # ------------------------------------------------------------------------------- the loop
    def fit(self, state: TrainState) -> TrainState:
        from mftk.engine.faults import Injector
        from mftk.engine.heartbeat import BEAT

        self.state = state
        faults = Injector.from_env(self.dist.rank if self.dist is not None else 0)
        if faults is not None:
            faults.announce(log)
        BEAT.step_done(state.global_step, start=True)
        try:
            while state.global_step < self.total_steps:
                if faults is not None:
                    faults.before_step(state.global_step + 1, self.model)
                try:
                    self.train_step(state)
                except DataFormatError as exc:  # a data file changed under the run, read before any update
                    if self.dist is not None or self.fault is not None:
                        raise  # the other ranks are in this step's collectives: no save they could join
                    self.fault_found(exc)  # one process: the state after the last step is sound, saved below
                BEAT.step_done(state.global_step)
                self.check_faults()
                self.stop_if_requested(state)
        finally:
            self.dispatch.close()
        self.save_final(state)
        return state

    def check_faults(self) -> None:
        """At a step's end: the run's log files still take writes and its data files are the ones it opened;
        either failure saves a checkpoint and stops the run (`stop_if_requested`), never loses the steps done."""
        from mftk.logs.sinks import write_failure

        if self.fault is not None:
            return
        failure = write_failure(self.sink.sinks)
        if failure is not None:
            self.fault_found(TrainingError(
                message=f"{failure}: the run's log folder is full or not writable",
                hint="free space in the log folder (or pass another --output-dir), then continue with: "
                     "mftk resume CONFIG"))
            return
        if self.data_check is not None:
            try:
                self.data_check()
            except DataFormatError as exc:
                self.fault_found(exc)

    def fault_found(self, exc: MftkError) -> None:
        """Stop after this step with a save, then raise ``exc`` (naming what failed and the checkpoint)."""
        self.fault = exc
        log.error("%s; saving a checkpoint, then stopping", exc.message)
        self.stop.request("fault")

    def train_step(self, state: TrainState) -> dict[str, Any]:
        t0 = time.perf_counter()
        timer = PhaseTimer()
        c0 = _collectives() if self.dist is not None else (0.0, 0)
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
        if self.dist is not None:  # every collective of the step: in the model's forward/backward and in the sync
            c1 = _collectives()
            timer.add("collectives", c1[0] - c0[0])
        metrics = self.metrics(state, plan, out, norm if applied else None, step_ms, timer, lr)
        if self.dist is not None:
            metrics["collectives"] = c1[1] - c0[1]
        self.report(state, metrics, out, grads)
        if self.first_step_seconds is None:
            self.first_step_seconds = step_ms / 1000.0
        self.checkpoint_policy(state, timer)
        return metrics

    # ------------------------------------------------------------------------------- components
    def forward_backward(self, plan: BatchPlan, timer: PhaseTimer) -> tuple[np.ndarray, StepOutput]:
        """Every micro-batch's gradient, scaled by 1/accum and summed in fp32 (reference §2.5)."""
        acc = self.optimizer.grad_buffer()  # the optimizer's flat layout (FSDP: this rank's rows), reused
        scale = 1.0 / plan.accumulation
        losses, aux_sum, mtp_sum, counts, indexer = [], None, None, None, []
        sink = getattr(self.dist, "grad_sink", None)  # FSDP units put their gradients in ``acc``
        for _ in range(plan.accumulation):
            if sink is not None:
                sink.begin(acc, scale, first=not losses)
            t, (outputs, grads) = self.micro_batch(timer)
            _, lm, aux, mtp, tpe = outputs
            fill = self.optimizer.add_grads if len(losses) else self.optimizer.put_grads
            fill(acc, grads, scale)
            grads = None  # the framework's gradients go before the next micro-batch (and the sync)
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

    def micro_batch(self, timer: PhaseTimer) -> tuple[float, tuple[Any, Any]]:
        """The next micro-batch read (timed as ``data``) and its `gradients`; returns the time its compute
        started, for the caller's ``forward_backward`` phase."""
        from mindspore import Tensor

        t = time.perf_counter()
        batch = next(self.batches)
        self.state.micro_batches_read += 1
        timer.add("data", time.perf_counter() - t)
        t = time.perf_counter()
        inputs = [Tensor(np.ascontiguousarray(batch[c])) if c in self.columns and c in batch else None
                  for c in MODEL_INPUTS]
        try:
            return t, self.dispatch.call(self.gradients, inputs)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise TrainingError(message=f"error in the forward/backward pass: {exc}",
                                hint="run with MFTK_DEBUG=1 for the traceback") from exc

    def gradients(self, inputs: list[Any]) -> tuple[Any, list[np.ndarray | None]]:
        """One micro-batch's model outputs and parameter gradients (on the dispatch thread); None for those an
        FSDP unit put in the buffer already (`parallel.fsdp.GradSink`)."""
        sink = getattr(self.dist, "grad_sink", None)
        try:
            outputs, grads = self.grad_fn(*inputs)
        finally:
            done = sink.end() if sink is not None else set()
        return outputs, [None if i in done else g.asnumpy() for i, g in enumerate(grads)]

    def sync(self, acc: np.ndarray, out: StepOutput) -> tuple[np.ndarray, StepOutput]:
        """Data parallel: gradients and logged losses averaged over dp×cp, expert counts summed (FSDP-sharded
        parameters arrive reduced from their units)."""
        d = self.dist
        acc = d.sync_grads(acc)
        means = d.mean([out.loss, *out.aux, *out.mtp, *out.indexer])
        na, nm = len(out.aux), len(out.mtp)
        counts = d.sum_counts(out.tokens_per_expert) if out.tokens_per_expert is not None else None
        return acc, StepOutput(loss=float(means[0]), aux=[float(x) for x in means[1:1 + na]],
                               mtp=[float(x) for x in means[1 + na:1 + na + nm]], tokens_per_expert=counts,
                               local_losses=out.local_losses, indexer=[float(x) for x in means[1 + na + nm:]])

    def grad_norm(self, grads: np.ndarray) -> float:
        if self.dist is not None:  # each element counted once over the whole world
            return self.dist.grad_norm(grads)
        return global_norm(grads)

    def nan_guard(self, state: TrainState, loss: float, norm: float) -> bool:
        """True when the update may be applied; a non-finite loss/norm is skipped or stops the run.

        The limit is the reference's (2.1 §1.4): with N = ``max_consecutive_skipped_steps`` > 0 the run stops
        when ``N <= consecutive skips`` (N = 1 at the first), N = 0 means no limit. Without skipping mftk
        stops at the first non-finite step; the reference would apply it and continue."""
        if math.isfinite(loss) and math.isfinite(norm):
            state.consecutive_skipped = 0
            return True
        step = state.global_step + 1
        if not self.nan_policy.skip:
            raise TrainingError(message=f"loss {loss} / grad_norm {norm} is not finite at step {step}; training stopped "
                                "before applying the update (MindSpore Transformers would apply it, log nan and "
                                "continue; mftk stops so no weight becomes NaN)", step=step,
                                hint="lower lr_scheduler.learning_rate or training.max_norm, or set "
                                "training.use_skip_step_on_nan: true to skip such steps")
        state.consecutive_skipped += 1
        state.skipped_steps += 1
        limit = self.nan_policy.max_consecutive
        log.warning("step %d: loss %s / grad_norm %s is not finite; update skipped (%d in a row, limit %s)",
                    step, loss, norm, state.consecutive_skipped, limit if limit > 0 else "none")
        if 0 < limit <= state.consecutive_skipped:
            raise TrainingError(message=f"{state.consecutive_skipped} consecutive step(s) had a non-finite loss or "
                                f"gradient, reaching training.max_consecutive_skipped_steps={limit}", step=step,
                                hint="resume from the last checkpoint with a lower learning rate")
        return False

    def clip(self, grads: np.ndarray, norm: float) -> None:
        c = clip_factor(norm, self.max_norm)
        if c < 1.0:
            grads *= np.float32(c)

    def optimizer_step(self, grads: np.ndarray, timer: PhaseTimer) -> float:
        t = time.perf_counter()
        lr = self.schedule(self.optimizer.global_step)
        self.optimizer.step(grads, lr)
        if not getattr(self.optimizer, "shares_weights", False):  # else the update has written the weights
            # (and reading the masters would copy every one to the host: the device path's whole model)
            self.dispatch.call(write_masters, self.model, self.params, self.optimizer.masters())
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
            state.epoch = state.micro_batches_read // self.epoch_micro_batches

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
        m["lr"] = self.schedule(self.optimizer.global_step)  # the reference logs the *next* update's LR
        m["grad_norm"] = norm
        if self.flops_per_sample:
            m["throughput"] = self.flops_per_sample * plan.global_batch_size / (max(step_ms, 1e-3) * 1e9)
        m.update(self.memory())
        m.update({"lr_used": lr_used, "skipped": norm is None, "total_steps": self.total_steps,
                  "accumulation": plan.accumulation, "epoch": state.epoch,
                  "tokens": plan.global_batch_size * self.seq_length,
                  **{f"time_{k}_ms": v * 1000.0 for k, v in timer.seconds.items()}})
        return m

    def memory(self) -> dict[str, float]:
        """This rank's peak host RSS (and device peak where MindSpore reports one) so far, in MiB; logged when
        it has grown by more than 1 % since the last line (``metrics.jsonl`` has it at every step)."""
        from mftk.engine.memstat import device_peak_bytes, peak_rss_bytes

        out = {}
        rss, dev = peak_rss_bytes(), device_peak_bytes()
        if rss is not None:
            out["peak_rss_mib"] = rss / 2 ** 20
        if dev is not None:
            out["peak_device_mib"] = dev / 2 ** 20
        if rss is not None and rss > self._logged_rss * 1.01:
            self._logged_rss = rss
            rank = self.dist.rank if self.dist is not None else 0
            log.info("Memory: rank %d peak RSS %.0f MiB%s", rank, rss / 2 ** 20,
                     f", device peak {dev / 2 ** 20:.0f} MiB" if dev is not None else "")
        return out

    def report(self, state: TrainState, metrics: dict[str, Any], out: StepOutput, grads: np.ndarray) -> None:
        if self.monitor is not None:  # monitors may add to the step's record (the MoE monitor's expert load)
            metrics.update(self.monitor.flush(state.global_step, out, grads, self.optimizer) or {})
        self.sink.on_step(metrics)

    def checkpoint_policy(self, state: TrainState, timer: PhaseTimer | None = None) -> None:
        if self.checkpointer is None:
            return
        t = time.perf_counter()
        if self.save(state, SaveReason.INTERVAL) and timer is not None:
            timer.add("save", time.perf_counter() - t)

    def stop_if_requested(self, state: TrainState) -> None:
        """Save and raise TrainingInterrupted when a stop was requested; under several processes only when the
        ranks agreed on it (`DistContext.any_flag`), so that every rank stops (and saves) at the same step.

        The agreed value alone decides: a signal that arrives while this rank waits in the agreement's
        collective runs its handler as the collective returns, setting the local flag after the others were
        told False. Stopping on it would leave this rank saving while the others run the next step's
        collectives (both sides then fail); it is agreed on at the next step's end instead."""
        requested = self.stop.requested
        if self.dist is not None:
            requested = self.dist.any_flag(requested)
            if requested and not self.stop.requested:
                self.stop.request("SIGTERM (on another rank)")
        if not requested:
            return
        path = ""
        if self.checkpointer is not None:
            self.save(state, SaveReason.SIGNAL)
            path = self.checkpointer.last_path
        if self.fault is not None:
            raise _with_save(self.fault, state.global_step, path)
        raise TrainingInterrupted(message=f"{self.stop.signal_name} received: stopped after step {state.global_step}"
                                  + (f", checkpoint saved to {path}" if path else " (checkpoints disabled: nothing saved)"),
                                  step=state.global_step, saved_path=path,
                                  hint="continue with: mftk resume CONFIG" if path else "")

    def save_final(self, state: TrainState) -> None:
        if self.checkpointer is not None:
            self.save(state, SaveReason.FINAL)

    def save(self, state: TrainState, reason: SaveReason) -> bool:
        """Ask the checkpointer to save this step for ``reason``; it decides whether one is due."""
        from mftk.engine.heartbeat import BEAT

        BEAT.saving(True)  # the watchdog sees a save as progress of its own
        try:
            return self.checkpointer.save(state.global_step, reason, lambda: self.payload(state), self.sink)
        finally:
            BEAT.saving(False)

    def payload(self, state: TrainState) -> Payload:
        """What this rank writes for the current step."""
        gbs, bs = self.last_gbs, self.batch_schedule
        common = CommonInfo.for_step(step=state.global_step, max_steps=self.total_steps, global_batch_size=gbs,
                                     consumed_samples=state.consumed_samples, epoch=state.epoch,
                                     extra=state.common_extra)
        opt = None
        if self.checkpointer.save_optim:
            from mftk.engine.state import low_precision

            opt = self.optimizer.state_dict(with_masters=low_precision(self.params))
        model = model_tensors(self.model)
        if self.dist is not None:  # the tensors this rank's stage saves: TP/EP blocks, FSDP rows
            model = self.dist.saved_model(model)
            opt = self.dist.saved_optimizer(opt) if opt is not None else None
        extra = extra_state(state, global_batch_size=gbs, dp=bs.dp, local_batch_size=bs.local_batch_size)
        return Payload(common=common, model=model, optimizer=opt, extra=extra, config=self.saved_config)


def _with_save(exc: MftkError, step: int, path: str) -> MftkError:
    """``exc`` again, its message saying where the run stopped and what was saved."""
    fields = {n: getattr(exc, n) for n in exc.FIELDS}
    fields["message"] = (f"{exc.message}; stopped after step {step}"
                         + (f", checkpoint saved to {path}" if path else " (checkpoints disabled: nothing saved)"))
    if "continue with" not in exc.hint and path:
        fields["hint"] = (exc.hint + "; then " if exc.hint else "") + "continue with: mftk resume CONFIG"
    return type(exc)(**fields)


def _collectives() -> tuple[float, int]:
    """(seconds inside collectives, collectives called) of this process so far."""
    from mftk.engine.parallel.comm import CLOCK

    return CLOCK.seconds, CLOCK.calls


def nan_policy_from(config: Any) -> NanPolicy:
    """The skip-on-NaN policy of ``training.use_skip_step_on_nan`` / ``max_consecutive_skipped_steps``."""
    tr = config.training
    return NanPolicy(skip=tr.use_skip_step_on_nan, max_consecutive=tr.max_consecutive_skipped_steps)
