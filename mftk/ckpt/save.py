"""Crash-safe checkpoint writing in the reference layout.

Order (a kill at any point leaves the previous checkpoint as the latest valid one):
1. ``begin_save`` (rank 0): make ``<root>/.tmp-iteration_XXXXXXXX/``; no reader ever looks there.
2. ``write_rank_files`` (every rank): model/opt safetensors and the extra-state JSON, each fsynced.
3. ``finalize_save`` (rank 0, after a barrier): ``common.json``, ``metadata.json``, ``mftk-config.json``
   (the run's resolved config, so resume and export know the architecture); check every rank's
   files are there; fsync the dir; rename it to ``iteration_XXXXXXXX``; fsync the root; only then
   replace the tracker atomically.
4. `Retention` (rank 0): ``save_max`` over the dirs *this run* saved; another run's are never touched.
Any OSError (disk full, permissions) removes the temp dir and raises ``CheckpointError``;
unlike the reference, a failed save is never swallowed. ``save_checkpoint`` does all three
for a single process.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

import attrs
import numpy as np

from mftk.ckpt import extra_state, safetensors_io
from mftk.ckpt.common import CommonInfo
from mftk.ckpt.layout import (COMMON, METADATA, RESOLVED_CONFIG, TMP_PREFIX, TRACKER, iteration_dir_name, read_tracker,
                              scan_step_dir, shard_file_name, state_file_name)
from mftk.ckpt.safetensors_io import Bf16
from mftk.errors import CheckpointError

DIR_MODE, FILE_MODE = 0o750, 0o640  # the reference's permissions (§3.1)
Tensors = Mapping[str, "np.ndarray | Bf16"]


@attrs.frozen
class SavedCheckpoint:
    step: int
    path: str
    files: tuple[str, ...]
    bytes: int
    seconds: float = 0.0
    kept: str = ""  # where the dir this save replaced was kept (``keep_replaced``), "" when none was


def temp_dir_for(root: str | os.PathLike, step: int) -> Path:
    """Deterministic so every rank writes into the same temp dir without talking."""
    return Path(root) / f"{TMP_PREFIX}{iteration_dir_name(step)}"


def begin_save(root: str | os.PathLike, step: int) -> Path:
    """Rank 0: a fresh, empty temp dir for ``step`` (a stale one from a killed save is removed)."""
    tmp = temp_dir_for(root, step)
    with _as_checkpoint_error(tmp, "prepare"):
        Path(root).mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(mode=DIR_MODE)
        os.chmod(tmp, DIR_MODE)
    return tmp


def write_rank_files(tmp_dir: str | os.PathLike, *, rank: int, world: int, step: int, model: Tensors,
                     optimizer: Tensors | None = None, extra: dict[str, Any] | None = None,
                     prefix: str | None = "checkpoint") -> int:
    """Every rank: its model file, its opt file (unless ``optimizer`` is None) and its extra state."""
    d = Path(tmp_dir)
    jobs: list[tuple[Path, Any]] = [(d / shard_file_name("model", rank, world, prefix), model)]
    if optimizer is not None:
        jobs.append((d / shard_file_name("opt", rank, world, prefix), optimizer))
    total = 0
    for path, tensors in jobs:
        with _as_checkpoint_error(path, "write"):
            total += safetensors_io.write_file(path, tensors)
            os.chmod(path, FILE_MODE)
    if extra is not None:
        total += _write_text(d / state_file_name(rank, world), extra_state.dumps(extra, step=step, rank=rank, world=world))
    return total


def check_finite(step: int, model: Tensors, optimizer: Tensors | None) -> None:
    """Refuse (CheckpointError) to save tensors holding NaN or infinity: a diverged update must never
    become the latest checkpoint, which ``resume`` would load. Called before a byte is written."""
    bad = non_finite(model) + (non_finite(optimizer) if optimizer is not None else [])
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CheckpointError(message=f"step {step} not saved: {len(bad)} tensor(s) hold NaN or infinity ({shown})",
                              hint="the update diverged; the previous checkpoint is intact: resume from it with a "
                              "lower learning rate or training.max_norm")


def non_finite(tensors: Tensors) -> list[str]:
    """Names of the floating tensors holding a NaN or an infinity, found cheaply: one sum per tensor in its own
    dtype (no temporary array; a NaN or infinity makes the sum non-finite, so a finite sum clears the tensor),
    an exact element-wise check only when the sum is not finite (finite values can overflow it), and the
    exponent bits of bf16 ones. About 35 ms per 256 MiB of float32 here, against 0.2-0.9 s to write it."""
    bad = []
    for name, arr in tensors.items():
        if isinstance(arr, Bf16):
            if np.any((arr.bits & 0x7F80) == 0x7F80):
                bad.append(name)
            continue
        a = np.asarray(arr)
        if a.dtype.kind != "f" or a.size == 0:
            continue
        with np.errstate(over="ignore", invalid="ignore"):  # an overflowing sum is the expected signal
            if not np.isfinite(a.sum()) and not np.isfinite(a).all():
                bad.append(name)
    return bad


def finalize_save(root: str | os.PathLike, step: int, *, common: CommonInfo, world: int = 1,
                  optimizer_saved: bool = True, metadata: dict[str, Any] | None = None,
                  config: dict[str, Any] | None = None, keep_replaced: bool = False) -> SavedCheckpoint:
    """Rank 0, after every rank wrote: publish the dir, then the tracker (pruning is `Retention`'s).

    ``metadata`` (world > 1) comes from :func:`mftk.ckpt.metadata.build_metadata`. ``keep_replaced``: an
    existing dir of the same step is renamed to `kept_name` instead of deleted (it is the checkpoint this run
    resumed from: a changed batch size rescaled the step below it).
    """
    root, tmp = Path(root), temp_dir_for(root, step)
    final = root / iteration_dir_name(step)
    try:
        total = _write_text(tmp / COMMON, common.to_json())
        if world > 1:
            if metadata is None:
                raise CheckpointError(message=f"saving with world {world} needs metadata.json", path=str(tmp))
            total += _write_text(tmp / METADATA, json.dumps(metadata, ensure_ascii=False, indent=2))
        if config is not None:
            total += _write_text(tmp / RESOLVED_CONFIG, json.dumps(config, ensure_ascii=False, indent=1))
        _check_complete(tmp, world, optimizer_saved)
        with _as_checkpoint_error(final, "publish"):
            total += sum(f.stat().st_size for f in tmp.iterdir() if f.name not in (COMMON, METADATA, RESOLVED_CONFIG))
            _fsync_dir(tmp)
            kept = _replace_dir(tmp, final, keep=keep_replaced)
            _fsync_dir(root)
            write_tracker(root, step)
    except BaseException:
        abort_save(root, step)
        raise
    files = tuple(sorted(f.name for f in final.iterdir()))
    return SavedCheckpoint(step=step, path=str(final), files=files, bytes=total, kept=kept)


def abort_save(root: str | os.PathLike, step: int) -> None:
    """Remove a half-written temp dir; the published checkpoints and the tracker are untouched."""
    shutil.rmtree(temp_dir_for(root, step), ignore_errors=True)


def save_checkpoint(root: str | os.PathLike, *, step: int, common: CommonInfo, model: Tensors,
                    optimizer: Tensors | None = None, extra: dict[str, Any] | None = None,
                    prefix: str | None = "checkpoint", config: dict[str, Any] | None = None,
                    keep_replaced: bool = False) -> SavedCheckpoint:
    """Single process (world 1): the whole save. ``optimizer=None`` is ``no_save_optim``; ``keep_replaced``
    as in `finalize_save`."""
    t0 = time.perf_counter()
    tmp = begin_save(root, step)
    try:
        write_rank_files(tmp, rank=0, world=1, step=step, model=model, optimizer=optimizer, extra=extra, prefix=prefix)
    except BaseException:
        abort_save(root, step)
        raise
    saved = finalize_save(root, step, common=common, world=1, optimizer_saved=optimizer is not None, config=config,
                          keep_replaced=keep_replaced)
    return attrs.evolve(saved, seconds=time.perf_counter() - t0)


def write_tracker(root: str | os.PathLike, step: int) -> None:
    """Atomic: temp file, fsync, rename, fsync the dir. Decimal, no trailing newline (§3.1)."""
    root = Path(root)
    tmp = root / f"{TMP_PREFIX}{TRACKER}"
    _write_text(tmp, str(int(step)))
    with _as_checkpoint_error(root / TRACKER, "update"):
        os.replace(tmp, root / TRACKER)
        _fsync_dir(root)


@attrs.define
class Retention:
    """``save_max`` as the reference applies it: over the iteration dirs saved by *this run*, oldest first.

    Dirs that were already under ``save_path`` when the run started (an earlier run's, or the one this
    run resumed from) are never removed, so pointing a new run at an old folder loses nothing. The
    dir just written and the tracker's are always kept. ``save_max`` None or <= 0 keeps everything
    (the reference deletes the checkpoint it just wrote when ``save_max <= 0``). A dir is renamed to a
    hidden name before it is deleted, so a kill mid-delete never leaves a half-deleted dir that looks
    complete; a dir that disappeared meanwhile is forgotten (the reference then stops pruning for good).
    """

    root: str
    save_max: int | None
    saved: list[int] = attrs.field(factory=list)  # steps this run published, oldest first

    def record(self, step: int) -> list[str]:
        """Note that ``step`` was just published; remove this run's oldest dirs beyond ``save_max``."""
        if step in self.saved:
            self.saved.remove(step)
        self.saved.append(step)
        if not self.save_max or self.save_max <= 0:
            return []
        try:
            tracked = read_tracker(self.root)
        except CheckpointError:
            tracked = None
        removed = []
        for victim in [s for s in self.saved if s not in (step, tracked)][:max(0, len(self.saved) - self.save_max)]:
            self.saved.remove(victim)
            path = Path(self.root) / iteration_dir_name(victim)
            if not path.is_dir():
                continue
            doomed = Path(self.root) / f"{TMP_PREFIX}deleting-{path.name}"
            with _as_checkpoint_error(path, "remove old checkpoint"):
                os.rename(path, doomed)
                shutil.rmtree(doomed)
            removed.append(str(path))
        return removed


def _check_complete(tmp: Path, world: int, optimizer_saved: bool) -> None:
    files = scan_step_dir(tmp)
    problems = list(files.problems)
    problems += [f"rank {r}: model file missing" for r in range(world) if r not in files.model]
    if optimizer_saved:
        problems += [f"rank {r}: opt file missing" for r in range(world) if r not in files.opt]
    if files.world not in (0, world):
        problems.append(f"files are for world {files.world}, expected {world}")
    if problems:
        raise CheckpointError(message=f"checkpoint in {tmp} is incomplete; not published", path=str(tmp),
                              problems=problems, hint="a rank failed to write its files; see its log")


def kept_name(final: Path) -> Path:
    """Where a replaced dir that must be kept goes: ``iteration_00000004.resume-source`` (``-2``, ``-3``... when
    taken). Not an ``iteration_*`` name, so no tracker, retention or fallback ever treats it as this run's; a
    resume can still be pointed at it with ``--from``."""
    base = final.with_name(f"{final.name}.resume-source")
    n, path = 1, base
    while os.path.lexists(path):
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _replace_dir(tmp: Path, final: Path, keep: bool = False) -> str:
    """Rename into place; an existing dir for the same step is moved aside first, then deleted (or, with
    ``keep``, left under `kept_name`, whose path is returned)."""
    old = None
    if final.exists():
        old = kept_name(final) if keep else final.with_name(f"{TMP_PREFIX}replaced-{final.name}")
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None and not keep:
        shutil.rmtree(old, ignore_errors=True)
    return str(old) if keep and old is not None else ""


def _write_text(path: Path, text: str) -> int:
    data = text.encode("utf-8")
    with _as_checkpoint_error(path, "write"):
        with open(path, "wb") as fh:
            safetensors_io.write_all(fh, data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(path, FILE_MODE)
    return len(data)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _as_checkpoint_error:
    """Turn an OSError into a CheckpointError naming the file, the action and the cause; remove a partial file."""

    def __init__(self, path: Path, action: str) -> None:
        self.path, self.action = Path(path), action

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not isinstance(exc, OSError):
            return False
        if self.action == "write" and self.path.is_file():
            self.path.unlink(missing_ok=True)
        hint = ("free disk space (or point checkpoint.save_path elsewhere); the previous checkpoint is intact"
                if exc.errno in (errno.ENOSPC, errno.EDQUOT) else
                "check that checkpoint.save_path is writable; the previous checkpoint is intact")
        raise CheckpointError(message=f"cannot {self.action} {self.path}: {exc.strerror or exc}",
                              path=str(self.path), hint=hint) from exc
