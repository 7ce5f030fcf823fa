"""Where a training run goes (`start`: this process, or an msrun job), and the msrun job: the parent that
launches it (`train_distributed`) and the body every worker runs (`train_worker`), on top of the generic
launcher (`engine.launch`).

The parent follows rank 0's log: its reference-format lines go to ``on_log_line`` and its step lines,
parsed back, to the sinks; each worker returns its `TrainResult` as JSON, and rank 0's is the job's.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import attrs

from mftk.ckpt.guard import hold_save_path, save_path_notes
from mftk.ckpt.resume import ResumePlan, ResumeScenario
from mftk.engine.device import select
from mftk.engine.run import TrainResult, train
from mftk.logs.sinks import log, mf_console_handler, train_logger
from mftk.progress import StepSink

WORKER_TARGET = "mftk.engine.workers:train_worker"


def start(loaded: Any, config: str | os.PathLike, *, spec: Any, overrides: Iterable[str] = (),
          output_dir: str | os.PathLike = "output", sinks: Iterable[StepSink] = (),
          console: logging.Handler | None = None, on_log_line: Any = None, on_restart: Any = None,
          resume_from: Any = None, weights_only: bool = False, dry_run: bool = False, new_run: bool = False,
          model_from_checkpoint: bool = False, max_restarts: int = 0) -> TrainResult:
    """The one choice between this process and an msrun job, for `mftk train` and `mftk resume`.

    ``loaded`` is ``config`` (the YAML path the workers load again) validated for ``spec.world`` workers. More than
    one, and not a dry run: an msrun job (`train_distributed`; ``on_log_line``, ``on_restart``), its device chosen
    and its save path checked and held here first. Otherwise `run.train` in this process, ``console`` on the
    ``mftk.train`` logger while it runs (an msrun job's lines come through ``on_log_line`` instead).
    """
    if spec.world > 1 and not dry_run:
        return _start_job(loaded, config, spec=spec, overrides=list(overrides), output_dir=output_dir, sinks=sinks,
                          on_log_line=on_log_line, on_restart=on_restart, resume_from=resume_from,
                          weights_only=weights_only, new_run=new_run, model_from_checkpoint=model_from_checkpoint,
                          max_restarts=max_restarts)
    logger = train_logger()  # its level as MFTK_DEBUG says now
    if console is not None:
        logger.addHandler(console)
    try:
        return train(loaded, output_dir=output_dir, sinks=sinks, new_run=new_run, resume_from=resume_from,
                     weights_only=weights_only, dry_run=dry_run, world_size=spec.world,
                     model_from_checkpoint=model_from_checkpoint)
    finally:
        if console is not None:
            logger.removeHandler(console)


def _start_job(loaded: Any, config: str | os.PathLike, *, spec: Any, overrides: list[str], output_dir: Any,
               sinks: Iterable[StepSink], on_log_line: Any, on_restart: Any, resume_from: Any, weights_only: bool,
               new_run: bool, model_from_checkpoint: bool, max_restarts: int) -> TrainResult:
    """The msrun job of `start`. The layout was checked by the config's validation (``config.runnable``) before
    any worker starts; the device is chosen once, for every worker; this process outlives every worker, so it
    holds the save path (node 0, when it waits for the job)."""
    cfg, ck = loaded.config, loaded.config.checkpoint
    device = select(cfg.context.device_target)
    if spec.hang_timeout_s is None and cfg.mftk.hang_timeout_s is not None:
        spec = attrs.evolve(spec, hang_timeout_s=cfg.mftk.hang_timeout_s)
    with hold_save_path(ck.save_path, enabled=ck.enable_save and spec.join and spec.node_rank == 0) as lock:
        save_path_notes(cfg, new_run=new_run, source=resume_from or ck.load_path, weights_only=weights_only)
        return train_distributed(config, overrides=overrides, output_dir=output_dir, spec=spec, resume_from=resume_from,
                                 weights_only=weights_only, on_log_line=on_log_line, sinks=sinks, new_run=new_run,
                                 device=device, model_from_checkpoint=model_from_checkpoint,
                                 max_restarts=max_restarts, on_restart=on_restart,
                                 keep_fds=(lock.fd,) if lock is not None and lock.fd is not None else (),
                                 save_path=ck.save_path if ck.enable_save else None,
                                 follow_rank=loss_rank(cfg, spec.world))


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


def loss_rank(config: Any, world: int) -> int:
    """The first rank of the last pipeline stage: the one whose step lines carry the loss (rank 0 without PP;
    ranks are laid out pipeline-outermost, `derive.Layout.rank_coords`)."""
    from mftk.derive import layout_from_config

    pp = layout_from_config(config.parallelism, world).pp
    return (pp - 1) * (world // pp) if pp > 1 else 0


def result_from_json(data: dict[str, Any]) -> TrainResult:
    """The `TrainResult` a worker returned (lists back to tuples, the scenario back to its enum)."""
    d = dict(data)
    plan = d.pop("resume", None)
    for key in ("losses", "grad_norms", "notes"):
        d[key] = tuple(d.get(key) or ())
    d["phases"] = tuple(tuple(p) for p in d.get("phases") or ())
    d["parameters"] = tuple(d.get("parameters") or (0, 0))
    if plan is not None:
        plan = {k: tuple(v) if isinstance(v, list) else v for k, v in plan.items()}
        plan = ResumePlan(**{**plan, "scenario": ResumeScenario(plan["scenario"])})
    return TrainResult(**d, resume=plan)


RESTART_BACKOFF_S = 2.0  # between ending a failed attempt and relaunching: ports and files settle


def train_distributed(config: str | os.PathLike, *, overrides: Iterable[str] = (),
                      output_dir: str | os.PathLike = "output", spec: Any, resume_from: Any = None,
                      weights_only: bool = False, on_log_line: Any = None, sinks: Iterable[StepSink] = (),
                      timeout_s: float | None = None, new_run: bool = False, device: str | None = None,
                      max_restarts: int = 0, save_path: str | None = None, on_restart: Any = None,
                      follow_rank: int | None = None, keep_fds: tuple[int, ...] = (),
                      model_from_checkpoint: bool = False) -> TrainResult:
    """Run `train_worker` on every rank through msrun (`engine.launch`); ``follow_rank``'s (default rank 0's)
    log lines go to ``on_log_line`` and its step lines (parsed) to ``sinks``; ``device``
    (`engine.device.select`'s) is every worker's device (CPU when None). A failing worker raises TrainingError.

    ``max_restarts``: when the job fails with a `JobFault` (a worker died or crashed, a rank hung), the whole job
    is ended, and after `RESTART_BACKOFF_S` relaunched as a resume of ``save_path`` (its newest checkpoint; the
    original source while it has none), up to that many times; each restart is written to every local rank's
    info.log and metrics.jsonl (`logs.restarts`) and given to ``on_restart``. The last attempt's error is raised.
    """
    from mftk.errors import JobFault

    attempt, source, fresh = 0, resume_from, (new_run, weights_only)
    while True:
        started = time.monotonic()
        try:
            return _launch_once(config, overrides=overrides, output_dir=output_dir, spec=spec, resume_from=source,
                                weights_only=fresh[1], on_log_line=on_log_line, sinks=sinks, timeout_s=timeout_s,
                                new_run=fresh[0], device=device, attempt=attempt, follow_rank=follow_rank,
                                keep_fds=keep_fds, model_from_checkpoint=model_from_checkpoint)
        except JobFault as fault:
            if attempt >= max_restarts:
                raise
            attempt += 1
            restart, resumed = _plan_restart(fault, attempt, max_restarts, save_path, time.monotonic() - started)
            if resumed:
                source, fresh = Path(save_path), (False, False)
            out = Path(output_dir).resolve()
            first = spec.node_rank * spec.nproc
            from mftk.logs.restarts import write_restart

            write_restart(restart, [out / "log" / f"rank_{r}" for r in range(first, first + spec.nproc)])
            if on_restart is not None:
                on_restart(restart)
            time.sleep(RESTART_BACKOFF_S)


ATTEMPT_PORT_STRIDE = 2  # attempt a of a multi-node job meets on --master-port + 2a (msrun also binds port + 1)


def attempt_spec(spec: Any, attempt: int) -> Any:
    """The launch of one attempt: a multi-node job's attempt ``a`` runs its scheduler on ``master_port + 2a``.

    Every node's parent restarts on its own (each sees the fault: its own worker failed, or its collectives lost
    the peer node), in any order and seconds apart. Were the port the same, a node that relaunched first could
    register with the previous attempt's scheduler, still alive on node 0 until node 0 notices; on an attempt's
    own port its workers can only meet the nodes of the same attempt, and wait for node 0's new scheduler (msrun's
    ``--cluster_time_out``, lengthened here by twice the hang timeout: the last node to notice may be one whose
    collectives wait on the lost node until its watchdog fires). A single-node job picks a free port for every
    launch already."""
    if attempt == 0 or spec.nnodes == 1 or spec.master_port is None:
        return spec
    from mftk.engine.watchdog import STARTUP_MIN_S

    noticed_s = spec.hang_timeout_s if spec.hang_timeout_s is not None else STARTUP_MIN_S  # derived: >= 60 s
    return attrs.evolve(spec, master_port=spec.master_port + ATTEMPT_PORT_STRIDE * attempt,
                        cluster_time_out_s=spec.cluster_time_out_s + int(2 * noticed_s))


def _plan_restart(fault: Any, attempt: int, max_restarts: int, save_path: str | None,
                  attempt_s: float) -> tuple[Any, bool]:
    """The restart record, and whether the relaunch resumes from ``save_path`` (it holds a checkpoint)."""
    from mftk.ckpt.layout import iteration_dir_name, read_tracker
    from mftk.errors import CheckpointError
    from mftk.logs.restarts import Restart

    step = None
    if save_path:
        try:
            step = read_tracker(save_path)
        except CheckpointError:
            step = None
    where = Path(save_path) / iteration_dir_name(step) if step is not None else None
    resumed = where is not None and where.is_dir()
    lost_s = attempt_s
    if resumed:
        lost_s = max(0.0, time.time() - where.stat().st_mtime)
    reached = fault.step
    resumed_step = step if resumed else 0
    return Restart(attempt=attempt, max_restarts=max_restarts, reason=fault.kind, ranks=tuple(fault.ranks),
                   step_reached=reached, resumed_from=str(where) if resumed else "", resumed_step=resumed_step,
                   steps_lost=max(0, reached - resumed_step) if reached is not None else None, seconds_lost=lost_s,
                   message=fault.message.splitlines()[0]), resumed


def _launch_once(config: str | os.PathLike, *, overrides: Iterable[str], output_dir: str | os.PathLike, spec: Any,
                 resume_from: Any, weights_only: bool, on_log_line: Any, sinks: Iterable[StepSink],
                 timeout_s: float | None, new_run: bool, device: str | None, attempt: int,
                 follow_rank: int | None, keep_fds: tuple[int, ...], model_from_checkpoint: bool) -> TrainResult:
    """One launch of the job (`train_distributed` without restarts)."""
    from mftk.engine.faults import ATTEMPT_ENV
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

    env = {ENV: device} if device else {}
    env[ATTEMPT_ENV] = str(attempt)
    spec = attempt_spec(spec, attempt)
    result = launch(WORKER_TARGET, payload, spec=spec, on_line=on_line, timeout_s=timeout_s, env=env,
                    follow_rank=follow_rank, keep_fds=keep_fds)
    if not result.results:
        return TrainResult(start_step=0, final_step=0, total_steps=0, consumed_samples=0, losses=(), grad_norms=(),
                           skipped_steps=0, checkpoint="", output_dir=str(out), log_file="", metrics_file="",
                           phases=(), notes=(f"job detached; worker logs in {result.log_dir}",))
    job = result_from_json(result.results[min(result.results)])
    if follow_rank in result.results and follow_rank != min(result.results):  # the loss is the last stage's
        last = result.results[follow_rank]
        job = attrs.evolve(job, losses=tuple(last.get("losses") or ()), grad_norms=tuple(last.get("grad_norms") or ()))
    return job
