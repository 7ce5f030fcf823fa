"""``train(loaded_config, ...)``: the one library entry point behind `mftk train` and `mftk resume`.

Start-up, each phase timed and logged: process setup (seed, determinism) → model build → resume plan
and checkpoint load → data index build → optimizer → first step. Then the loop (`trainer.py`).
Outputs under ``output_dir``: ``log/rank_0/info.log`` (the reference's file format) and
``log/rank_0/metrics.jsonl`` (mftk's full-precision JSON lines). Console output is the caller's:
attach a handler to the ``mftk.train`` logger (see :func:`mf_console_handler`) and/or pass sinks.

Resume (reference §4, strict): scenario 1 (weights + optimizer + step + data position; bit-exact
with mftk's extra state), 2 (weights only: step 0, fresh optimizer, masters from the loaded
weights; also from a Hugging Face dir), 3 (changed global batch size: step rescaled
``int(step·old/new)``, ``consumed_samples`` kept). Everything the reference only warns about is
an error here.
"""
from __future__ import annotations

import importlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import attrs
import numpy as np

from mftk.errors import CheckpointError, ConfigError, InputError, Problem
from mftk.logs.format import LOSS_CALLBACK_FILEPATH, LOSS_CALLBACK_LINENO, MetricsFileSink, format_step_line, mf_formatter
from mftk.progress import BaseSink, FanOut, StepSink

log = logging.getLogger("mftk.train")
log.setLevel(logging.INFO)


# --------------------------------------------------------------------------------------- results
@attrs.frozen
class ResumePlan:
    """What a resume will do, decided from ``common.json`` and file headers only (no tensor data)."""

    source: str
    kind: str  # "mf" or "hf"
    step_dir: str
    scenario: int  # 1 standard, 2 weights only, 3 changed global batch size
    saved_step: int
    saved_global_batch_size: int | None
    global_batch_size: int
    saved_world: int
    world: int
    start_step: int
    consumed_samples: int
    skip_micro_batches: int
    loads: tuple[str, ...]
    notes: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()


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


# --------------------------------------------------------------------------------------- logging
class _PathFilter(logging.Filter):
    """Give records the reference's ``filepath`` field: the path from the package dir on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "filepath"):
            path = record.pathname.replace(os.sep, "/")
            i = path.rfind("/mftk/")
            record.filepath = path[i + 1:] if i >= 0 else os.path.basename(path)
        return True


if not any(isinstance(f, _PathFilter) for f in log.filters):
    log.addFilter(_PathFilter())


def mf_console_handler(stream: Any) -> logging.Handler:
    """A handler printing ``mftk.train`` records with the reference's stdout prefix."""
    h = logging.StreamHandler(stream)
    h.setFormatter(mf_formatter("stdout"))
    return h


def emit_step_line(line: str) -> None:
    """Log the step line as if from the reference's LossCallback (its file path and line number)."""
    record = log.makeRecord(log.name, logging.INFO, LOSS_CALLBACK_FILEPATH, LOSS_CALLBACK_LINENO, line, (), None,
                            func="on_step_end", extra={"filepath": LOSS_CALLBACK_FILEPATH})
    log.handle(record)


class _StepLogSink(BaseSink):
    def __init__(self, total_steps: int) -> None:
        self.total = total_steps
        self.losses: list[float] = []
        self.norms: list[float | None] = []

    def on_step(self, metrics: dict[str, Any]) -> None:
        loss = metrics["loss"]  # None on a non-last pipeline stage, whose line says N/A
        self.losses.append(metrics.get("pipeline_loss") if loss is None else loss)
        self.norms.append(metrics["grad_norm"])
        emit_step_line(format_step_line(metrics, total_steps=self.total))


# --------------------------------------------------------------------------------------- entry point
def train(loaded: Any, *, output_dir: str | os.PathLike = "output", sinks: Iterable[StepSink] = (),
          resume_from: str | os.PathLike | None = None, weights_only: bool = False, dry_run: bool = False,
          world_size: int = 1, install_signals: bool = True, stop: Any = None, new_run: bool = False) -> TrainResult:
    """Train (or resume) on one process as the config says; returns what happened.

    ``resume_from`` overrides ``checkpoint.load_path``; ``weights_only`` is ``no_load_optim``; ``new_run``
    allows a run that starts at step 0 in a ``save_path`` holding checkpoints (`mftk.ckpt.guard`).
    ``dry_run`` decides the resume plan (or checks the start) and returns without training.
    """
    config = loaded.config
    layout = check_supported_layout(loaded, world_size)
    rank = 0
    if world_size > 1 and not dry_run:
        from mindspore import communication

        rank = communication.get_rank()
    phases: list[tuple[str, float]] = []
    out_dir = Path(output_dir)
    log_dir = out_dir / "log" / f"rank_{rank}"
    handlers = [] if dry_run else _attach_file_log(log_dir)
    own_sinks: list[Any] = []
    try:
        t = time.perf_counter()
        ms = _setup_process(config)
        phases.append(("process setup", time.perf_counter() - t))
        return _run(loaded, ms, out_dir=out_dir, log_dir=log_dir, sinks=list(sinks), own_sinks=own_sinks,
                    phases=phases, resume_from=resume_from, weights_only=weights_only, dry_run=dry_run,
                    install_signals=install_signals, stop=stop, layout=layout, new_run=new_run)
    finally:
        for s in own_sinks:
            s.close()
        for h in handlers:
            log.removeHandler(h)
            h.close()


_UNSUPPORTED_DEGREES: tuple[tuple[str, str], ...] = ()


def check_supported_layout(loaded: Any, world_size: int) -> Any:
    """The layout of ``world_size`` ranks: DP, FSDP, HSDP, TP with sequence parallel (Qwen3-style GQA +
    dense MLP models), EP (MoE models, without TP) and PP alone (dense models, 1F1B/GPipe, no
    interleave). CP, and PP combined with other dimensions, are refused: the trainer does not drive
    them yet, so such a run would silently train something else than asked.
    """
    from mftk.plan.layout import Layout, layout_from_config

    p = loaded.config.parallelism
    problems = [Problem(path=f"parallelism.{field}", value=getattr(p, field),
                        message=f"{field}={getattr(p, field)} is not supported yet by mftk train (supported: data "
                                "parallel (DP, FSDP via data_parallel_shard, HSDP), tensor_parallel, expert_parallel, "
                                "pipeline_parallel alone)",
                        hint=f"set parallelism.{field}: 1", line=_line(loaded, f"parallelism.{field}"))
                for field, _ in _UNSUPPORTED_DEGREES if int(getattr(p, field) or 1) > 1]
    problems += _model_parallel_problems(loaded)
    problems += _muon_layout_problems(loaded, world_size)
    problems += _callback_problems(loaded)
    problems += _pipeline_problems(loaded, world_size)
    problems += _context_parallel_problems(loaded, world_size)
    if problems:
        raise ConfigError(message=f"{loaded.source}: " + "; ".join(pr.message.split(" (")[0] for pr in problems),
                          problems=problems, source=loaded.source)
    if world_size <= 1:
        return Layout(world=1)
    return layout_from_config(p, world_size)


def _context_parallel_problems(loaded: Any, world_size: int) -> list[Problem]:
    """What context_parallel > 1 does not support yet: other parallel dimensions, non-GQA/MoE models."""
    from mftk.engine.parallel.context_parallel import context_parallel_problems
    from mftk.engine.spec import build_spec

    p, cfg = loaded.config.parallelism, loaded.config.model
    cp = int(p.context_parallel or 1)
    if cp <= 1:
        return []
    found = []
    if int(p.tensor_parallel or 1) > 1 or int(p.pipeline_parallel or 1) > 1 or int(p.expert_parallel or 1) > 1:
        found.append("context parallel together with tensor/pipeline/expert parallel is not supported yet")
    elif world_size > 1 and world_size != cp:
        found.append(f"context_parallel={cp} with {world_size} workers: CP combined with data parallel is not "
                     "supported yet (use as many workers as CP ranks)")
    if (p.context_parallel_method or "colossal").lower() != "colossal":
        found.append(f"context_parallel_method {p.context_parallel_method!r} is not supported yet (colossal only)")
    found += context_parallel_problems(build_spec(cfg), cp, int(cfg.seq_length or 0))
    return [Problem(path="parallelism.context_parallel", value=cp, message=f"context_parallel={cp}: {m}",
                    hint="set parallelism.context_parallel: 1", line=_line(loaded, "parallelism.context_parallel"))
            for m in found]


def _pipeline_problems(loaded: Any, world_size: int) -> list[Problem]:
    """What pipeline_parallel > 1 does not support yet: other dimensions beside it, VPP, tied/MTP/MoE models."""
    from mftk.engine.parallel.pipeline_model import pipeline_problems
    from mftk.engine.spec import build_spec

    p = loaded.config.parallelism
    pp = int(p.pipeline_parallel or 1)
    if pp <= 1:
        return []
    found = []
    if world_size > 1 and world_size != pp:
        found.append(f"pipeline_parallel={pp} with {world_size} workers: PP combined with data/tensor/context "
                     "parallel is not supported yet (use as many workers as stages)")
    if int(p.pipeline_parallel_interleave_num or 1) > 1:
        found.append("pipeline_parallel_interleave_num > 1 (interleaved 1F1B) is not supported yet")
    found += pipeline_problems(build_spec(loaded.config.model), pp)
    return [Problem(path="parallelism.pipeline_parallel", value=pp, message=f"pipeline_parallel={pp}: {m}",
                    hint="set parallelism.pipeline_parallel: 1", line=_line(loaded, "parallelism.pipeline_parallel"))
            for m in found]


def _model_parallel_problems(loaded: Any) -> list[Problem]:
    """What the model does not allow of tensor_parallel / expert_parallel (each at its YAML line)."""
    from mftk.engine.parallel.model_parallel import expert_parallel_problems, tensor_parallel_problems
    from mftk.engine.spec import build_spec

    p, cfg = loaded.config.parallelism, loaded.config.model
    tp, ep = int(p.tensor_parallel or 1), int(p.expert_parallel or 1)
    if tp <= 1 and ep <= 1:
        return []
    spec = build_spec(cfg)
    found = []
    if tp > 1:
        found += [("tensor_parallel", tp, m) for m in tensor_parallel_problems(spec, tp, int(cfg.seq_length or 0))]
    if ep > 1:
        found += [("expert_parallel", ep, m) for m in expert_parallel_problems(spec, ep, tp)]
    return [Problem(path=f"parallelism.{field}", value=v, message=f"{field}={v}: {m}", hint=f"set parallelism.{field}: 1",
                    line=_line(loaded, f"parallelism.{field}")) for field, v, m in found]


def _muon_layout_problems(loaded: Any, world_size: int) -> list[Problem]:
    """Muon needs each weight's full matrix: tensor parallel (split matrices) is not supported yet, and
    QK-clip (head rows of the masters) not together with FSDP row shards."""
    from mftk.config.optimizer_muon import qk_clip_active

    config = loaded.config
    if config.optimizer.type != "Muon" or world_size <= 1:
        return []
    from mftk.plan.layout import layout_from_config

    p, found = config.parallelism, []
    if int(p.tensor_parallel or 1) > 1:
        found.append(("parallelism.tensor_parallel", p.tensor_parallel, "Muon with tensor_parallel > 1 is not "
                      "supported yet (the orthogonalisation needs each weight's full matrix)",
                      "set parallelism.tensor_parallel: 1, or optimizer.type: AdamW"))
    elif qk_clip_active(config) and layout_from_config(p, world_size).dp_shard > 1:
        found.append(("optimizer.qk_clip_enabled", True, "Muon's QK-clip with FSDP (data_parallel_shard > 1) is not "
                      "supported yet (it rescales head rows of the fp32 masters, which FSDP splits)",
                      "set parallelism.data_parallel_shard: 1 (plain data parallel), or qk_clip_enabled: false"))
    return [Problem(path=path, value=v, message=m, hint=h, line=_line(loaded, path)) for path, v, m, h in found]


def _line(loaded: Any, path: str) -> int | None:
    lines = getattr(loaded, "lines", None)
    try:
        return lines.line(path) if lines is not None else None
    except Exception:  # noqa: BLE001 - a line number is a courtesy
        return None


def train_worker(config: str, overrides: list[str], output_dir: str, resume_from: str | None = None,
                 weights_only: bool = False, new_run: bool = False) -> dict[str, Any]:
    """The msrun worker body (`launch.worker_main` calls it after ``communication.init()``).

    Loads the config for this job's world size, logs to stdout (msrun's ``worker_<rank>.log``; the
    parent follows rank 0's) and returns the `TrainResult` as JSON-able data.
    """
    import sys

    from mindspore import communication

    from mftk.config.load import load_config

    world = communication.get_group_size()
    loaded = load_config(config, overrides=overrides, world_size=world)
    handler = mf_console_handler(sys.stdout)
    log.addHandler(handler)
    try:
        result = train(loaded, output_dir=output_dir, resume_from=resume_from, weights_only=weights_only,
                       world_size=world, new_run=new_run)
    finally:
        log.removeHandler(handler)
    return attrs.asdict(result)


def result_from_json(data: dict[str, Any]) -> TrainResult:
    """The `TrainResult` a worker returned (lists back to tuples)."""
    d = dict(data)
    plan = d.pop("resume", None)
    for key in ("losses", "grad_norms", "notes"):
        d[key] = tuple(d.get(key) or ())
    d["phases"] = tuple(tuple(p) for p in d.get("phases") or ())
    if plan is not None:
        plan = {k: tuple(v) if isinstance(v, list) else v for k, v in plan.items()}
        plan = ResumePlan(**plan)
    return TrainResult(**d, resume=plan)


def train_distributed(config: str | os.PathLike, *, overrides: Iterable[str] = (),
                      output_dir: str | os.PathLike = "output", spec: Any, resume_from: Any = None,
                      weights_only: bool = False, on_log_line: Any = None, sinks: Iterable[StepSink] = (),
                      timeout_s: float | None = None, new_run: bool = False) -> TrainResult:
    """Run `train_worker` on every rank through msrun (`engine.launch`); rank 0's log lines go to
    ``on_log_line`` and its step lines (parsed) to ``sinks``. A failing worker raises TrainingError."""
    from mftk.engine.launch import launch
    from mftk.logs.format import parse_step_line

    out = Path(output_dir).resolve()
    payload = {"config": str(Path(config).resolve()), "overrides": list(overrides), "output_dir": str(out),
               "resume_from": str(Path(resume_from).resolve()) if resume_from else None, "weights_only": weights_only,
               "new_run": new_run}
    sinks = list(sinks)

    def on_line(line: str) -> None:
        if " - mindformers[" not in line:
            return  # MindSpore's own log lines and the launcher's markers stay in the worker logs
        if on_log_line is not None:
            on_log_line(line)
        try:
            record = parse_step_line(line)
        except ValueError:
            record = None
        if record is not None:
            for s in sinks:
                s.on_step(record)

    if spec.log_dir is None:
        spec = attrs.evolve(spec, log_dir=out / "msrun_log")
    result = launch("mftk.engine.run:train_worker", payload, spec=spec, on_line=on_line, timeout_s=timeout_s)
    if not result.results:
        return TrainResult(start_step=0, final_step=0, total_steps=0, consumed_samples=0, losses=(), grad_norms=(),
                           skipped_steps=0, checkpoint="", output_dir=str(out), log_file="", metrics_file="",
                           phases=(), notes=(f"job detached; worker logs in {result.log_dir}",))
    return result_from_json(result.results[min(result.results)])


def _run(loaded: Any, ms: Any, *, out_dir: Path, log_dir: Path, sinks: list, own_sinks: list, phases: list,
         resume_from: Any, weights_only: bool, dry_run: bool, install_signals: bool,
         stop: Any, layout: Any, new_run: bool = False) -> TrainResult:
    from mftk.engine import trainer as T
    from mftk.engine.state import TrainState, extra_state, restore_rng

    config = loaded.config
    tr, ck = config.training, config.checkpoint
    lbs, gbs, dp = tr.local_batch_size, tr.global_batch_size, layout.dp
    _phase_log(phases[-1])
    log.info("Got parallelism settings: data_parallel=%d(dp_shard[%d] * dp_replicate[%d]), tensor_parallel=%d, "
             "pipeline_parallel=%d, context_parallel=%d", layout.dp, layout.dp_shard, layout.dp_replicate, layout.tp,
             layout.pp, layout.cp)
    log.info("Calculate global_batch_size=%d, num_accumulation_steps=%d.", gbs, max(1, gbs // (dp * lbs)))

    weights_only = weights_only or ck.no_load_optim
    load_path = str(resume_from) if resume_from else ck.load_path
    plan = None
    notes: list[str] = [p.render() for p in loaded.notes if p.severity == "warning"]

    t = time.perf_counter()
    model = _build_model(config, lazy=dry_run)
    phases.append(("model build", time.perf_counter() - t))
    _phase_log(phases[-1])
    if load_path:
        plan = plan_resume(config, load_path, weights_only=weights_only, model=model, world=layout.world)
        for n in plan.notes:
            log.info(n)
    if ck.enable_save:
        from mftk.ckpt.guard import check_save_path

        for n in check_save_path(ck.save_path, resume_dir=plan.step_dir if plan else None,
                                 weights_only=plan is not None and plan.scenario == 2, new_run=new_run,
                                 total_steps=tr.steps):
            log.warning(n)
            notes.append(n)
    if dry_run:
        return TrainResult(start_step=plan.start_step if plan else 0, final_step=plan.start_step if plan else 0,
                           total_steps=tr.steps, consumed_samples=plan.consumed_samples if plan else 0, losses=(),
                           grad_norms=(), skipped_steps=0, checkpoint="", output_dir=str(out_dir), log_file="",
                           metrics_file="", phases=tuple(phases), resume=plan, dry_run=True, notes=tuple(notes))
    if ck.enable_save:
        _check_writable(ck.save_path)
    state = TrainState()
    loaded_ckpt = None
    if plan is not None:  # into the full model: checkpoints hold global tensors, cut below for TP/EP
        t = time.perf_counter()
        loaded_ckpt = load_checkpoint(plan, model, config, rank=_rank() if layout.world > 1 else 0)
        state = TrainState(global_step=plan.start_step, consumed_samples=plan.consumed_samples)
        phases.append(("checkpoint load", time.perf_counter() - t))
        _phase_log(phases[-1])
    dist = None
    if layout.world > 1:
        model, dist = _distribute(model, layout, phases, config)

    t = time.perf_counter()
    data = _build_data(config, dp=dp, dp_rank=dist.groups.dp_rank if dist else 0)
    phases.append(("data index build", time.perf_counter() - t))
    _phase_log(phases[-1])
    loader = data.loader
    start_batch = loader.start_batch(state.consumed_samples)
    if state.consumed_samples:
        log.info("Resume dataset (static batch): skip %d micro-batches (consumed_samples=%d, global_step=%d).",
                 start_batch, state.consumed_samples, state.global_step)

    t = time.perf_counter()
    optimizer = _build_optimizer(config, model, dist.sharding if dist else None, dist)
    if dist is not None:
        dist.bind(optimizer)
    if loaded_ckpt is not None and loaded_ckpt.optimizer is not None:
        opt_state = dist.cut(loaded_ckpt.optimizer) if dist else loaded_ckpt.optimizer
        optimizer.load_state_dict(opt_state, where=str(plan.step_dir))
        optimizer.global_step = state.global_step if plan.scenario == 3 else optimizer.global_step
        if plan.scenario == 3:
            log.info("LR position: optimizer step set to the rescaled step %d", state.global_step)
    if loaded_ckpt is not None and loaded_ckpt.extra:
        x = loaded_ckpt.extra
        state.epoch = int(x.get("epoch", 0))
        state.consecutive_skipped = int(x.get("consecutive_skipped", 0))
        state.skipped_steps = int(x.get("skipped_steps", 0))
        if plan.scenario == 1:
            restore_rng(x)
    elif plan is not None and plan.scenario == 1:
        log.info("no mftk extra state in %s (a reference checkpoint?): RNG re-seeded from training.seed", plan.step_dir)
    phases.append(("optimizer", time.perf_counter() - t))
    _phase_log(phases[-1])

    from mftk.engine.monitor import build_monitors
    from mftk.plan.flops import flops_per_step

    log_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = log_dir / "metrics.jsonl"
    step_log = _StepLogSink(tr.steps)
    metrics_sink = MetricsFileSink(str(metrics_file))
    own_sinks.append(metrics_sink)
    sink = FanOut(step_log, metrics_sink, *sinks)
    checkpointer = None
    if ck.enable_save:
        checkpointer = T.Checkpointer(root=os.path.realpath(ck.save_path), interval=ck.save_interleaved_steps,
                                      save_max=ck.save_max, prefix=ck.prefix, save_optim=not ck.no_save_optim,
                                      async_save=ck.async_save, dist=dist, start_step=state.global_step)
        log.info("Checkpoints will be saved every %d steps starting from step %d, first save at step %d.",
                 ck.save_interleaved_steps, state.global_step, state.global_step + ck.save_interleaved_steps)
        if plan is not None and plan.scenario != 2 and Path(plan.step_dir).parent == Path(checkpointer.root):
            checkpointer.last_saved_step = state.global_step  # that step is already on disk
    monitor, monitor_sinks = build_monitors(loaded, rank=_rank() if layout.world > 1 else 0, world=layout.world,
                                            model=model)
    own_sinks.extend(monitor_sinks)  # closed at the end (stops the profiler, flushes TensorBoard)
    sink.sinks.extend(monitor_sinks)
    rampup = tuple(tr.rampup_batch_size) if tr.rampup_batch_size else None
    model_section = _model_section(loaded)
    cfg_model = config.model
    trainer_cls, pipe_kw = T.Trainer, {}
    if dist is not None and dist.pipeline is not None:
        from mftk.engine.pipeline_trainer import PipelineTrainer

        trainer_cls = PipelineTrainer
        pipe_kw = {"stage": dist.stage, "schedule_name": config.parallelism.pipeline_parallel_schedule,
                   "local_batch_size": lbs}
    trainer = trainer_cls(
        **pipe_kw, model=model, optimizer=optimizer, schedule=_schedule(config), batches=loader.iter_batches(start_batch),
        batch_schedule=T.BatchSchedule(gbs, lbs, dp, rampup), total_steps=tr.steps, max_norm=tr.max_norm,
        sinks=sink, checkpointer=checkpointer,
        extra_state=lambda s, g: extra_state(s, global_batch_size=g, dp=dp, local_batch_size=lbs,
                                             model_section=model_section),
        flops_per_sample=flops_per_step(cfg_model, global_batch_size=1) / layout.world, columns=_columns(config),
        nan_policy=nan_policy_from(config), monitor=monitor if monitor.enabled else None,
        stop=stop, epoch_micro_batches=len(loader), show_mtp=bool(getattr(model.spec, "mtp_loss_scaling_factor", 0)),
        seq_length=int(getattr(cfg_model, "seq_length", 0) or 0), dist=dist,
        low_priority_dispatch=tr.low_priority_dispatch)
    trainer.micro_batches_read = start_batch + (state.epoch * len(loader) if len(loader) else 0)
    start_step = state.global_step
    if start_step >= tr.steps:
        notes.append(f"nothing to do: the checkpoint is at step {start_step} and training.steps is {tr.steps}")
        log.info(notes[-1])
    log.info("Start training loop...")
    with _signals(trainer.stop, install_signals):
        trainer.fit(state)
    if trainer.first_step_seconds is not None:
        phases.append(("first step", trainer.first_step_seconds))
    log.info("Training completed at step %d.%s", state.global_step,
             f" Final checkpoint: {checkpointer.last_path}" if checkpointer and checkpointer.last_path else "")
    return TrainResult(start_step=start_step, final_step=state.global_step, total_steps=tr.steps,
                       consumed_samples=state.consumed_samples, losses=tuple(step_log.losses),
                       grad_norms=tuple(step_log.norms), skipped_steps=state.skipped_steps,
                       checkpoint=checkpointer.last_path if checkpointer else "", output_dir=str(out_dir),
                       log_file=str(log_dir / "info.log"), metrics_file=str(metrics_file), phases=tuple(phases),
                       resume=plan, notes=tuple(notes))


# --------------------------------------------------------------------------------------- pieces
def _rank() -> int:
    from mindspore import communication

    return communication.get_rank()


def _distribute(model: Any, layout: Any, phases: list, config: Any = None) -> tuple[Any, Any]:
    """Process groups, this rank's TP/EP model (cut from the full one) or PP stage, and the DP/FSDP plan."""
    from mftk.engine.distributed import make_context
    from mftk.engine.parallel.groups import create_groups
    from mftk.engine.parallel.model_parallel import param_splits, to_parallel

    t = time.perf_counter()
    groups = create_groups(layout)
    splits = {}
    if layout.tp > 1 or layout.ep > 1:
        model = to_parallel(model, groups)
        splits = param_splits(model)
        log.info("Model parallel: tensor_parallel=%d (sequence parallel), expert_parallel=%d; %d parameters split "
                 "(column/vocab on dim 0, row on dim 1, experts on dim 0)", layout.tp, layout.ep, len(splits))
    if layout.cp > 1:
        from mftk.engine.parallel.context_parallel import ContextParallelModel

        model = ContextParallelModel(model, groups.cp)
        log.info("Context parallel: context_parallel=%d (colossal: rank %d holds sequence chunks %d and %d of %d; "
                 "KV all-gathered)", layout.cp, groups.cp.rank, groups.cp.rank, 2 * layout.cp - 1 - groups.cp.rank,
                 2 * layout.cp)
    stage = None
    if layout.pp > 1:
        from mftk.engine.parallel.pipeline_model import StageModel, stage_layers_of

        layers = stage_layers_of(config)
        stage = StageModel(model, layers, groups.pp.rank)
        log.info("Pipeline parallel: stage %d of %d holds decoder layers %s%s%s (schedule %s)", stage.stage, layout.pp,
                 stage.my_layers, ", the embedding" if stage.is_first else "",
                 ", the final norm and output layer" if stage.is_last else "",
                 config.parallelism.pipeline_parallel_schedule or "1f1b")
    params = list(model.trainable_params())
    dist = make_context(layout, [p.name for p in params], [tuple(p.shape) for p in params], groups=groups,
                        splits=splits)
    if stage is not None:
        dist.pipeline, dist.stage = stage.table, stage
    phases.append(("process groups", time.perf_counter() - t))
    _phase_log(phases[-1])
    if dist.sharding.enabled:
        n = sum(1 for r in dist.sharding.rows if r is not None)
        log.info("FSDP: %d of %d parameters sharded along dim 0 over %d ranks (the rest replicated: dim 0 "
                 "does not divide evenly); optimizer states sharded the same way", n, len(params),
                 dist.sharding.size)
    return model, dist


def _phase_log(phase: tuple[str, float]) -> None:
    log.info("start-up phase %-18s %.2fs", phase[0] + ":", phase[1])


def _attach_file_log(log_dir: Path) -> list[logging.Handler]:
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        h = logging.FileHandler(log_dir / "info.log", encoding="utf-8")
    except OSError as exc:
        raise InputError(message=f"cannot write logs to {log_dir}: {exc.strerror or exc}", path=str(log_dir),
                         hint="choose a writable --output-dir") from None
    h.setLevel(logging.INFO)
    h.setFormatter(mf_formatter("file"))
    log.addHandler(h)
    return [h]


def _setup_process(config: Any) -> Any:
    import mindspore as ms

    ms.runtime.launch_blocking()  # synchronous errors, and faster on CPU (mindspore-cpu.md §10)
    seed = config.training.seed
    ms.set_seed(seed)
    ms.manual_seed(seed)
    np.random.seed(seed)
    if config.training.deterministic:
        ms.set_deterministic(True)
    return ms


def _build_model(config: Any, *, lazy: bool = False) -> Any:
    from mftk.engine.models.build import build_model
    from mftk.engine.models.gpt import GPTModel
    from mftk.engine.spec import build_spec

    model_cfg = _model_config(config)
    if lazy:  # names and shapes only: no random init for a dry run
        return GPTModel(build_spec(model_cfg))
    model = build_model(model_cfg, seed=config.training.seed)
    total = sum(int(np.prod(p.shape)) for p in model.get_parameters())
    train = sum(int(np.prod(p.shape)) for p in model.trainable_params())
    log.info("Got total parameters: %sM, trainable parameters: %sM", total // 1e6, train // 1e6)
    return model


def _model_config(config: Any) -> Any:
    """``model:`` with ``track_max_attention_logit`` switched on when a ``MaxLogitsMonitor`` callback asks
    for tracking (the reference's trainer sets it on the model config the same way)."""
    from mftk.engine.monitor import tracking_requested

    cfg = config.model
    if tracking_requested(config) and not getattr(cfg, "track_max_attention_logit", False):
        cfg = attrs.evolve(cfg, track_max_attention_logit=True)
    return cfg


def _callback_problems(loaded: Any) -> list[Problem]:
    """``callbacks:`` entries mftk cannot run (the reference builds them from its registry), and layouts
    where the tracked max logits would be split over ranks (tensor parallel shards the heads)."""
    from mftk.engine.monitor import KNOWN_CALLBACKS, MAX_LOGITS_MONITOR, tracking_requested

    config, found = loaded.config, []
    for i, cb in enumerate(config.callbacks or ()):
        path = f"callbacks[{i}]"
        if cb.type not in KNOWN_CALLBACKS:
            found.append(Problem(path=f"{path}.type", value=cb.type, line=_line(loaded, f"{path}.type"),
                                 message=f"unknown callback {cb.type!r}", hint=f"use one of: {', '.join(KNOWN_CALLBACKS)}"))
        elif cb.type == MAX_LOGITS_MONITOR and int(cb.step_interval) < 1:
            found.append(Problem(path=f"{path}.step_interval", value=cb.step_interval,
                                 line=_line(loaded, f"{path}.step_interval"),
                                 message="step_interval must be at least 1", hint="set step_interval: 1 (every step)"))
    if sum(getattr(cb, "type", None) == MAX_LOGITS_MONITOR for cb in config.callbacks or ()) > 1:
        found.append(Problem(path="callbacks", message="more than one MaxLogitsMonitor: each resets the running max",
                             hint="keep one entry with the step_interval you want"))
    tp = int(config.parallelism.tensor_parallel or 1)
    if tracking_requested(config) and tp > 1:
        found.append(Problem(path="model.track_max_attention_logit", value=True,
                             line=_line(loaded, "model.track_max_attention_logit"),
                             message=f"max attention logit tracking with tensor_parallel={tp} is not supported yet "
                             "(the heads, so max_logits_val, are split over ranks)",
                             hint="set parallelism.tensor_parallel: 1 or turn tracking off"))
    return found


def _build_data(config: Any, *, dp: int, dp_rank: int = 0) -> Any:
    from mftk.data.loader import build_train_dataset

    tr = config.training
    data = build_train_dataset(config.train_dataset.dataloader, global_batch_size=tr.global_batch_size,
                               local_batch_size=tr.local_batch_size, dp_size=dp, dp_rank=dp_rank,
                               drop_remainder=config.train_dataset.drop_remainder,
                               seq_length=config.model.seq_length)
    for w in data.warnings:
        log.warning("data: %s", w)
    if not len(data.loader):
        raise ConfigError(message="the training data yields no micro-batch",
                          problems=[Problem(path="train_dataset.dataloader.sizes", message="no micro-batch of data",
                                            hint="add data or lower training.local_batch_size")])
    log.info("Building dataset from config... %d samples, %d micro-batches per epoch", data.train_samples,
             len(data.loader))
    return data


def _build_optimizer(config: Any, model: Any, sharding: Any = None, dist: Any = None) -> Any:
    """AdamW (or Muon) over the trainable parameters; under FSDP over this rank's rows of each (sharded states)."""
    from mftk.engine.optim import AdamW, decide_weight_decay

    o = config.optimizer
    params = list(model.trainable_params())
    decisions = decide_weight_decay([(p.name, tuple(p.shape)) for p in params], float(o.weight_decay),
                                    include=o.weight_decay_include, exclude=o.weight_decay_exclude)
    for d in decisions:
        log.info(d.log_line())
    arrays = [p.asnumpy() for p in params]
    if sharding is not None:
        arrays = [sharding.local(i, a) for i, a in enumerate(arrays)]
    if o.type == "Muon":
        from mftk.engine.muon import build_muon

        opt = build_muon(config, model, [p.name for p in params], arrays, decisions, [tuple(p.shape) for p in params],
                         dist=dist)
        log.info("Muon: %d parameters orthogonalised, %d by the AdamW fallback", len(opt.muon_names()),
                 len(params) - len(opt.muon_names()))
        return opt
    return AdamW([p.name for p in params], arrays, decisions, betas=o.betas, eps=o.eps)


def _schedule(config: Any):
    from mftk.engine.schedule import build_schedule

    return build_schedule(config.lr_scheduler, config.training.steps)


def _columns(config: Any) -> tuple[str, ...]:
    ds = config.train_dataset
    if ds.input_columns:
        return tuple(ds.input_columns)
    return tuple(ds.dataloader.column_names) if ds.dataloader is not None else ("input_ids", "labels")


def _model_section(loaded: Any) -> dict | None:
    raw = loaded.raw.get("model") if isinstance(loaded.raw, dict) else None
    return dict(raw) if isinstance(raw, dict) else None


def nan_policy_from(config: Any) -> Any:
    """The skip-on-NaN policy of ``training.use_skip_step_on_nan`` / ``max_consecutive_skipped_steps``."""
    from mftk.engine.trainer import NanPolicy

    tr = config.training
    return NanPolicy(skip=tr.use_skip_step_on_nan, max_consecutive=tr.max_consecutive_skipped_steps)


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
    """SIGTERM/SIGINT set the stop flag (save, then exit 75); a second SIGINT interrupts at once."""

    def __init__(self, stop: Any, enabled: bool) -> None:
        self.stop, self.enabled, self.old = stop, enabled and threading.current_thread() is threading.main_thread(), {}

    def __enter__(self) -> None:
        if not self.enabled:
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stop.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.warning("%s received: saving a checkpoint after the current step, then stopping", name)
        self.stop.request(name)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


# --------------------------------------------------------------------------------------- resume
def plan_resume(config: Any, path: str, *, weights_only: bool, model: Any, world: int = 1) -> ResumePlan:
    """Decide the scenario and positions from ``common.json``, ``metadata.json`` and headers; check names and
    shapes. A checkpoint saved by another number of processes is resharded (global tensors → this layout)."""
    from mftk.ckpt.common import read_common
    from mftk.ckpt.layout import locate, scan_step_dir
    from mftk.ckpt.load import hf_weight_files
    from mftk.ckpt.metadata import read_metadata
    from mftk.ckpt.safetensors_io import read_header
    from mftk.plan.layout import layout_from_config

    tr = config.training
    gbs, lbs = tr.global_batch_size, tr.local_batch_size
    dp = layout_from_config(config.parallelism, world).dp if world > 1 else 1
    loc = locate(path)
    if loc.kind == "file":
        raise CheckpointError(message=f"{path} is a single file; resume needs a checkpoint directory", path=str(path),
                              hint="pass the save_path of a run, an iteration_* dir or a Hugging Face weights dir")
    params = {p.name: tuple(p.shape) for p in model.get_parameters()}
    notes: list[str] = []
    if loc.kind == "hf":
        if not weights_only:
            raise CheckpointError(message=f"{path} is a Hugging Face weights dir: it holds no optimizer state",
                                  path=str(path), hint="use --weights-only (no_load_optim: true) to initialise from it")
        names = {n for f in hf_weight_files(loc.step_dir) for n in read_header(f).tensors}
        return ResumePlan(source=str(path), kind="hf", step_dir=str(loc.step_dir), scenario=2, saved_step=0,
                          saved_global_batch_size=None, global_batch_size=gbs, saved_world=1, world=world, start_step=0,
                          consumed_samples=0, skip_micro_batches=0, loads=("model weights (HF names mapped)",),
                          notes=(f"weights-only init from Hugging Face dir {loc.step_dir} ({len(names)} tensors)",))
    files = scan_step_dir(loc.step_dir)
    if files.problems:
        raise CheckpointError(message=f"{loc.step_dir}: inconsistent rank files", path=str(loc.step_dir),
                              problems=list(files.problems))
    common = read_common(loc.step_dir)
    if missing_ranks := files.missing_model_ranks:
        raise CheckpointError(message=f"{loc.step_dir}: model files of ranks {missing_ranks} are missing "
                              f"(saved by {files.world} processes)", path=str(loc.step_dir))
    if not weights_only and files.missing_opt_ranks:
        raise CheckpointError(message=f"no optimizer file for ranks {files.missing_opt_ranks} in {loc.step_dir}",
                              path=str(loc.step_dir),
                              hint="resume with --weights-only (no_load_optim: true) for a fresh optimizer at step 0")
    if files.world > 1:
        meta = read_metadata(loc.step_dir)
        if meta is None:
            raise CheckpointError(message=f"{loc.step_dir} was saved by {files.world} processes but has no "
                                  "metadata.json, so its shards cannot be put together", path=str(loc.step_dir))
        shapes = {n: t.global_shape for n, t in meta.items() if not _is_opt_name(n)}
        if files.world != world:
            notes.append(f"Resharding: saved by {files.world} processes, loading into {world}; global tensors "
                         "are assembled from metadata.json and cut for this layout")
    else:
        shapes = {n: tuple(h.shape) for n, h in read_header(files.model[0]).tensors.items()}
        if world > 1:
            notes.append(f"Resharding: saved by 1 process, loading into {world}")
    missing = tuple(sorted(n for n in params if n not in shapes and not _optional_buffer(n)))
    unexpected = tuple(sorted(n for n in shapes if n not in params and not _optional_buffer(n)))
    if any(_optional_buffer(n) for n in set(params) ^ set(shapes)):
        notes.append("max_logits_val: tracking differs from the saved run; the running max starts from 0")
    mismatched = tuple(f"{n}: model {params[n]}, checkpoint {shapes[n]}" for n in sorted(params)
                       if n in shapes and tuple(shapes[n]) != params[n])
    saved_step, saved_gbs = common.step, common.global_batch_size
    loads = ["model weights"]
    if weights_only:
        scenario, start, consumed = 2, 0, 0
        notes.append("no_load_optim=True: refreshing fp32 master weights from loaded model params.")
    else:
        states = "muon_m, adam_m, adam_v" if config.optimizer.type == "Muon" else "adam_m, adam_v"
        loads += [f"optimizer states ({states}, global_step)"]
        consumed = common.consumed_samples if common.consumed_samples is not None else saved_step * (saved_gbs or gbs)
        if tr.rampup_batch_size or not saved_gbs or saved_gbs == gbs:
            scenario, start = 1, saved_step
        else:
            scenario, start = 3, int(saved_step * saved_gbs / gbs)
            notes.append(f"Scaled global step: {saved_step} -> {start} (batch size changed from {saved_gbs} to {gbs})")
            notes.append(f"LR position: the schedule continues from step {start} (the reference keeps the optimizer's "
                         f"own counter {saved_step}, so its LR and step disagree)")
        if files.state.get(0) is not None:
            loads += ["mftk extra state (RNG, data position)"]
    skip = consumed // (dp * lbs)
    if not weights_only:
        notes.append(f"Resume from {loc.step_dir}: step {saved_step} -> start at step {start}, "
                     f"consumed_samples={consumed}, skip {skip} micro-batches")
    return ResumePlan(source=str(path), kind="mf", step_dir=str(loc.step_dir), scenario=scenario,
                      saved_step=saved_step, saved_global_batch_size=saved_gbs, global_batch_size=gbs,
                      saved_world=files.world, world=world, start_step=start, consumed_samples=consumed,
                      skip_micro_batches=skip, loads=tuple(loads), notes=tuple(notes), missing=missing,
                      unexpected=unexpected, mismatched=mismatched)


@attrs.frozen
class _Loaded:
    optimizer: dict | None
    extra: dict | None


def _optional_buffer(name: str) -> bool:
    """``max_logits_val`` is a statistic reset every step: a checkpoint may have it or not either way."""
    return name.endswith(".max_logits_val")


def _is_opt_name(name: str) -> bool:
    return name == "global_step" or name.startswith(("adam_m.", "adam_v.", "main_param.", "muon_m."))


def load_checkpoint(plan: ResumePlan, model: Any, config: Any, *, rank: int = 0) -> _Loaded:
    """Load tensors per ``plan`` into ``model``; returns the optimizer state (global tensors; the caller cuts
    its shard) and the extra state to apply. Multi-process checkpoints are assembled through metadata.json."""
    from mftk.ckpt.load import load_global, load_rank
    from mftk.engine.models.build import load_state_dict

    problems = [f"missing in checkpoint: {n}" for n in plan.missing]
    problems += [f"unexpected in checkpoint: {n}" for n in plan.unexpected]
    problems += [f"shape mismatch: {m}" for m in plan.mismatched]
    if problems:
        raise CheckpointError(message=f"{plan.step_dir} does not fit the model ({len(problems)} problems)",
                              path=plan.step_dir, problems=problems[:50],
                              hint="check that the model: section matches the run that saved the checkpoint")
    balanced = None
    if config.checkpoint.load_balanced and plan.world > 1:  # scenario 4: each shard read once
        from mftk.engine.balanced_load import load_balanced

        kinds = ("model", "opt") if plan.kind == "mf" and plan.scenario != 2 else ("model",)
        balanced = load_balanced(plan.step_dir, rank=rank, world=plan.world, kinds=kinds)
    if plan.kind == "hf":
        family = importlib.import_module(f"mftk.engine.models.{config.model.model_type}.state_dict")
        hf = balanced.model if balanced else load_global(plan.step_dir)
        load_state_dict(model, _with_buffers(model, family.hf_to_mf(hf, config.model)))
        return _Loaded(None, None)
    if balanced is not None:
        from mftk.ckpt.extra_state import read_extra_state

        load_state_dict(model, balanced.model)
        same_rank = rank if rank < plan.saved_world else 0
        return _Loaded(balanced.optimizer if plan.scenario != 2 else None,
                       read_extra_state(plan.step_dir, same_rank, plan.saved_world))
    if plan.saved_world == 1:
        one = load_rank(plan.step_dir, optimizer=plan.scenario != 2)
        load_state_dict(model, one.model)
        return _Loaded(one.optimizer, one.extra)
    from mftk.ckpt.extra_state import read_extra_state
    from mftk.ckpt.metadata import read_metadata

    names = list(read_metadata(plan.step_dir))
    tensors = load_global(plan.step_dir, names)
    load_state_dict(model, {n: a for n, a in tensors.items() if not _is_opt_name(n)})
    opt = {n: a for n, a in tensors.items() if _is_opt_name(n)} if plan.scenario != 2 else None
    same_rank = rank if rank < plan.saved_world else 0  # the data position and RNG are the same on every rank
    return _Loaded(opt, read_extra_state(plan.step_dir, same_rank, plan.saved_world))


def _with_buffers(model: Any, tensors: dict) -> dict:
    """HF dirs hold no MindSpore Transformers buffers (expert_bias, tokens_per_expert...): keep the model's."""
    out = dict(tensors)
    for p in model.get_parameters():
        if not p.requires_grad and p.name not in out:
            out[p.name] = p.asnumpy()
    return out
