"""``train(loaded_config, ...)``: the one library entry point behind `mftk train` and `mftk resume`.

A builder: start-up, each phase timed and logged: process setup (seed, determinism) → model build →
resume plan and checkpoint load → process groups (several workers) → data index build → optimizer →
``trainer.fit`` (the loop, `trainer.py`). Outputs under ``output_dir``: ``log/rank_<r>/info.log`` (the
reference's file format) and ``log/rank_<r>/metrics.jsonl`` (mftk's full-precision JSON lines). Console
output is the caller's: attach a handler to the ``mftk.train`` logger (`mftk.logs.sinks.mf_console_handler`)
and/or pass sinks. The pieces live next door: `builders` (model, data, optimizer), `restore` with
`ckpt.resume` (the resume plan and its decisions) and loading it, `lora` (base and adapter checkpoints),
`parallel.startup` (process groups), `process` (device, seeds, signals), `ckpt.guard` (the save path),
`ckpt.checkpointer` (saving), `workers` (the msrun job).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable

import attrs

from mftk.ckpt.checkpointer import Checkpointer
from mftk.ckpt.guard import check_writable, hold_save_path, save_path_notes
from mftk.ckpt.resume import ResumePlan, continues_in, source_step, starts_weights_only
from mftk.config.runnable import runnable_layout
from mftk.derive import accumulation_steps
from mftk.engine import builders, lora
from mftk.engine.device_optim import chosen
from mftk.engine.memstat import release_freed_memory
from mftk.engine.monitor import build_monitors
from mftk.engine.parallel.startup import distribute
from mftk.engine.process import StopSignals, rank, setup_process
from mftk.engine.restore import load_checkpoint, plan_start, restore_state
from mftk.engine.state import share_masters
from mftk.engine.trainer import StopFlag, Trainer
from mftk.logs.format import MetricsFileSink
from mftk.logs.sinks import attach_file_log, detach, log, phase_line
from mftk.plan.flops import param_counts
from mftk.progress import StepSink
from mftk.units import every_steps


@attrs.frozen
class TrainResult:
    start_step: int
    final_step: int
    total_steps: int
    consumed_samples: int
    losses: tuple[float, ...]
    grad_norms: tuple[float | None, ...]
    skipped_steps: int
    checkpoint: str  # last checkpoint dir written ("" when none)
    output_dir: str
    log_file: str
    metrics_file: str
    phases: tuple[tuple[str, float], ...]
    resume: ResumePlan | None = None
    dry_run: bool = False
    notes: tuple[str, ...] = ()
    parameters: tuple[int, int] = (0, 0)  # (total, active) of the model trained (`plan.flops.param_counts`)


class _Phases:
    """Start-up phases, timed and logged as they end."""

    def __init__(self) -> None:
        self.items: list[tuple[str, float]] = []

    def add(self, name: str, seconds: float) -> None:
        self.items.append((name, seconds))
        phase_line(name, seconds)

    def timed(self, name: str, fn: Any, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        out = fn(*args, **kw)
        self.add(name, time.perf_counter() - t)
        return out


def train(loaded: Any, *, output_dir: str | os.PathLike = "output", sinks: Iterable[StepSink] = (),
          resume_from: str | os.PathLike | None = None, weights_only: bool = False, dry_run: bool = False,
          world_size: int = 1, install_signals: bool = True, stop: Any = None, new_run: bool = False,
          lock_save_path: bool = True, model_from_checkpoint: bool = False) -> TrainResult:
    """Train (or resume) on this process as the config says; returns what happened.

    ``resume_from`` overrides ``checkpoint.load_path``; ``weights_only`` is ``no_load_optim``; ``new_run``
    allows a run that starts at step 0 in a ``save_path`` holding checkpoints (`mftk.ckpt.guard`).
    ``model_from_checkpoint``: when the YAML's ``model:`` does not fit the checkpoint, train the architecture
    the checkpoint was saved with (otherwise that is an error listing the differing fields).
    ``dry_run`` decides the resume plan (or checks the start) and returns without training.
    ``lock_save_path``: hold ``checkpoint.save_path``'s lock for the run (`mftk.ckpt.guard.hold_save_path`);
    False when another process of the job (an msrun parent) holds it.
    """
    layout = runnable_layout(loaded, world_size)
    this_rank = rank() if world_size > 1 and not dry_run else 0
    out_dir = Path(output_dir)
    log_dir = out_dir / "log" / f"rank_{this_rank}"
    ck = loaded.config.checkpoint
    stop = StopFlag() if stop is None else stop
    with hold_save_path(ck.save_path, enabled=lock_save_path and ck.enable_save and not dry_run):  # before any log
        handler = None if dry_run else attach_file_log(log_dir)
        run = _Run(loaded, layout=layout, out_dir=out_dir, log_dir=log_dir, sinks=list(sinks), rank=this_rank)
        try:
            with StopSignals(stop, install_signals and not dry_run):  # from start-up on: none is lost
                run.phases.timed("process setup", setup_process, loaded.config)
                return run.execute(resume_from=resume_from, weights_only=weights_only, dry_run=dry_run,
                                   stop=stop, new_run=new_run, model_from_checkpoint=model_from_checkpoint)
        finally:
            run.close()
            if handler is not None:
                detach(handler)


class _Run:
    """One run's wiring, in start-up order; `close` releases the sinks it opened."""

    def __init__(self, loaded: Any, *, layout: Any, out_dir: Path, log_dir: Path, sinks: list, rank: int) -> None:
        self.loaded, self.config, self.layout = loaded, loaded.config, layout
        self.out_dir, self.log_dir, self.sinks, self.rank = out_dir, log_dir, sinks, rank
        self.phases = _Phases()
        self.own_sinks: list[Any] = []
        self.notes: list[str] = [p.render() for p in loaded.notes if p.severity == "warning"]

    def close(self) -> None:
        for s in self.own_sinks:
            s.close()

    def execute(self, *, resume_from: Any, weights_only: bool, dry_run: bool, stop: Any, new_run: bool,
                model_from_checkpoint: bool = False) -> TrainResult:
        tr, ck, layout = self.config.training, self.config.checkpoint, self.layout
        log.info("Got parallelism settings: data_parallel=%d(dp_shard[%d] * dp_replicate[%d]), tensor_parallel=%d, "
                 "pipeline_parallel=%d, context_parallel=%d", layout.dp, layout.dp_shard, layout.dp_replicate,
                 layout.tp, layout.pp, layout.cp)
        log.info("Calculate global_batch_size=%d, num_accumulation_steps=%d.", tr.global_batch_size,
                 accumulation_steps(tr.global_batch_size, tr.local_batch_size, layout.dp)[0] or 1)
        load_path = str(resume_from) if resume_from else ck.load_path
        model = self.phases.timed("model build", builders.build_model, self.config, lazy=dry_run)
        plan = None
        base, notes = lora.base_checkpoint(self.config, load_path)
        self.notes += notes
        if base and not dry_run:  # LoRA: the frozen base first (2.1 §2.8), then the adapters (if any) on top
            self.phases.timed("base checkpoint load", lora.load_base, model, self.config, base, layout=layout,
                              rank=self.rank)
        if load_path:
            self.config, model, plan, warnings = plan_start(
                self.config, model, load_path, weights_only=starts_weights_only(self.config, weights_only),
                layout=layout, build=lambda c: builders.build_model(c, lazy=dry_run),
                model_from_checkpoint=model_from_checkpoint)
            self.notes += warnings
        for n in save_path_notes(self.config, plan=plan, new_run=new_run):
            log.warning(n)
            self.notes.append(n)
        if dry_run:
            return self._result(start=plan.start_step if plan else 0, plan=plan)
        if ck.enable_save:
            check_writable(ck.save_path)
        loaded = None
        if plan is not None:  # into the full model: checkpoints hold global tensors, cut below for TP/EP
            loaded = self.phases.timed("checkpoint load", load_checkpoint, plan, model, self.config, rank=self.rank)
        dist = None
        if layout.world > 1:
            model, dist = self.phases.timed("process groups", distribute, model, layout, self.config)
        data = self.phases.timed("data index build", builders.build_data, self.config, dp=layout.dp,
                                 dp_rank=dist.groups.dp_rank if dist else 0)
        loader = data.loader
        state = restore_state(plan, loaded, epoch_micro_batches=len(loader),
                              start_batch=loader.start_batch(plan.consumed_samples if plan else 0))
        if state.consumed_samples:
            log.info("Resume dataset (static batch): skip %d micro-batches (consumed_samples=%d, global_step=%d).",
                     loader.start_batch(state.consumed_samples), state.consumed_samples, state.global_step)
        optimizer = self.phases.timed("optimizer", self._optimizer, model, dist, plan, loaded)
        trainer = self._trainer(model, optimizer, loader, dist, plan, state, stop)
        if state.global_step >= tr.steps:
            self.notes.append(f"nothing to do: the checkpoint is at step {state.global_step} and training.steps is "
                              f"{tr.steps}")
            log.info(self.notes[-1])
        start_step = state.global_step
        log.info("Start training loop...")
        trainer.fit(state)  # a signal (now, or during start-up) stops it after a step, with a save
        if trainer.first_step_seconds is not None:
            self.phases.items.append(("first step", trainer.first_step_seconds))
        ckpt = trainer.checkpointer
        log.info("Training completed at step %d.%s", state.global_step,
                 f" Final checkpoint: {ckpt.last_path}" if ckpt and ckpt.last_path else "")
        return self._result(start=start_step, plan=plan, state=state, losses=tuple(trainer.step_log.losses),
                            grad_norms=tuple(trainer.step_log.norms), checkpoint=ckpt.last_path if ckpt else "")

    def _result(self, *, start: int, plan: ResumePlan | None, state: Any = None, losses: tuple = (),
                grad_norms: tuple = (), checkpoint: str = "") -> TrainResult:
        """What happened; without a ``state`` a dry run, which trained nothing and wrote no log."""
        trained = state is not None
        return TrainResult(start_step=start, final_step=state.global_step if trained else start,
                           total_steps=self.config.training.steps, losses=losses, grad_norms=grad_norms,
                           consumed_samples=state.consumed_samples if trained else plan.consumed_samples if plan else 0,
                           skipped_steps=state.skipped_steps if trained else 0, checkpoint=checkpoint,
                           output_dir=str(self.out_dir), log_file=str(self.log_dir / "info.log") if trained else "",
                           metrics_file=str(self.log_dir / "metrics.jsonl") if trained else "",
                           phases=tuple(self.phases.items), resume=plan, dry_run=not trained, notes=tuple(self.notes),
                           parameters=param_counts(self.config.model) if trained else (0, 0))

    def _optimizer(self, model: Any, dist: Any, plan: ResumePlan | None, loaded: Any) -> Any:
        on_device = chosen(self.config, self.layout)
        optimizer = builders.build_optimizer(self.config, model, dist, on_device=on_device)
        if dist is not None:
            dist.bind(optimizer, list(model.trainable_params()))
            if not on_device:  # the device update writes the weights itself
                share_masters(list(model.trainable_params()), optimizer)  # weights = masters (several processes)
                release_freed_memory()  # the weights share_masters replaced, freed on this (the build's) thread
        if loaded is not None and loaded.optimizer is not None:
            optimizer.load_state_dict(dist.cut(loaded.optimizer) if dist else loaded.optimizer, where=str(plan.step_dir))
        return optimizer

    def _trainer(self, model: Any, optimizer: Any, loader: Any, dist: Any, plan: ResumePlan | None, state: Any,
                 stop: Any) -> Any:
        ck = self.config.checkpoint
        self.log_dir.mkdir(parents=True, exist_ok=True)
        metrics = MetricsFileSink(str(self.log_dir / "metrics.jsonl"))
        self.own_sinks.append(metrics)
        checkpointer = None
        if ck.enable_save:
            here = continues_in(plan, ck.save_path)
            checkpointer = Checkpointer(root=os.path.realpath(ck.save_path), interval=ck.save_interleaved_steps,
                                        save_max=ck.save_max, prefix=ck.prefix, save_optim=not ck.no_save_optim,
                                        async_save=ck.async_save, comm=dist, start_step=state.global_step,
                                        last_saved_step=state.global_step if here else None,
                                        adapter_manifest=lora.adapter_manifest(self.config, state),
                                        source_step=source_step(plan) if here else None)
            log.info("Checkpoints will be saved every %s starting from step %d, first save at step %d.",
                     every_steps(ck.save_interleaved_steps), state.global_step,
                     state.global_step + ck.save_interleaved_steps)
        monitor, monitor_sinks = build_monitors(self.loaded, rank=self.rank, world=self.layout.world, model=model)
        self.own_sinks.extend(monitor_sinks)  # closed at the end (stops the profiler, flushes TensorBoard)
        return Trainer.from_config(self.config, model=model, optimizer=optimizer, loader=loader, state=state,
                                   dist=dist, layout=self.layout, checkpointer=checkpointer,
                                   sinks=[metrics, *self.sinks, *monitor_sinks],
                                   monitor=monitor if monitor.enabled else None, stop=stop)
