"""Where a training run's log lines go: the ``mftk.train`` logger, its file and console handlers, and
the sink that turns each step's metrics into the reference's step line.

The library never prints: the trainer logs to ``mftk.train`` and reports metrics to `StepSink`s. A run
attaches `attach_file_log` (``log/rank_<r>/info.log`` in the reference's file format); a command that
wants the lines on a terminal adds `mf_console_handler`.
"""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Iterable

from mftk.errors import InputError
from mftk.logs.format import LOSS_CALLBACK_FILEPATH, LOSS_CALLBACK_LINENO, format_step_line, mf_formatter
from mftk.progress import BaseSink

TRAIN_LOGGER = "mftk.train"


class _PathFilter(logging.Filter):
    """Give records the reference's ``filepath`` field: the path from the package dir on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "filepath"):
            path = record.pathname.replace(os.sep, "/")
            i = path.rfind("/mftk/")
            record.filepath = path[i + 1:] if i >= 0 else os.path.basename(path)
        return True


def train_logger() -> logging.Logger:
    """The ``mftk.train`` logger, at INFO (DEBUG with ``MFTK_DEBUG=1``), with the ``filepath`` filter."""
    log = logging.getLogger(TRAIN_LOGGER)
    log.setLevel(logging.DEBUG if os.environ.get("MFTK_DEBUG") else logging.INFO)
    if not any(isinstance(f, _PathFilter) for f in log.filters):
        log.addFilter(_PathFilter())
    return log


log = train_logger()


def mf_console_handler(stream: Any) -> logging.Handler:
    """A handler printing ``mftk.train`` records with the reference's stdout prefix."""
    h = logging.StreamHandler(stream)
    h.setFormatter(mf_formatter("stdout"))
    return h


class FileLogHandler(logging.FileHandler):
    """``info.log``'s handler: a failed write (a full disk, a read-only remount) is kept in ``failure`` for the
    trainer (`write_failure`), which saves a checkpoint and stops, instead of logging's traceback on stderr
    at every line."""

    failure: str | None = None

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        import sys

        exc = sys.exc_info()[1]
        if self.failure is None:
            self.failure = f"cannot write {self.baseFilename}: {getattr(exc, 'strerror', None) or exc}"

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # the unwritten tail of a full disk; the failure was reported already
            if self.stream is not None:
                with contextlib.suppress(OSError):
                    self.stream.close()
            self.stream = None  # type: ignore[assignment]


def write_failure(sinks: Iterable[Any] = ()) -> str | None:
    """The first failed write of the run's log files (``info.log``'s handler, or a sink with a ``failure``, as
    `mftk.logs.format.MetricsFileSink` has), or None."""
    for h in log.handlers:
        if isinstance(h, FileLogHandler) and h.failure:
            return h.failure
    for s in sinks:
        if getattr(s, "failure", None):
            return s.failure
    return None


def attach_file_log(log_dir: Path) -> logging.Handler:
    """``log_dir/info.log`` in the reference's file format, attached to ``mftk.train``; detach when done."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        h = FileLogHandler(log_dir / "info.log", encoding="utf-8")
    except OSError as exc:
        raise InputError(message=f"cannot write logs to {log_dir}: {exc.strerror or exc}", path=str(log_dir),
                         hint="choose a writable --output-dir") from None
    h.setFormatter(mf_formatter("file"))
    log.addHandler(h)
    return h


def detach(handler: logging.Handler) -> None:
    log.removeHandler(handler)
    handler.close()


def emit_step_line(line: str) -> None:
    """Log the step line as if from the reference's LossCallback (its file path and line number)."""
    record = log.makeRecord(log.name, logging.INFO, LOSS_CALLBACK_FILEPATH, LOSS_CALLBACK_LINENO, line, (), None,
                            func="on_step_end", extra={"filepath": LOSS_CALLBACK_FILEPATH})
    log.handle(record)


def phase_line(name: str, seconds: float) -> None:
    log.info("start-up phase %-18s %.2fs", name + ":", seconds)


class StepLogSink(BaseSink):
    """Logs each step as the reference's line and keeps the losses and norms for the run's result."""

    def __init__(self, total_steps: int) -> None:
        self.total = total_steps
        self.losses: list[float] = []
        self.norms: list[float | None] = []

    def on_step(self, metrics: dict[str, Any]) -> None:
        loss = metrics["loss"]  # None on a non-last pipeline stage, whose line says N/A
        self.losses.append(metrics.get("pipeline_loss") if loss is None else loss)
        self.norms.append(metrics["grad_norm"])
        emit_step_line(format_step_line(metrics, total_steps=self.total))
