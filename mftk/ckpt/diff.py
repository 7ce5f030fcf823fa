"""Compare two checkpoints: tensors added, removed, reshaped or re-typed, and (reading data)
the relative change ``||b - a|| / ||a||`` of each tensor present in both with the same shape."""
from __future__ import annotations

import os
from typing import Any

import attrs
import numpy as np

from mftk.ckpt.inspect import CheckpointReport, inspect_checkpoint
from mftk.ckpt.load import iter_global
from mftk.progress import NULL_PROGRESS, Progress


@attrs.frozen
class TensorChange:
    name: str
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    dtype_a: str
    dtype_b: str
    rel_change: float | None = None  # None unless tensors were read (or shapes differ)
    max_abs_change: float | None = None


@attrs.frozen
class CheckpointDiff:
    a: str
    b: str
    step_a: int | None
    step_b: int | None
    added: list[str]  # in b only
    removed: list[str]  # in a only
    reshaped: list[TensorChange]
    retyped: list[TensorChange]
    changes: list[TensorChange]  # same shape, with rel_change when read
    common_a: dict[str, Any] | None
    common_b: dict[str, Any] | None
    tensors_read: bool
    problems: list[str]

    @property
    def identical(self) -> bool:
        return not (self.added or self.removed or self.reshaped or self.retyped) and all(
            c.rel_change in (None, 0.0) for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self) | {"identical": self.identical}


def diff_checkpoints(a: str | os.PathLike, b: str | os.PathLike, *, read_tensors: bool = False,
                     progress: Progress = NULL_PROGRESS) -> CheckpointDiff:
    ra, rb = inspect_checkpoint(a), inspect_checkpoint(b)
    ta, tb = {t.name: t for t in ra.tensors}, {t.name: t for t in rb.tensors}
    both = sorted(ta.keys() & tb.keys())
    reshaped, retyped, same = [], [], []
    for n in both:
        ch = TensorChange(name=n, shape_a=ta[n].shape, shape_b=tb[n].shape, dtype_a=ta[n].dtype, dtype_b=tb[n].dtype)
        if ch.shape_a != ch.shape_b:
            reshaped.append(ch)
        else:
            (retyped if ch.dtype_a != ch.dtype_b else same).append(ch)
    problems = [f"A: {p}" for p in ra.problems] + [f"B: {p}" for p in rb.problems]
    if read_tensors and not problems:
        same = _relative_changes(ra, rb, same, progress)
    return CheckpointDiff(a=str(a), b=str(b), step_a=ra.step, step_b=rb.step,
                          added=sorted(tb.keys() - ta.keys()), removed=sorted(ta.keys() - tb.keys()),
                          reshaped=reshaped, retyped=retyped, changes=same, common_a=ra.common,
                          common_b=rb.common, tensors_read=read_tensors and not problems, problems=problems)


def _relative_changes(ra: CheckpointReport, rb: CheckpointReport, same: list[TensorChange],
                      progress: Progress) -> list[TensorChange]:
    """Walk both checkpoints tensor by tensor (one pair in memory at a time)."""
    names = [c.name for c in same]
    by_name = {c.name: c for c in same}
    src_a, src_b = ra.step_dir or ra.path, rb.step_dir or rb.path
    progress.start("comparing tensors", total=len(names))
    out: dict[str, TensorChange] = {}
    try:
        for (name, xa), (_, xb) in zip(iter_global(src_a, names), iter_global(src_b, names)):
            da, db = xa.astype(np.float64), xb.astype(np.float64)
            delta = np.linalg.norm((db - da).ravel())
            base = np.linalg.norm(da.ravel())
            rel = float(delta / base) if base > 0 else (0.0 if delta == 0 else float("inf"))
            out[name] = attrs.evolve(by_name[name], rel_change=rel,
                                     max_abs_change=float(np.max(np.abs(db - da))) if da.size else 0.0)
            progress.advance(1)
    finally:
        progress.done()
    return [out.get(n, by_name[n]) for n in names]
