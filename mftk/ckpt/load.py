"""Reading checkpoints back as numpy arrays (never pickle).

- :func:`load_rank`: one rank's own files, for a resume with the same world size and layout.
- :func:`load_global`: whole (global) tensors, merging shards through ``metadata.json``; this is
  what a resume with a different layout, an export, or a diff needs.
- :func:`hf_weight_files`: the files of a Hugging Face weights dir (index names checked).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import attrs
import numpy as np

from mftk.ckpt import safetensors_io as st
from mftk.ckpt.common import CommonInfo, read_common
from mftk.ckpt.extra_state import read_extra_state
from mftk.ckpt.layout import HF_INDEX, HF_SINGLE, Located, locate, scan_step_dir
from mftk.ckpt.metadata import read_metadata, safe_file_name, shard_slices
from mftk.errors import CheckpointError
from mftk.files import LARGE_JSON_LIMIT, read_json


@attrs.frozen
class LoadedRank:
    step_dir: Path
    common: CommonInfo
    model: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray] | None
    extra: dict[str, Any] | None  # mftk's extra state; None when absent (e.g. a reference checkpoint)


def load_rank(path: str | os.PathLike, *, rank: int = 0, world: int = 1, optimizer: bool = True) -> LoadedRank:
    """This rank's model (and optimizer) tensors, ``common.json`` and extra state."""
    loc = _mf(locate(path))
    files = scan_step_dir(loc.step_dir)
    if files.problems:
        raise CheckpointError(message=f"{loc.step_dir}: inconsistent rank files", path=str(loc.step_dir),
                              problems=list(files.problems))
    if files.world != world:
        raise CheckpointError(message=f"{loc.step_dir} was saved with world size {files.world}, this run has {world}",
                              path=str(loc.step_dir), hint="load whole tensors with load_global and re-shard them")
    common = read_common(loc.step_dir)
    if rank not in files.model:
        raise CheckpointError(message=f"{loc.step_dir}: no model file for rank {rank}", path=str(loc.step_dir))
    opt = None
    if optimizer:
        if rank not in files.opt:
            raise CheckpointError(message=f"{loc.step_dir}: no optimizer file for rank {rank}", path=str(loc.step_dir),
                                  hint="resume with --weights-only (no_load_optim: true) to start a fresh optimizer")
        opt = st.read_tensors(files.opt[rank])
    return LoadedRank(step_dir=loc.step_dir, common=common, model=st.read_tensors(files.model[rank]),
                      optimizer=opt, extra=read_extra_state(loc.step_dir, rank, world))


def load_global(path: str | os.PathLike, names: Iterable[str] | None = None, *,
                kinds: tuple[str, ...] = ("model", "opt")) -> dict[str, np.ndarray]:
    """Whole tensors by name (all of ``kinds``, or just ``names``)."""
    return dict(iter_global(path, names, kinds=kinds))


def iter_global(path: str | os.PathLike, names: Iterable[str] | None = None, *,
                kinds: tuple[str, ...] = ("model", "opt")) -> Iterator[tuple[str, np.ndarray]]:
    """One whole tensor at a time, so a diff or a NaN scan holds one tensor in memory, not the model."""
    loc = locate(path)
    if loc.kind == "file":
        yield from _iter_files([loc.file], names)
        return
    if loc.kind == "hf":
        yield from _iter_files(hf_weight_files(loc.step_dir), names)
        return
    files = scan_step_dir(loc.step_dir)
    if files.problems:  # e.g. a shard that is a symlink into another step: never read it as this one's
        raise CheckpointError(message=f"{loc.step_dir}: inconsistent rank files", path=str(loc.step_dir),
                              problems=list(files.problems))
    meta = read_metadata(loc.step_dir)
    if meta is None:
        paths = [p for k in kinds for _, p in sorted((files.model if k == "model" else files.opt).items())]
        yield from _iter_files(paths, names)
        return
    wanted = list(meta) if names is None else list(names)
    headers: dict[str, st.SafetensorsHeader] = {}
    for name in wanted:
        if name not in meta:
            raise CheckpointError(message=f"{loc.step_dir}: no tensor {name!r} in metadata.json", path=str(loc.step_dir))
        yield name, _assemble(loc.step_dir, meta[name], headers)


def _assemble(step_dir: Path, t: Any, headers: dict[str, st.SafetensorsHeader]) -> np.ndarray:
    out = None
    for index, _ in t.chunks:
        entry = t.storage[index][0]
        if entry.file_name not in headers:
            headers[entry.file_name] = st.read_header(step_dir / entry.file_name)
        piece = st.read_tensors(step_dir / entry.file_name, [t.name], header=headers[entry.file_name])[t.name]
        if out is None:
            out = np.empty(t.global_shape, dtype=piece.dtype)
        region = shard_slices(index, t.global_shape, t.axis_fragmentations)
        if out[region].shape != piece.shape:
            raise CheckpointError(message=f"{entry.file_name}: {t.name} shard {index} has shape {list(piece.shape)}, "
                                  f"metadata.json says {list(out[region].shape)}", path=str(step_dir))
        out[region] = piece
    return out


def _iter_files(paths: list[Path], names: Iterable[str] | None) -> Iterator[tuple[str, np.ndarray]]:
    """Tensors stored whole across files, yielded in ``names`` order (file order when None)."""
    where: dict[str, st.SafetensorsHeader] = {}
    for p in paths:
        h = st.read_header(p)
        for name in h.tensors:
            if name in where:
                raise CheckpointError(message=f"tensor {name!r} is in both {Path(where[name].path).name} and {p.name}",
                                      path=str(p), hint="a single-card checkpoint holds each tensor once")
            where[name] = h
    wanted = list(where) if names is None else list(names)
    if missing := [n for n in wanted if n not in where]:
        raise CheckpointError(message=f"{len(missing)} tensor(s) not in the checkpoint", problems=missing[:20])
    for name in wanted:
        yield name, st.read_tensors(where[name].path, [name], header=where[name])[name]


def hf_weight_files(d: str | os.PathLike) -> list[Path]:
    """``model.safetensors``, the files named by ``model.safetensors.index.json``, or every ``*.safetensors``."""
    d = Path(d)
    index = d / HF_INDEX
    if os.path.lexists(index):  # a link to a device or a FIFO is read (and refused), not silently skipped
        data = read_json(index, limit=LARGE_JSON_LIMIT, error=CheckpointError, what="index file")
        try:
            weight_map = data["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(message=f"{index}: unreadable index ({exc})", path=str(index)) from None
        bad = [n for n in names if not safe_file_name(n)]
        if bad:
            raise CheckpointError(message=f"{index}: file names outside the dir are never followed", path=str(index),
                                  problems=[repr(n) for n in bad])
        missing = [n for n in names if not (d / n).is_file()]
        if missing:
            raise CheckpointError(message=f"{index}: {len(missing)} referenced file(s) missing", path=str(index),
                                  problems=missing)
        return [d / n for n in names]
    if (d / HF_SINGLE).is_file():
        return [d / HF_SINGLE]
    return sorted(d.glob("*.safetensors"))


def _mf(loc: Located) -> Located:
    if loc.kind != "mf":
        raise CheckpointError(message=f"{loc.given} is not a MindSpore Transformers checkpoint dir ({loc.kind})",
                              path=loc.given, hint="pass the save_path of a run or one of its iteration_* dirs")
    return loc
