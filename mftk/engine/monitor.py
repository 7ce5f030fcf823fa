"""`monitor.train_state`: per-micro-batch and per-step loss and gradient-norm lines (reference §5.1).

Lines go to the ``mftk.train`` logger in the reference's shapes:

    {"step": S, "micro_step": k, "local_loss": v}          # v already divided by accum
    {"step": S, "device_loss": v}                           # the step loss
    { "step": S }  then  { "device_norm": <name>: %10.6f }  # not valid JSON, as in the reference

Differences, on purpose: ``local_norm`` and ``device_norm`` are both the norm of the *accumulated*
(pre-clip) gradient of each matching parameter — the reference's ``device_norm`` is the last
micro-batch's hook norm and ``local_norm`` needs per-micro-batch hooks mftk does not install — so
``local_norm`` prints once per step with ``micro_step`` = the accumulation count.
TensorBoard scalars are written by `mftk.engine.tensorboard.TensorboardSink`; this monitor hands it
the values only it sees (the last micro-batch's scaled loss, the step loss) before each step's
metrics reach the sinks.

`MaxLogitsMonitor` (``callbacks: [{type: MaxLogitsMonitor, step_interval: N}]``, added automatically
when ``model.track_max_attention_logit`` is on) reads every layer's ``core_attention.max_logits_val``
after each step and, every N steps, logs the reference's lines (4 significant digits)::

    step:[    2/   10] max_attention_logit/<param name>: [v, ...]
    step:[    2/   10] max_attention_logit/<param name>/mean: v
    step:[    2/   10] max_attention_logit/<param name>/max: v

It resets the running max after *every* step, logged or not, as the reference means to (its reset on
skipped steps crashes, gotcha #16), so a logged value is the max over that step's micro-batches.
The reset comes before the step's checkpoint is written, so a checkpoint holds zeros there and a
resume starts from a clean max. Values are per process (not reduced over data/context-parallel ranks).
A flush failure in one monitor is logged and the others still run, as the reference's MonitorGroup.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from mftk.config.sections import MAX_LOGITS_MONITOR, tracking_requested

log = logging.getLogger("mftk.train")


def _filter(value: Any) -> list[str] | None:
    """'' / False → off; True → every parameter; str or list → substring filters."""
    if value is True:
        return [""]
    if not value:
        return None
    return [value] if isinstance(value, str) else [str(v) for v in value]


class TrainStateMonitor:
    def __init__(self, train_state: Any, tensorboard: Any = None) -> None:
        """``tensorboard``: a `TensorboardSink` (or None) to stage the micro-batch losses on."""
        self.local_loss = bool(train_state.local_loss)
        self.device_loss = bool(train_state.device_loss)
        self.local_norm = _filter(train_state.local_norm)
        self.device_norm = _filter(train_state.device_norm)
        self.tensorboard = tensorboard

    @property
    def enabled(self) -> bool:
        return (self.local_loss or self.device_loss or bool(self.local_norm) or bool(self.device_norm)
                or self.tensorboard is not None)

    def flush(self, step: int, out: Any, grads: np.ndarray, optimizer: Any) -> None:
        if self.tensorboard is not None:
            self.tensorboard.stage(local_loss=out.local_losses[-1] if out.local_losses else None,
                                   device_loss=out.loss)
        if self.local_loss:
            for k, v in enumerate(out.local_losses, start=1):
                log.info(json.dumps({"step": step, "micro_step": k, "local_loss": v}))
        if self.device_loss:
            log.info(json.dumps({"step": step, "device_loss": out.loss}))
        for key, filters in (("local_norm", self.local_norm), ("device_norm", self.device_norm)):
            if not filters:
                continue
            head = {"step": step} if key == "device_norm" else {"step": step, "micro_step": len(out.local_losses)}
            log.info("{ " + ", ".join(f'"{k}": {v}' for k, v in head.items()) + " }")
            for i, name in enumerate(optimizer.names):
                if any(f in name for f in filters):
                    g = grads[optimizer.slices[i]].astype(np.float64)
                    log.info('{ "%s": %s: %10.6f }', key, name, float(np.sqrt(np.dot(g, g))))


def max_logits_cells(model: Any) -> list:
    """Every core-attention cell that keeps ``max_logits_val``, in layer order."""
    return [c for _, c in model.cells_and_names() if getattr(c, "max_logits_val", None) is not None]


class MaxLogitsMonitor:
    """Logs each layer's per-head max attention logit every ``step_interval`` steps, resets it every step."""

    def __init__(self, model: Any, *, total_steps: int, step_interval: int = 1) -> None:
        if step_interval < 1:
            raise ValueError(f"step_interval must be >= 1, got {step_interval}")
        self.cells = max_logits_cells(model)
        self.total_steps, self.step_interval = int(total_steps), int(step_interval)

    @property
    def enabled(self) -> bool:
        return bool(self.cells)

    def lines(self, step: int) -> list[str]:
        """The reference's lines for this step's values (no reset)."""
        head = "step:[%5d/%5d] max_attention_logit/" % (step, self.total_steps)
        out = []
        for cell in self.cells:
            v, name = cell.max_logits_val.asnumpy().astype(np.float64), cell.max_logits_val.name
            out.append(f"{head}{name}: [{', '.join(f'{x:.4g}' for x in v)}]")
            out.append(f"{head}{name}/mean: {v.mean():.4g}")
            out.append(f"{head}{name}/max: {v.max():.4g}")
        return out

    def flush(self, step: int, out: Any = None, grads: Any = None, optimizer: Any = None) -> None:
        try:
            if step % self.step_interval == 0:
                for line in self.lines(step):
                    log.info(line)
        finally:
            for cell in self.cells:
                cell.reset_max_logits()


class MonitorGroup:
    """Several monitors flushed in order; one failing is logged and the rest still run (reference §5.1)."""

    def __init__(self, *monitors: Any) -> None:
        self.monitors = [m for m in monitors if m.enabled]
        self.tensorboard = next((m.tensorboard for m in monitors if getattr(m, "tensorboard", None)), None)

    @property
    def enabled(self) -> bool:
        return bool(self.monitors)

    def flush(self, step: int, out: Any, grads: np.ndarray, optimizer: Any) -> None:
        for m in self.monitors:
            try:
                m.flush(step, out, grads, optimizer)
            except Exception as e:  # noqa: BLE001 -- the reference logs and carries on
                log.warning("Monitor %s flush failed at step %d: %s", type(m).__name__, step, e)


def build_max_logits_monitor(config: Any, model: Any) -> MaxLogitsMonitor | None:
    """The configured ``MaxLogitsMonitor`` (first entry), or the automatic one (``step_interval: 1``) when
    ``model.track_max_attention_logit`` is on; None when tracking is off."""
    if model is None or not tracking_requested(config):
        return None
    entries = [cb for cb in getattr(config, "callbacks", None) or () if getattr(cb, "type", None) == MAX_LOGITS_MONITOR]
    interval = int(entries[0].step_interval) if entries else 1
    return MaxLogitsMonitor(model, total_steps=int(config.training.steps), step_interval=interval)


def build_monitors(loaded: Any, *, rank: int = 0, world: int = 1, cwd: str | None = None,
                   model: Any = None) -> tuple[Any, list]:
    """The train-state monitor (grouped with a `MaxLogitsMonitor` when tracking is on and ``model`` is
    given) plus the extra step sinks the config asks for: a TensorBoard writer (``monitor.tensorboard.output_dir``
    set, last rank only) and the profiler (``profiler.enable_profiling``, this rank in ``profiler_rank``).
    The caller closes the sinks (closing stops the profiler)."""
    config = loaded.config
    sinks: list = []
    tb = config.monitor.tensorboard
    writer = None
    if tb.output_dir and rank == world - 1:
        from mftk.engine.tensorboard import TensorboardSink, config_text

        writer = TensorboardSink(tb.output_dir, log_interval=tb.log_interval, queue_size=tb.queue_size,
                                 config_text=config_text(loaded), device_loss=bool(config.monitor.train_state.device_loss))
        sinks.append(writer)
    from mftk.engine.profiler import StepProfiler, wants_profiler

    if wants_profiler(config.profiler, rank):
        sinks.append(StepProfiler(config.profiler, rank=rank, cwd=cwd))
    state = TrainStateMonitor(config.monitor.train_state, writer)
    max_logits = build_max_logits_monitor(config, model)
    return (MonitorGroup(state, max_logits) if max_logits is not None else state), sinks
