"""The parts of a `trainer.Trainer`, built from a run's validated config; the one place a gradient path is picked.

`build_path` chooses the strategy — pipeline stages, the device-resident update or the host update —
and prepares the model for it (compiled blocks); `build_parts` adds the step plan and the run's outputs.
This module never imports `trainer` (which imports it): the import graph of the engine has no circle.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import attrs
import numpy as np

from mftk.ckpt.checkpointer import Checkpointer
from mftk.derive import compiles_blocks
from mftk.engine.device_path import DevicePath
from mftk.engine.dispatch import low_priority_applies
from mftk.engine.grad_path import GradientPath
from mftk.engine.host_path import HostPath
from mftk.engine.pipeline_path import PipelinePath
from mftk.engine.step import BatchSchedule, NanPolicy, StepPlan, StopFlag
from mftk.progress import StepSink


@attrs.frozen
class TrainerParts:
    """What a `Trainer` runs with: the gradient path (holding the model, optimizer, data and ranks), the
    learning-rate schedule, the step plan, and where results go."""

    path: GradientPath
    schedule: Callable[[int], float]
    plan: StepPlan
    sinks: Sequence[StepSink] = ()
    checkpointer: Checkpointer | None = None
    saved_config: dict | None = None  # the resolved config written with each checkpoint
    monitor: Any = None
    stop: StopFlag | None = None
    data_check: Callable[[], None] | None = None  # raises DataFormatError when a data file changed


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


def build_path(model: Any, optimizer: Any, batches: Iterator[dict], *, dist: Any = None,
               columns: tuple[str, ...] = ("input_ids", "labels"), jit_blocks: bool | None = None,
               low_priority_dispatch: bool | None = None, pipeline: dict | None = None) -> GradientPath:
    """The gradient path of a run: `PipelinePath` on a pipeline rank (``pipeline``: its ``schedule_name``,
    ``local_batch_size`` and ``seq_length``), `DevicePath` for an optimizer that updates on the device,
    else `HostPath`. ``None`` settings are decided here (`auto_jit_blocks`, `auto_low_priority_dispatch`)."""
    if auto_jit_blocks(model, dist) if jit_blocks is None else jit_blocks:
        model.jit_blocks()  # before the gradient function is made
    low = auto_low_priority_dispatch(model, dist) if low_priority_dispatch is None else low_priority_dispatch
    if dist is not None and dist.pipeline:
        return PipelinePath(model, optimizer, batches, dist=dist, stage=dist.stage, low_priority=low, **pipeline)
    kind = DevicePath if getattr(optimizer, "on_device", False) else HostPath
    return kind(model, optimizer, batches, dist=dist, columns=columns, low_priority=low)


def nan_policy_from(config: Any) -> NanPolicy:
    """The skip-on-NaN policy of ``training.use_skip_step_on_nan`` / ``max_consecutive_skipped_steps``."""
    tr = config.training
    return NanPolicy(skip=tr.use_skip_step_on_nan, max_consecutive=tr.max_consecutive_skipped_steps)


def build_parts(config: Any, *, model: Any, optimizer: Any, loader: Any, state: Any, dist: Any, layout: Any,
                checkpointer: Checkpointer | None, sinks: Sequence[StepSink] = (), monitor: Any = None,
                stop: StopFlag | None = None) -> TrainerParts:
    """The trainer of a run: every setting from the validated config, the data from ``state``'s position."""
    from mftk.config.report import resolved
    from mftk.engine.builders import build_schedule
    from mftk.plan.flops import flops_per_step

    tr, m = config.training, config.model
    seq_length = int(getattr(m, "seq_length", 0) or 0)
    batches = loader.iter_batches(loader.start_batch(state.consumed_samples))
    pipeline = {"schedule_name": config.parallelism.pipeline_parallel_schedule,
                "local_batch_size": tr.local_batch_size, "seq_length": seq_length}
    path = build_path(model, optimizer, batches, dist=dist, columns=config.model_columns,
                      low_priority_dispatch=config.mftk.low_priority_dispatch, pipeline=pipeline)
    rampup = tuple(tr.rampup_batch_size) if tr.rampup_batch_size else None
    plan = StepPlan(batches=BatchSchedule(tr.global_batch_size, tr.local_batch_size, layout.dp, rampup),
                    total_steps=tr.steps, max_norm=tr.max_norm, nan_policy=nan_policy_from(config),
                    flops_per_sample=flops_per_step(m, global_batch_size=1) / layout.world, seq_length=seq_length,
                    show_mtp=bool(getattr(model.spec, "mtp_loss_scaling_factor", 0)), epoch_micro_batches=len(loader))
    return TrainerParts(path=path, schedule=build_schedule(config), plan=plan, sinks=sinks, checkpointer=checkpointer,
                        saved_config=resolved(config), monitor=monitor, stop=stop,
                        data_check=getattr(loader, "check_files", None))
