"""`Checkpointer`: the one place that decides when a checkpoint is written, and writes it.

Every save goes through ``save(step, reason, collect)``: at the interval (counted from the step the run
started at, as the reference counts it), at the end of training and on a stop signal (both unless this
step is already on disk). ``collect()`` is asked for the tensors only when a save really happens.
Writes are crash-safe (`mftk.ckpt.save`: temp dir → rename → tracker), single- or multi-process (every
rank writes its files, rank 0 publishes, with barriers through ``comm``), and retention is
`Retention`'s (only this run's dirs). ``async_save`` writes single-process saves from one background
thread; a failed save stops the run (unlike the reference, which logs and goes on).
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import attrs

from mftk.ckpt.common import CommonInfo
from mftk.ckpt.layout import iteration_dir_name
from mftk.errors import CheckpointError, TrainingError
from mftk.progress import StepSink

log = logging.getLogger("mftk.train")


class SaveReason(enum.Enum):
    INTERVAL = "interval"  # every save_interleaved_steps
    FINAL = "final"  # training reached training.steps
    SIGNAL = "signal"  # SIGTERM/SIGINT: save, then stop


@attrs.frozen
class Payload:
    """What one rank writes for one step; ``config`` (rank 0) is the run's resolved config as plain data."""

    common: CommonInfo
    model: Mapping[str, Any]
    optimizer: Mapping[str, Any] | None
    extra: dict[str, Any] | None
    config: dict[str, Any] | None = None


class Comm(Protocol):
    """What a multi-process save needs from the process group (the engine's `DistContext` has it)."""

    rank: int
    world: int

    def barrier(self) -> None: ...
    def metadata_specs(self, model: Mapping[str, Any], optimizer: Mapping[str, Any] | None) -> tuple[Any, Any]: ...


@attrs.define
class Checkpointer:
    root: str
    interval: int
    save_max: int | None = 5
    prefix: str | None = "checkpoint"
    save_optim: bool = True
    async_save: bool = False
    comm: Comm | None = None  # None: one process
    start_step: int = 0
    last_saved_step: int | None = None  # a step already on disk (the checkpoint this run resumed from)
    last_path: str = ""
    adapter_manifest: dict | None = None  # save_trainable_only: the LoRA tensors only, and this manifest (2.1 §2.8)
    source_step: int | None = None  # the checkpoint this run resumed from, in ``root``: never replaced, only kept aside
    _retention: Any = None
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def __attrs_post_init__(self) -> None:
        from mftk.ckpt.save import Retention

        self._retention = Retention(self.root, self.save_max)

    @property
    def is_publisher(self) -> bool:
        return self.comm is None or self.comm.rank == 0

    def due(self, step: int) -> bool:
        return step > self.start_step and (step - self.start_step) % self.interval == 0

    def save(self, step: int, reason: SaveReason, collect: Callable[[], Payload], sink: StepSink) -> bool:
        """Write ``step`` if ``reason`` calls for it; True when a save was started."""
        if reason is SaveReason.INTERVAL and not self.due(step):
            return False
        if reason is not SaveReason.INTERVAL and self.last_saved_step == step:
            self.wait()
            return False
        self.wait()
        self.last_saved_step = step
        payload = collect()
        if self.adapter_manifest is not None:
            from mftk.ckpt.names import is_lora_name

            payload = attrs.evolve(payload, model={n: v for n, v in payload.model.items() if is_lora_name(n)})
        if self.async_save and self.comm is None and reason is SaveReason.INTERVAL:  # the last one is synchronous
            self._thread = threading.Thread(target=self._write_async, args=(step, payload, sink),
                                            name=f"mftk-save-{step}", daemon=True)
            self._thread.start()
        else:
            self._write(step, payload, sink)
        if reason is not SaveReason.INTERVAL:
            self.wait()
        return True

    def wait(self) -> None:
        """Join a pending async save; its error, if any, is raised here."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _write_async(self, step: int, payload: Payload, sink: StepSink) -> None:
        try:
            self._write(step, payload, sink)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by wait()
            self._error = exc

    def _write(self, step: int, payload: Payload, sink: StepSink) -> None:
        from mftk.ckpt.save import check_finite, save_checkpoint

        t0 = time.perf_counter()
        try:
            check_finite(step, payload.model, payload.optimizer)  # nothing non-finite is ever published
            if self.comm is not None:
                path = self._write_distributed(step, payload)
            else:
                saved = save_checkpoint(self.root, step=step, prefix=self.prefix, common=payload.common,
                                        model=payload.model, optimizer=payload.optimizer, extra=payload.extra,
                                        config=payload.config, keep_replaced=step == self.source_step)
                path = saved.path
                self._report_kept(step, saved.kept)
            removed = self._retention.record(step) if self.is_publisher else []
        except CheckpointError as exc:
            raise TrainingError(message=f"checkpoint save at step {step} failed: {exc.message}",
                                hint=exc.hint or "check checkpoint.save_path", step=step) from exc
        self.last_path = path
        if self.adapter_manifest is not None and self.is_publisher:
            from mftk.ckpt.lora import write_manifest

            write_manifest((self.root, path), {**self.adapter_manifest, "global_step": step,
                                               "consumed_samples": int(payload.common.consumed_samples or 0)})
        for old in removed:
            log.info("save_max=%d: removed the oldest checkpoint %s", self.save_max, old)
        log.info("Checkpoint saved at step %d to %s (async=%s, remove_redundancy=False) in %.2fs",
                 step, self.root, self.async_save and self.comm is None, time.perf_counter() - t0)
        sink.on_checkpoint(step, path)

    def _report_kept(self, step: int, kept: str) -> None:
        if kept:
            log.warning("step %d was saved again (a changed batch size rescaled the step below the checkpoint this "
                        "run resumed from): that checkpoint is kept as %s", step, kept)

    def _write_distributed(self, step: int, payload: Payload) -> str:
        """Reference order (§3.1): rank 0 prepares the dir → barrier → every rank writes its files →
        barrier → rank 0 writes common.json + metadata.json, publishes, tracker → barrier."""
        from mftk.ckpt.metadata import build_metadata
        from mftk.ckpt.save import begin_save, finalize_save, temp_dir_for, write_rank_files

        c = self.comm
        if c.rank == 0:
            begin_save(self.root, step)
        c.barrier()
        write_rank_files(temp_dir_for(self.root, step), rank=c.rank, world=c.world, step=step, model=payload.model,
                         optimizer=payload.optimizer, extra=payload.extra, prefix=self.prefix)
        c.barrier()
        if c.rank == 0:
            model_specs, opt_specs = c.metadata_specs(payload.model, payload.optimizer)
            meta = build_metadata(model_specs, opt_specs, world=c.world, prefix=self.prefix)
            saved = finalize_save(self.root, step, common=payload.common, world=c.world,
                                  optimizer_saved=payload.optimizer is not None, metadata=meta, config=payload.config,
                                  keep_replaced=step == self.source_step)
            self._report_kept(step, saved.kept)
        c.barrier()
        return str(Path(self.root) / iteration_dir_name(step))
