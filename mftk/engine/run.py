"""``train(loaded_config, ...)``: the one library entry point behind `mftk train` and `mftk resume`.

Start-up, each phase timed and logged: process setup (seed, determinism) → model build → resume plan
and checkpoint load → process groups (several workers) → data index build → optimizer → the loop
(`trainer.py`). Outputs under ``output_dir``: ``log/rank_<r>/info.log`` (the reference's file format)
and ``log/rank_<r>/metrics.jsonl`` (mftk's full-precision JSON lines). Console output is the caller's:
attach a handler to the ``mftk.train`` logger (`mftk.logs.sinks.mf_console_handler`) and/or pass sinks.
The pieces live next door: `builders` (model, data, optimizer, schedule), `ckpt.resume` (the resume
plan) and `restore` (loading it), `ckpt.checkpointer` (saving), `workers` (the msrun job).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import attrs
import numpy as np

from mftk.ckpt.resume import ResumePlan, ResumeScenario
from mftk.errors import CheckpointError
from mftk.logs.sinks import attach_file_log, detach, log, phase_line
from mftk.progress import StepSink
from mftk.units import every_steps, plural


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
    from mftk.ckpt.guard import hold_save_path
    from mftk.config.runnable import runnable_layout

    layout = runnable_layout(loaded, world_size)
    rank = _rank() if world_size > 1 and not dry_run else 0
    out_dir = Path(output_dir)
    log_dir = out_dir / "log" / f"rank_{rank}"
    ck = loaded.config.checkpoint
    if stop is None:
        from mftk.engine.trainer import StopFlag

        stop = StopFlag()
    with hold_save_path(ck.save_path, enabled=lock_save_path and ck.enable_save and not dry_run):  # before any log
        handler = None if dry_run else attach_file_log(log_dir)
        run = _Run(loaded, layout=layout, out_dir=out_dir, log_dir=log_dir, sinks=list(sinks), rank=rank)
        try:
            with _signals(stop, install_signals and not dry_run):  # from start-up on: none is lost
                run.phases.timed("process setup", _setup_process, loaded.config)
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
        from mftk.engine import builders
        from mftk.engine.restore import load_checkpoint, restore_state

        tr, ck, layout = self.config.training, self.config.checkpoint, self.layout
        log.info("Got parallelism settings: data_parallel=%d(dp_shard[%d] * dp_replicate[%d]), tensor_parallel=%d, "
                 "pipeline_parallel=%d, context_parallel=%d", layout.dp, layout.dp_shard, layout.dp_replicate,
                 layout.tp, layout.pp, layout.cp)
        from mftk.derive import accumulation_steps

        log.info("Calculate global_batch_size=%d, num_accumulation_steps=%d.", tr.global_batch_size,
                 accumulation_steps(tr.global_batch_size, tr.local_batch_size, layout.dp)[0] or 1)
        weights_only = weights_only or ck.no_load_optim
        load_path = str(resume_from) if resume_from else ck.load_path
        model = self.phases.timed("model build", builders.build_model, self.config, lazy=dry_run)
        plan = None
        base = self._base_checkpoint(load_path)
        if base and not dry_run:  # LoRA: the frozen base first (2.1 §2.8), then the adapters (if any) on top
            self.phases.timed("base checkpoint load", self._load_base, model, base)
        if load_path:
            model, plan = self._plan_resume(model, load_path, weights_only, lazy=dry_run,
                                            model_from_checkpoint=model_from_checkpoint)
        self._check_save_path(plan, new_run)
        if dry_run:
            start = plan.start_step if plan else 0
            return TrainResult(start_step=start, final_step=start, total_steps=tr.steps,
                               consumed_samples=plan.consumed_samples if plan else 0, losses=(), grad_norms=(),
                               skipped_steps=0, checkpoint="", output_dir=str(self.out_dir), log_file="",
                               metrics_file="", phases=tuple(self.phases.items), resume=plan, dry_run=True,
                               notes=tuple(self.notes))
        if ck.enable_save:
            _check_writable(ck.save_path)
        loaded = None
        if plan is not None:  # into the full model: checkpoints hold global tensors, cut below for TP/EP
            loaded = self.phases.timed("checkpoint load", load_checkpoint, plan, model, self.config, rank=self.rank)
        dist = None
        if layout.world > 1:
            model, dist = self._distribute(model)
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
        return TrainResult(start_step=start_step, final_step=state.global_step, total_steps=tr.steps,
                           consumed_samples=state.consumed_samples, losses=tuple(trainer.step_log.losses),
                           grad_norms=tuple(trainer.step_log.norms), skipped_steps=state.skipped_steps,
                           checkpoint=ckpt.last_path if ckpt else "", output_dir=str(self.out_dir),
                           log_file=str(self.log_dir / "info.log"), metrics_file=str(self.log_dir / "metrics.jsonl"),
                           phases=tuple(self.phases.items), resume=plan, notes=tuple(self.notes))

    # ------------------------------------------------------------------------------- resume
    def _plan_resume(self, model: Any, load_path: str, weights_only: bool, *, lazy: bool,
                     model_from_checkpoint: bool = False) -> tuple[Any, ResumePlan]:
        """The resume plan for the YAML's model. When that model does not fit the checkpoint but the
        checkpoint's saved config does, the differing ``model:`` fields are an error, unless
        ``model_from_checkpoint`` asks for the checkpoint's architecture (issue 35: it used to be taken
        silently, so a Qwen3 YAML trained a DeepSeek-V3 checkpoint). A target step below the checkpoint's
        is an error too. A dry run decides the same way."""
        from mftk.ckpt.resume import plan_resume
        from mftk.engine import builders

        def plan_for(m: Any) -> ResumePlan:
            return plan_resume(self.config, load_path, weights_only=weights_only, params=builders.param_shapes(m),
                               world=self.layout.world, dp=self.layout.dp)

        plan = plan_for(model)
        saved, differences = _saved_architecture(plan, self.config.model)
        if plan.problems and saved is not None:
            config = attrs.evolve(self.config, model=saved)
            candidate = builders.build_model(config, lazy=lazy)
            replan = plan_resume(config, load_path, weights_only=weights_only,
                                 params=builders.param_shapes(candidate), world=self.layout.world, dp=self.layout.dp)
            if not replan.problems:
                if not model_from_checkpoint:
                    raise CheckpointError(
                        message=f"the model: section differs from the checkpoint's ({plan.step_dir}, saved config): "
                                f"{plural(len(differences), 'field')}", path=plan.step_dir, problems=differences,
                        hint="make the model: section match the checkpoint, or resume with `mftk resume "
                             "--model-from-checkpoint` to train the checkpoint's architecture")
                self.config, model, plan = config, candidate, replan
                self.notes.append("the model: section does not fit the checkpoint; its architecture is taken from "
                                  f"the checkpoint's saved config ({'; '.join(differences)})")
                log.warning(self.notes[-1])
        elif differences:
            self.notes.append("model: keys differ from the checkpoint's saved config (the YAML's are used): "
                              + "; ".join(differences))
            log.warning(self.notes[-1])
        _check_target_step(plan, self.config.training.steps)
        for n in plan.skipped:  # damaged newer checkpoints: never loaded (`ckpt.resume.select_checkpoint`)
            self.notes.append(f"{n}; resuming from {Path(plan.step_dir).name}")
            log.warning(self.notes[-1])
        for n in plan.notes:
            log.info(n)
        jump = _lr_jump(plan, self.config)
        if jump:
            self.notes.append(jump)
            log.warning(jump)
        return model, plan

    def _base_checkpoint(self, load_path: str) -> str:
        """``checkpoint.base_load_path`` when it is to be loaded: the run starts from it (no load_path) or
        load_path is an adapter-only checkpoint (whose manifest must name the same base)."""
        from mftk.ckpt.layout import locate
        from mftk.ckpt.lora import fingerprint, is_adapter_checkpoint, read_manifest

        base = self.config.checkpoint.base_load_path.strip()
        adapter_only = bool(load_path) and is_adapter_checkpoint(load_path)
        if adapter_only and not base:
            raise CheckpointError(message="An adapter-only checkpoint requires checkpoint.base_load_path.",
                                  path=load_path, hint="set checkpoint.base_load_path to the base it was trained on")
        if not base:
            return ""
        if not Path(base).exists():
            raise CheckpointError(message=f"base_load_path does not exist: {base}", path=base,
                                  hint="point checkpoint.base_load_path at the frozen base (an HF dir or a checkpoint)")
        if load_path and not adapter_only:
            self.notes.append(f"checkpoint.base_load_path is not loaded: {load_path} is a full checkpoint")
            log.info(self.notes[-1])
            return ""
        if adapter_only:
            saved = (read_manifest(locate(load_path).step_dir) or {}).get("base_fingerprint")
            now = fingerprint(base)
            if saved and now and saved != now:
                raise CheckpointError(message="base_load_path fingerprint does not match the adapter checkpoint.",
                                      path=base, hint="load the base the adapters were trained on (its files, "
                                      "sizes and modification times are fingerprinted)")
            if not (saved and now):
                log.warning("base fingerprint unknown: the base is not checked against the adapter checkpoint")
        return base

    def _load_base(self, model: Any, base: str) -> None:
        """The base weights into the model: no optimizer, no step, no data position."""
        from mftk.ckpt.resume import plan_resume
        from mftk.engine import builders
        from mftk.engine.restore import load_checkpoint

        plan = plan_resume(self.config, base, weights_only=True, params=builders.param_shapes(model),
                           world=self.layout.world, dp=self.layout.dp)
        load_checkpoint(plan, model, self.config, rank=self.rank)
        log.info("Loaded the frozen base weights from base_load_path %s (%s)", base, plan.kind)

    def _adapter_manifest(self, state: Any) -> dict | None:
        ck, lora = self.config.checkpoint, self.config.lora_config
        if not ck.save_trainable_only:
            return None
        from mftk.ckpt.lora import fingerprint, manifest
        from mftk.config.report import resolved

        fp = fingerprint(ck.base_load_path)
        if fp is None:
            log.warning("base_load_path %s cannot be fingerprinted; the adapter manifest records none",
                        ck.base_load_path)
        return manifest(ck.base_load_path, resolved(lora), global_step=state.global_step,
                        consumed_samples=state.consumed_samples, base_fingerprint=fp)

    def _check_save_path(self, plan: ResumePlan | None, new_run: bool) -> None:
        ck = self.config.checkpoint
        if not ck.enable_save:
            return
        from mftk.ckpt.guard import check_save_path

        for n in check_save_path(ck.save_path, resume_dir=plan.step_dir if plan else None, new_run=new_run,
                                 weights_only=plan is not None and plan.scenario == ResumeScenario.WEIGHTS_ONLY,
                                 total_steps=self.config.training.steps):
            log.warning(n)
            self.notes.append(n)
        source = _source_step(plan) if plan is not None and plan.scenario != ResumeScenario.WEIGHTS_ONLY else None
        if (source is not None and Path(plan.step_dir).parent.resolve() == Path(ck.save_path).resolve()
                and plan.start_step < source <= self.config.training.steps):
            name = Path(plan.step_dir).name
            self.notes.append(f"this run starts at step {plan.start_step}, below {name}, the checkpoint it resumes "
                              f"from; when it saves step {source} again, {name} is kept as {name}.resume-source "
                              "(never replaced)")
            log.warning(self.notes[-1])

    # ------------------------------------------------------------------------------- pieces
    def _distribute(self, model: Any) -> tuple[Any, Any]:
        t = time.perf_counter()
        model, dist = distribute(model, self.layout, self.config)
        self.phases.add("process groups", time.perf_counter() - t)
        return model, dist

    def _optimizer(self, model: Any, dist: Any, plan: ResumePlan | None, loaded: Any) -> Any:
        from mftk.engine import builders
        from mftk.engine.device_optim import chosen

        on_device = chosen(self.config, self.layout)
        optimizer = builders.build_optimizer(self.config, model, dist, on_device=on_device)
        if dist is not None:
            from mftk.engine.state import share_masters

            dist.bind(optimizer, list(model.trainable_params()))
            if not on_device:  # the device update writes the weights itself
                share_masters(list(model.trainable_params()), optimizer)  # weights = masters (several processes)
                _release_freed_memory()  # the weights share_masters replaced, freed on this (the build's) thread
        if loaded is not None and loaded.optimizer is not None:
            optimizer.load_state_dict(dist.cut(loaded.optimizer) if dist else loaded.optimizer, where=str(plan.step_dir))
        return optimizer

    def _trainer(self, model: Any, optimizer: Any, loader: Any, dist: Any, plan: ResumePlan | None, state: Any,
                 stop: Any) -> Any:
        from mftk.ckpt.checkpointer import Checkpointer
        from mftk.engine.monitor import build_monitors
        from mftk.engine.trainer import Trainer
        from mftk.logs.format import MetricsFileSink

        ck = self.config.checkpoint
        self.log_dir.mkdir(parents=True, exist_ok=True)
        metrics = MetricsFileSink(str(self.log_dir / "metrics.jsonl"))
        self.own_sinks.append(metrics)
        checkpointer = None
        if ck.enable_save:
            root = os.path.realpath(ck.save_path)
            here = plan is not None and plan.scenario != ResumeScenario.WEIGHTS_ONLY and \
                Path(plan.step_dir).parent == Path(root)
            on_disk = state.global_step if here else None
            checkpointer = Checkpointer(root=root, interval=ck.save_interleaved_steps, save_max=ck.save_max,
                                        prefix=ck.prefix, save_optim=not ck.no_save_optim, async_save=ck.async_save,
                                        comm=dist, start_step=state.global_step, last_saved_step=on_disk,
                                        adapter_manifest=self._adapter_manifest(state),
                                        source_step=_source_step(plan) if here else None)
            log.info("Checkpoints will be saved every %s starting from step %d, first save at step %d.",
                     every_steps(ck.save_interleaved_steps), state.global_step,
                     state.global_step + ck.save_interleaved_steps)
        monitor, monitor_sinks = build_monitors(self.loaded, rank=self.rank, world=self.layout.world, model=model)
        self.own_sinks.extend(monitor_sinks)  # closed at the end (stops the profiler, flushes TensorBoard)
        return Trainer.from_config(self.config, model=model, optimizer=optimizer, loader=loader, state=state,
                                   dist=dist, layout=self.layout, checkpointer=checkpointer,
                                   sinks=[metrics, *self.sinks, *monitor_sinks],
                                   monitor=monitor if monitor.enabled else None, stop=stop)


def _check_target_step(plan: ResumePlan, steps: int) -> None:
    """A resume whose ``training.steps`` (the absolute target) is below the step it starts from is refused:
    there is nothing to train, and the summary would read "trained steps 4..4 of 2"."""
    if plan.start_step <= steps:
        return
    from mftk.errors import ConfigError, Problem

    problem = Problem(path="training.steps", value=steps,
                      message=f"{steps} is below the step this resume starts from ({plan.start_step}, "
                              f"{plan.step_dir}): nothing to train",
                      hint=f"training.steps is the absolute target step: set it above {plan.start_step} "
                           f"(e.g. --set training.steps={plan.start_step + steps})")
    raise ConfigError(message=problem.render(), problems=[problem])
def _source_step(plan: ResumePlan) -> int | None:
    """The step of the ``iteration_*`` dir a run resumed from (None for any other dir): the one dir its saves
    must never replace (`Checkpointer.source_step`)."""
    from mftk.ckpt.layout import parse_iteration_dir_name

    return parse_iteration_dir_name(Path(plan.step_dir).name) if plan.kind == "mf" else None


def _lr_jump(plan: ResumePlan, config: Any) -> str | None:
    """A warning when the resumed run's LR schedule does not continue the saved run's (e.g. a larger
    training.steps with a decaying schedule), with the numbers; None for a weights-only start."""
    if plan.kind != "mf" or plan.scenario == ResumeScenario.WEIGHTS_ONLY:
        return None
    from mftk.ckpt.run_config import read_run_config
    from mftk.engine.schedule import lr_change_at_resume

    saved = read_run_config(plan.step_dir) or {}
    section, steps = saved.get("lr_scheduler"), (saved.get("training") or {}).get("steps")
    if not isinstance(section, dict) or not isinstance(steps, int):
        return None
    return lr_change_at_resume(section, steps, plan.saved_step, config.lr_scheduler, config.training.steps,
                               plan.start_step)


def _saved_architecture(plan: ResumePlan, current: Any) -> tuple[Any, list[str]]:
    """The ``model:`` section a checkpoint was saved with (typed) and the keys where it differs from ``current``."""
    if plan.kind != "mf":
        return None, []
    from mftk.ckpt.run_config import saved_model_section
    from mftk.config.load import build_model_section
    from mftk.config.report import resolved

    section, _ = saved_model_section(plan.step_dir, plan.saved_world)
    if section is None:
        return None, []
    saved, problems = build_model_section(dict(section))
    if saved is None or any(p.severity == "error" for p in problems):
        return None, []
    a, b = resolved(current), resolved(saved)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return saved, [f"model.{k}: YAML {a.get(k)!r}, checkpoint {b.get(k)!r}" for k in keys]


def distribute(model: Any, layout: Any, config: Any) -> tuple[Any, Any]:
    """Process groups, the model parallelized for this rank (`parallel.parallelize`), and its `DistContext`."""
    from mftk.engine.distributed import make_context
    from mftk.engine.parallel.groups import create_groups
    from mftk.engine.parallel.parallelize import ParallelDims, parallelize

    from mftk.config.runnable import ulysses_degree

    p = config.parallelism
    ulysses = ulysses_degree(p.context_parallel_method, layout.cp, p.ulysses_degree_in_cp)
    groups = create_groups(layout, ulysses=ulysses)
    chunks = None
    if layout.pp > 1:
        from mftk.engine.parallel.pipeline_model import stage_chunks_of

        chunks = stage_chunks_of(config)
    from mftk.engine.recompute import apply_exclusions, replayed_layers

    replay = replayed_layers(model, config.recompute, config.recompute_comm)
    par = parallelize(model, ParallelDims(layout=layout, groups=groups, ulysses=ulysses, stage_chunks=chunks,
                                          fsdp_replay=replay, before_fsdp=lambda m: apply_exclusions(
                                              m, config.recompute, config.recompute_comm)))
    _log_parallel(par, layout, groups, p)
    _recompute(model, config)
    _release_freed_memory()
    dist = make_context(groups, par.table, list(model.trainable_params()), stage=par.stage, grad_sink=par.grad_sink)
    return model, dist


def _log_parallel(par: Any, layout: Any, groups: Any, p: Any) -> None:
    """One start-up line per parallel dimension that is on: what this rank holds."""
    table = par.table
    if layout.tp > 1 or layout.ep > 1:
        split = sum(1 for t in table if t.split_over("tp") or t.expert)
        log.info("Model parallel: tensor_parallel=%d (sequence parallel), expert_parallel=%d; %d parameters split "
                 "(column/vocab on dim 0, row on dim 1, experts on dim 0)", layout.tp, layout.ep, split)
    if layout.cp > 1:
        method = p.context_parallel_method.lower()
        if method == "ulysses":
            held = f"positions {groups.cp.rank} of {layout.cp} contiguous parts; heads all-to-all"
        else:
            held = (f"sequence chunks {groups.cp.rank} and {2 * layout.cp - 1 - groups.cp.rank} of {2 * layout.cp}; "
                    + ("KV all-gathered" if method == "colossal" else
                       f"heads all-to-all over {groups.cp_ulysses.size}, KV all-gathered over {groups.cp_ring.size}"))
        log.info("Context parallel: context_parallel=%d (%s: rank %d holds %s)", layout.cp, method, groups.cp.rank,
                 held)
    stage = par.stage
    if stage is not None:
        chunks = f" in {len(stage.chunks)} chunks {stage.chunks}" if len(stage.chunks) > 1 else ""
        log.info("Pipeline parallel: stage %d of %d holds decoder layers %s%s%s%s (schedule %s)", stage.stage,
                 layout.pp, stage.my_layers, chunks, ", the embedding" if stage.is_first else "",
                 ", the final norm and output layer" if stage.is_last else "",
                 "interleaved_1f1b" if len(stage.chunks) > 1 else (p.pipeline_parallel_schedule or "1f1b"))
    fsdp = sum(1 for t in table if t.split_over("fsdp"))
    if fsdp:
        log.info("FSDP: %s along dim 0 over %d ranks, with their gradients and optimizer states; each unit (layer, "
                 "embedding, output layer) gathers them for its forward and again for its backward",
                 sharded_phrase(fsdp, sum(1 for t in table if t.trainable)), groups.fsdp.size)


def sharded_phrase(sharded: int, total: int) -> str:
    """'all 19 parameters sharded' or '17 of 19 parameters sharded (the other 2 replicated: dim 0 does not
    divide evenly)'."""
    if sharded == total:
        return f"all {plural(total, 'parameter')} sharded"
    rest = total - sharded
    return (f"{sharded} of {plural(total, 'parameter')} sharded (the other {rest} replicated: outside every unit, "
            "or dim 0 does not divide evenly)")


def _release_freed_memory() -> None:
    """Give the heap the full build left behind (the blocks TP/EP/FSDP cut away) back to the system. The replaced
    Parameters sit in reference cycles (cells ↔ parameters), so a full garbage collection frees them first —
    the interpreter's own generational collection may not run before the first step, and did not on
    bench/memory.py's 220M fsdp2 run (838 MiB of build weights alive through training); then glibc keeps freed
    small blocks in its arenas, and they would count in every rank's RSS. Best effort: the trim is a no-op where
    ``malloc_trim`` does not exist."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _recompute(model: Any, config: Any) -> None:
    """The ``recompute`` / ``recompute_comm`` sections on the parallelized model (several processes, as the
    reference applies them; `engine.recompute`)."""
    from mftk.engine.recompute import apply_recompute, excluded_cells

    replayed = apply_recompute(model, config.recompute, config.recompute_comm)
    if replayed:
        log.info("Recompute (%s): %s replayed in the backward: %s", config.recompute.mode,
                 plural(len(replayed), "cell"), ", ".join(replayed[:8]) + (" ..." if len(replayed) > 8 else ""))
    excluded = excluded_cells(model)
    if excluded:
        log.info("Recompute exclude_op: %s not replayed (outputs kept): %s", plural(len(excluded), "cell"),
                 ", ".join(excluded[:8]) + (" ..." if len(excluded) > 8 else ""))


def _distributed() -> bool:
    from mindspore.communication.management import GlobalComm

    return bool(GlobalComm.INITED)


def _rank() -> int:
    from mindspore import communication

    return communication.get_rank()


def _setup_process(config: Any) -> Any:
    import mindspore as ms

    from mftk.engine import device

    chosen = device.select(config.context.device_target)
    if ms.get_context("device_target") != chosen or not _distributed():  # a worker's was set before init()
        device.apply(chosen)
    log.info("Device: %s (collective backend %s)", chosen, device.BACKENDS[chosen])
    seed = config.training.seed
    ms.set_seed(seed)
    ms.manual_seed(seed)
    np.random.seed(seed)
    if config.training.deterministic:
        ms.set_deterministic(True)
    return ms


def _check_writable(save_path: str) -> None:
    """Fail before training, not at the first save, when checkpoints cannot be written."""
    root = Path(save_path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".mftk-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(message=f"cannot write checkpoints to {root}: {exc.strerror or exc}", path=str(root),
                              hint="set checkpoint.save_path to a writable directory, or enable_save: false") from None


class _signals:
    """SIGTERM/SIGINT set the stop flag (the loop saves after the current step, then exit 75); a second
    SIGINT interrupts at once. Installed for the whole run, so a signal during start-up stops the run
    after its first step; in an msrun worker, one that came before (`launch.take_pending_signal`) counts."""

    def __init__(self, stop: Any, enabled: bool) -> None:
        self.stop, self.enabled, self.old = stop, enabled and threading.current_thread() is threading.main_thread(), {}

    def __enter__(self) -> None:
        if not self.enabled:
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.old[sig] = signal.signal(sig, self._handle)
        from mftk.engine.launch import take_pending_signal

        early = take_pending_signal()
        if early is not None and not self.stop.requested:
            log.warning("%s received during start-up: the run stops after its first step, saving it", early)
            self.stop.request(early)

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stop.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.warning("%s received: saving a checkpoint after the current step, then stopping", name)
        self.stop.request(name)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

