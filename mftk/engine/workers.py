"""A training run as an msrun job: the parent that launches it (`train_distributed`) and the body every
worker runs (`train_worker`), on top of the generic launcher (`engine.launch`).

The parent follows rank 0's log: its reference-format lines go to ``on_log_line`` and its step lines,
parsed back, to the sinks; each worker returns its `TrainResult` as JSON, and rank 0's is the job's.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable

import attrs

from mftk.ckpt.resume import ResumePlan, ResumeScenario
from mftk.engine.run import TrainResult, train
from mftk.logs.sinks import log, mf_console_handler
from mftk.progress import StepSink

WORKER_TARGET = "mftk.engine.workers:train_worker"


def train_worker(config: str, overrides: list[str], output_dir: str, resume_from: str | None = None,
                 weights_only: bool = False, new_run: bool = False, lock_save_path: bool = False,
                 model_from_checkpoint: bool = False) -> dict[str, Any]:
    """The msrun worker body (`launch.worker_main` calls it after ``communication.init()``).

    Loads the config for this job's world size, logs to stdout (msrun's ``worker_<rank>.log``; the
    parent follows rank 0's) and returns the `TrainResult` as JSON-able data. ``lock_save_path``: rank 0
    holds the save path's lock (the parent does not wait for the job, so it cannot).
    """
    from mindspore import communication

    from mftk.config.load import load_config

    world = communication.get_group_size()
    loaded = load_config(config, overrides=overrides, world_size=world)
    handler = mf_console_handler(sys.stdout)
    log.addHandler(handler)
    try:
        result = train(loaded, output_dir=output_dir, resume_from=resume_from, weights_only=weights_only,
                       world_size=world, new_run=new_run, model_from_checkpoint=model_from_checkpoint,
                       lock_save_path=lock_save_path and communication.get_rank() == 0)
    finally:
        log.removeHandler(handler)
    return attrs.asdict(result)


def result_from_json(data: dict[str, Any]) -> TrainResult:
    """The `TrainResult` a worker returned (lists back to tuples, the scenario back to its enum)."""
    d = dict(data)
    plan = d.pop("resume", None)
    for key in ("losses", "grad_norms", "notes"):
        d[key] = tuple(d.get(key) or ())
    d["phases"] = tuple(tuple(p) for p in d.get("phases") or ())
    if plan is not None:
        plan = {k: tuple(v) if isinstance(v, list) else v for k, v in plan.items()}
        plan = ResumePlan(**{**plan, "scenario": ResumeScenario(plan["scenario"])})
    return TrainResult(**d, resume=plan)


def train_distributed(config: str | os.PathLike, *, overrides: Iterable[str] = (),
                      output_dir: str | os.PathLike = "output", spec: Any, resume_from: Any = None,
                      weights_only: bool = False, on_log_line: Any = None, sinks: Iterable[StepSink] = (),
                      timeout_s: float | None = None, new_run: bool = False, device: str | None = None,
                      model_from_checkpoint: bool = False) -> TrainResult:
    """Run `train_worker` on every rank through msrun (`engine.launch`); rank 0's log lines go to
    ``on_log_line`` and its step lines (parsed) to ``sinks``; ``device`` (`engine.device.select`'s) is every
    worker's device (CPU when None). A failing worker raises TrainingError."""
    from mftk.engine.launch import launch
    from mftk.logs.format import parse_step_line

    out = Path(output_dir).resolve()
    payload = {"config": str(Path(config).resolve()), "overrides": list(overrides), "output_dir": str(out),
               "resume_from": str(Path(resume_from).resolve()) if resume_from else None, "weights_only": weights_only,
               "new_run": new_run, "lock_save_path": not spec.join, "model_from_checkpoint": model_from_checkpoint}  # joined: the caller holds the lock
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
    from mftk.engine.device import ENV

    env = {ENV: device} if device else None
    result = launch(WORKER_TARGET, payload, spec=spec, on_line=on_line, timeout_s=timeout_s, env=env)
    if not result.results:
        return TrainResult(start_step=0, final_step=0, total_steps=0, consumed_samples=0, losses=(), grad_norms=(),
                           skipped_steps=0, checkpoint="", output_dir=str(out), log_file="", metrics_file="",
                           phases=(), notes=(f"job detached; worker logs in {result.log_dir}",))
    return result_from_json(result.results[min(result.results)])
