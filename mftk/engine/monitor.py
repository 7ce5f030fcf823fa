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
metrics reach the sinks. The max-attention-logit monitor is not provided.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

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


def build_monitors(loaded: Any, *, rank: int = 0, world: int = 1, cwd: str | None = None) -> tuple[TrainStateMonitor, list]:
    """The train-state monitor plus the extra step sinks the config asks for: a TensorBoard writer
    (``monitor.tensorboard.output_dir`` set, last rank only) and the profiler (``profiler.enable_profiling``,
    this rank in ``profiler_rank``). The caller closes the sinks (closing stops the profiler)."""
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
    return TrainStateMonitor(config.monitor.train_state, writer), sinks
