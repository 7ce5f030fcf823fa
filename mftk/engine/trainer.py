"""The training loop: one optimizer step is a list of named component calls (reference §2.3).

    plan     = batches.at(consumed_samples)        # static or ramp-up gbs → accumulation steps
    grads    = path.accumulate(plan)               # data fetch + fwd/bwd per micro-batch, fp32 accumulation
    norm     = path.norm(grads)                    # reported *before* clipping
    nan_guard(norm, loss)                          # skip-on-NaN (budgeted) or stop with TrainingError
    path.clip(grads, clip_factor(norm))            # max_norm <= 0 disables clipping (reference: zeroes/flips)
    path.update(grads, schedule(global_step))      # lr = schedule(global_step) before the increment
    expert_bias_update(tokens_per_expert)          # after the optimizer, every step (reference LossCallback)
    advance(state)                                 # consumed_samples += gbs; global_step += 1
    report(metrics)                                # the MF log line + JSON metrics through StepSinks
    checkpointer.save(step, INTERVAL)              # every save_interleaved_steps (ckpt.checkpointer), FINAL at the end
    stop.check()                                   # SIGTERM/SIGINT: save (SIGNAL), then TrainingInterrupted

Every policy lives in its component; the loop body only calls them in order. How gradients are made and
applied is the gradient path's (`grad_path.GradientPath`: host, device-resident or pipeline), picked with
the other parts by `trainer_build`; `Trainer.from_config` builds the trainer of a run from its validated
config. Its counters live in `TrainState`.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Sequence

import numpy as np

from mftk.ckpt.checkpointer import Checkpointer, Payload, SaveReason
from mftk.ckpt.common import CommonInfo
from mftk.engine.optim import AdamW, clip_factor
from mftk.engine.state import TrainState, extra_state, model_tensors
from mftk.engine.step import BatchPlan, PhaseTimer, StepOutput, StopFlag
from mftk.engine.trainer_build import TrainerParts, build_parts
from mftk.errors import DataFormatError, MftkError, TrainingError, TrainingInterrupted
from mftk.logs.sinks import StepLogSink
from mftk.progress import FanOut, StepSink

log = logging.getLogger("mftk.train")


class Trainer:
    """Runs steps ``state.global_step + 1 .. total_steps`` on one process, with the parts `trainer_build` made."""

    def __init__(self, parts: TrainerParts) -> None:
        self.path, self.schedule, self.plan = parts.path, parts.schedule, parts.plan
        self.model, self.optimizer, self.dist = parts.path.model, parts.path.optimizer, parts.path.dist
        self.total_steps = int(parts.plan.total_steps)
        self.step_log = StepLogSink(self.total_steps)  # the reference's step line, and the run's losses
        self.sink = FanOut(self.step_log, *parts.sinks)
        self.checkpointer, self.saved_config, self.monitor = parts.checkpointer, parts.saved_config, parts.monitor
        self.stop = parts.stop or StopFlag()
        self.data_check = parts.data_check  # raises DataFormatError when a data file changed
        self.last_gbs = parts.plan.batches.global_batch_size
        self.state = TrainState()  # the state being advanced (given to `fit`)
        self.first_step_seconds: float | None = None
        self._logged_rss = 0  # the peak RSS of the last memory line
        self.fault: MftkError | None = None  # a log write or data file failure: save, then stop with it

    @classmethod
    def from_config(cls, config: Any, *, model: Any, optimizer: AdamW, loader: Any, state: TrainState, dist: Any,
                    layout: Any, checkpointer: Checkpointer | None, sinks: Sequence[StepSink] = (),
                    monitor: Any = None, stop: StopFlag | None = None) -> "Trainer":
        """The trainer of a run (`trainer_build.build_parts`)."""
        return cls(build_parts(config, model=model, optimizer=optimizer, loader=loader, state=state, dist=dist,
                               layout=layout, checkpointer=checkpointer, sinks=sinks, monitor=monitor, stop=stop))

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
            self.path.close()
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
        plan = self.plan.batches.at(state.consumed_samples)
        grads, out = self.path.accumulate(plan, state, timer)
        norm = self.path.norm(grads)
        applied = self.nan_guard(state, out.loss, norm)
        lr = None
        if applied:
            self.clip(grads, norm)
            lr = self.schedule(self.optimizer.global_step)
            self.path.update(grads, lr, timer)
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
    def nan_guard(self, state: TrainState, loss: float, norm: float) -> bool:
        """True when the update may be applied; a non-finite loss/norm is skipped or stops the run.

        The limit is the reference's (2.1 §1.4): with N = ``max_consecutive_skipped_steps`` > 0 the run stops
        when ``N <= consecutive skips`` (N = 1 at the first), N = 0 means no limit. Without skipping mftk
        stops at the first non-finite step; the reference would apply it and continue."""
        if math.isfinite(loss) and math.isfinite(norm):
            state.consecutive_skipped = 0
            return True
        step = state.global_step + 1
        if not self.plan.nan_policy.skip:
            raise TrainingError(message=f"loss {loss} / grad_norm {norm} is not finite at step {step}; training stopped "
                                "before applying the update (MindSpore Transformers would apply it, log nan and "
                                "continue; mftk stops so no weight becomes NaN)", step=step,
                                hint="lower lr_scheduler.learning_rate or training.max_norm, or set "
                                "training.use_skip_step_on_nan: true to skip such steps")
        state.consecutive_skipped += 1
        state.skipped_steps += 1
        limit = self.plan.nan_policy.max_consecutive
        log.warning("step %d: loss %s / grad_norm %s is not finite; update skipped (%d in a row, limit %s)",
                    step, loss, norm, state.consecutive_skipped, limit if limit > 0 else "none")
        if 0 < limit <= state.consecutive_skipped:
            raise TrainingError(message=f"{state.consecutive_skipped} consecutive step(s) had a non-finite loss or "
                                f"gradient, reaching training.max_consecutive_skipped_steps={limit}", step=step,
                                hint="resume from the last checkpoint with a lower learning rate")
        return False

    def clip(self, grads: Any, norm: float) -> None:
        c = clip_factor(norm, self.plan.max_norm)
        if c < 1.0:
            self.path.clip(grads, c)

    def expert_bias_update(self, tokens_per_expert: np.ndarray | None) -> None:
        if tokens_per_expert is not None and len(tokens_per_expert):
            self.model.update_expert_bias(tokens_per_expert)

    def advance(self, state: TrainState, plan: BatchPlan) -> None:
        state.consumed_samples += plan.global_batch_size
        state.global_step += 1
        self.last_gbs = plan.global_batch_size
        if self.plan.epoch_micro_batches:
            state.epoch = state.micro_batches_read // self.plan.epoch_micro_batches

    def metrics(self, state: TrainState, plan: BatchPlan, out: StepOutput, norm: float | None, step_ms: float,
                timer: PhaseTimer, lr_used: float | None) -> dict[str, Any]:
        m: dict[str, Any] = {"step": state.global_step, "consumed_samples": state.consumed_samples,
                             "global_batch_size": plan.global_batch_size, "loss": out.loss,
                             "per_step_time": int(step_ms)}
        if out.aux:
            m["load_balancing_loss"] = float(np.mean(out.aux))
        m.update(out.named)  # the model's own (DeepSeek-V4: indexer_loss)
        if self.plan.show_mtp:
            for k, v in enumerate(out.mtp, start=1):
                m[f"mtp_{k}_loss"] = v
        m["lr"] = self.schedule(self.optimizer.global_step)  # the reference logs the *next* update's LR
        m["grad_norm"] = norm
        if self.plan.flops_per_sample:
            m["throughput"] = self.plan.flops_per_sample * plan.global_batch_size / (max(step_ms, 1e-3) * 1e9)
        m.update(self.memory())
        m.update({"lr_used": lr_used, "skipped": norm is None, "total_steps": self.total_steps,
                  "accumulation": plan.accumulation, "epoch": state.epoch,
                  "tokens": plan.global_batch_size * self.plan.seq_length,
                  **{f"time_{k}_ms": v * 1000.0 for k, v in timer.seconds.items()}})
        if not self.path.holds_loss:  # the reference's non-last-stage line; the real values stay in the JSON
            m["pipeline_loss"], m["loss"] = m["loss"], None
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

    def report(self, state: TrainState, metrics: dict[str, Any], out: StepOutput, grads: Any) -> None:
        if self.monitor is not None:  # monitors may add to the step's record (the MoE monitor's expert load)
            host = self.path.host_grads(grads)
            metrics.update(self.monitor.flush(state.global_step, out, host, self.optimizer) or {})
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
        gbs, bs = self.last_gbs, self.plan.batches
        common = CommonInfo.for_step(step=state.global_step, max_steps=self.total_steps, global_batch_size=gbs,
                                     consumed_samples=state.consumed_samples, epoch=state.epoch,
                                     extra=state.common_extra)
        opt = None
        if self.checkpointer.save_optim:
            from mftk.engine.state import low_precision

            opt = self.optimizer.state_dict(with_masters=low_precision(self.path.params))
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
