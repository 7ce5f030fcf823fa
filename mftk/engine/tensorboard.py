"""`monitor.tensorboard`: TensorBoard scalars as the reference's TensorboardMonitor writes them (§5.1).

A `StepSink`: every ``log_interval``-th step (``step % log_interval == 0``) each metric is written twice,
``add_scalar(tag, v, step)`` and ``add_scalar("<tag> vs samples", v, consumed_samples)`` (stored as
``<tag>_vs_samples``: tensorboardX replaces the spaces, for the reference too); steps in between are dropped. At start-up each top-level config section is written as text at step 0.
Only the last rank (``world − 1``) writes, as in the reference.

Tags (the reference's LossCallback names): ``loss``, ``load-balancing-loss``, ``grad-norm``,
``iteration-time`` (ms), ``throughput``, ``learning-rate`` (the LR the log line shows),
``batch-size``, ``mtp-<k>-loss``, plus ``local_loss`` (the last micro-batch's loss ÷ accumulation,
always) and ``device_loss`` (the step loss, only with ``monitor.train_state.device_loss``).
Not written: ``loss-scale`` (no loss scaling in fp32 on CPU) and ``indexer-loss`` (no DSA indexer);
``grad-norm`` is left out on a skipped (non-finite) step rather than written as NaN.

The writer is tensorboardX (a dependency): the TFRecord framing with CRC32C and the Event protobuf
are easy to get subtly wrong, and TensorBoard itself would pull in a large dependency tree.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from mftk.errors import InputError
from mftk.progress import BaseSink

log = logging.getLogger("mftk.train")

# metrics key → the reference's tag
_TAGS = (("loss", "loss"), ("load_balancing_loss", "load-balancing-loss"), ("grad_norm", "grad-norm"),
         ("per_step_time", "iteration-time"), ("throughput", "throughput"), ("lr", "learning-rate"),
         ("global_batch_size", "batch-size"))


def scalars_of(metrics: dict[str, Any], extra: dict[str, float]) -> list[tuple[str, float]]:
    """The (tag, value) pairs written for one step's metrics, in a stable order; None values dropped."""
    out = [(tag, metrics[key]) for key, tag in _TAGS if metrics.get(key) is not None]
    k = 1
    while f"mtp_{k}_loss" in metrics:
        if metrics[f"mtp_{k}_loss"] is not None:
            out.append((f"mtp-{k}-loss", metrics[f"mtp_{k}_loss"]))
        k += 1
    out.extend((tag, v) for tag, v in extra.items() if v is not None)
    return [(tag, float(v)) for tag, v in out]


class TensorboardSink(BaseSink):
    """Writes step scalars to ``output_dir`` (created); raises InputError if it cannot be created."""

    def __init__(self, output_dir: str, *, log_interval: int = 1, queue_size: int = 1000,
                 config_text: dict[str, str] | None = None, device_loss: bool = False) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:  # a declared dependency: only a broken install gets here
            raise InputError(message=f"monitor.tensorboard.output_dir is set but tensorboardX cannot be imported: {exc}",
                             path=output_dir, hint="pip install tensorboardX, or unset monitor.tensorboard.output_dir") from exc
        path = Path(output_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
            if not os.access(path, os.W_OK):
                raise PermissionError(f"{path} is not writable")
        except OSError as exc:
            raise InputError(message=f"cannot write TensorBoard events to {output_dir}: {exc}", path=output_dir,
                             hint="set monitor.tensorboard.output_dir to a writable directory (or '' to disable)") from exc
        self.log_interval = log_interval if isinstance(log_interval, int) and log_interval > 0 else 1
        self.device_loss = device_loss
        self._pending: dict[str, float] = {}
        self._writer = SummaryWriter(logdir=str(path), max_queue=queue_size if queue_size > 0 else 1000)
        for key, text in (config_text or {}).items():
            self._writer.add_text(key, text, 0)
        log.info("TensorBoard scalars: %s (every %d step(s))", path, self.log_interval)

    @property
    def logdir(self) -> str:
        return self._writer.logdir

    def stage(self, *, local_loss: float | None, device_loss: float | None) -> None:
        """Values only the monitor sees (per-micro-batch losses), written with the next `on_step`."""
        self._pending = {"local_loss": local_loss}
        if self.device_loss:
            self._pending["device_loss"] = device_loss

    def stage_more(self, values: dict[str, float]) -> None:
        """More monitor-only scalars for the next `on_step` (the MoE monitor's), after `stage`."""
        self._pending.update(values)

    def on_step(self, metrics: dict[str, Any]) -> None:
        extra, self._pending = self._pending, {}
        step = int(metrics["step"])
        if step % self.log_interval:
            return
        samples = int(metrics.get("consumed_samples", 0))
        for tag, value in scalars_of(metrics, extra):
            self._writer.add_scalar(tag, value, step)
            self._writer.add_scalar(f"{tag} vs samples", value, samples)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def config_text(loaded: Any) -> dict[str, str]:
    """Each top-level YAML section as text (the reference's ``add_text(key, str(value), 0)``)."""
    raw = getattr(loaded, "raw", None)
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
