"""Balanced loading (resume scenario 4, reference §4.2): which rank reads which shard.

A checkpoint is cut into *read units*: one unique shard of one tensor (``metadata.json``, one
entry per shard index, its first storage entry, as :func:`mftk.ckpt.load.load_global` reads it),
or one whole tensor of a single-card or Hugging Face checkpoint. Every loading rank computes the
same unit list from ``metadata.json`` and the safetensors headers alone (no tensor data), assigns
each unit to exactly one reader with :func:`assign` and reads only its own; the engine then
broadcasts each unit from its reader (``mftk/engine/balanced_load.py``).

:func:`assign` is the longest-processing-time greedy rule: units by size, largest first, each to
the rank that has read the fewest bytes so far. The heaviest and the lightest rank then differ
by at most the largest unit, whatever the sizes.

Pure numpy and file headers: no MindSpore, so ``inspect-ckpt`` can count units and tests run fast.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import attrs
import numpy as np

from mftk.ckpt import safetensors_io as st
from mftk.ckpt.layout import locate, parse_shard_file_name, scan_step_dir
from mftk.ckpt.metadata import read_metadata, shard_slices
from mftk.errors import CheckpointError


@attrs.frozen
class ReadUnit:
    """One piece read from disk by one rank: tensor ``name``'s shard ``index`` in ``file``."""

    name: str
    index: int
    file: Path
    info: st.TensorInfo  # the header entry: dtype, local shape, bytes on disk
    global_shape: tuple[int, ...]
    axis_fragmentations: tuple[int, ...]
    kind: str  # "model" or "opt" ("model" for Hugging Face weights)
    header: st.SafetensorsHeader = attrs.field(eq=False, repr=False)

    @property
    def nbytes(self) -> int:
        """Bytes read from disk."""
        return self.info.nbytes

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype the read returns (BF16 widens to float32, exactly)."""
        if self.info.dtype == "BF16":
            return np.dtype(np.float32)
        np_dtype = st.DTYPES[self.info.dtype][1]
        if np_dtype is None:
            raise CheckpointError(message=f"{self.file}: {self.name} has dtype {self.info.dtype}, which numpy "
                                  "cannot read", path=str(self.file))
        return np.dtype(np_dtype)

    @property
    def out_nbytes(self) -> int:
        """Bytes of the array in memory (what is broadcast)."""
        return self.info.numel * self.dtype.itemsize

    @property
    def region(self) -> tuple[slice, ...]:
        return shard_slices(self.index, self.global_shape, self.axis_fragmentations)


def read_units(path: str | os.PathLike, *, kinds: tuple[str, ...] = ("model", "opt")) -> list[ReadUnit]:
    """Every unique shard of the checkpoint at ``path`` (save root, step dir or HF dir), in a fixed order.

    The order is the one every rank computes identically: ``metadata.json`` order, else sorted files
    (model before opt) in header order.
    """
    loc = locate(path)
    if loc.kind == "file":
        raise CheckpointError(message=f"{path} is a single file; balanced loading needs a checkpoint dir",
                              path=str(path))
    if loc.kind == "hf":
        from mftk.ckpt.load import hf_weight_files

        return _whole_tensor_units([("model", p) for p in hf_weight_files(loc.step_dir)])
    meta = read_metadata(loc.step_dir)
    if meta is None:
        files = scan_step_dir(loc.step_dir)
        paths = [(k, p) for k in kinds for _, p in sorted((files.model if k == "model" else files.opt).items())]
        return _whole_tensor_units(paths)
    headers: dict[str, st.SafetensorsHeader] = {}
    units: list[ReadUnit] = []
    for name, t in meta.items():
        for index, _ in t.chunks:
            if index not in t.storage:
                raise CheckpointError(message=f"{loc.step_dir}: {name} shard {index} has no storage_data entry",
                                      path=str(loc.step_dir), hint="check it with: mftk inspect-ckpt --verify")
            entry = t.storage[index][0]
            parsed = parse_shard_file_name(entry.file_name)
            kind = parsed.kind if parsed else "model"
            if kind not in kinds:
                continue
            if entry.file_name not in headers:
                headers[entry.file_name] = st.read_header(loc.step_dir / entry.file_name)
            h = headers[entry.file_name]
            if name not in h.tensors:
                raise CheckpointError(message=f"{entry.file_name}: no tensor {name!r}, which metadata.json places "
                                      "there", path=str(loc.step_dir / entry.file_name))
            local = tuple(g // f for g, f in zip(t.global_shape, t.axis_fragmentations))
            if tuple(h.tensors[name].shape) != local:  # checked here, on every rank, before any broadcast
                raise CheckpointError(message=f"{entry.file_name}: {name} shard {index} has shape "
                                      f"{list(h.tensors[name].shape)}, metadata.json says {list(local)}",
                                      path=str(loc.step_dir / entry.file_name))
            units.append(ReadUnit(name=name, index=index, file=Path(h.path), info=h.tensors[name],
                                  global_shape=t.global_shape, axis_fragmentations=t.axis_fragmentations,
                                  kind=kind, header=h))
    return units


def _whole_tensor_units(paths: Iterable[tuple[str, Path]]) -> list[ReadUnit]:
    seen: dict[str, Path] = {}
    units: list[ReadUnit] = []
    for kind, p in paths:
        h = st.read_header(p)
        for name, info in h.tensors.items():
            if name in seen:
                raise CheckpointError(message=f"tensor {name!r} is in both {seen[name].name} and {p.name}",
                                      path=str(p), hint="a single-card checkpoint holds each tensor once")
            seen[name] = p
            units.append(ReadUnit(name=name, index=0, file=Path(h.path), info=info, global_shape=info.shape,
                                  axis_fragmentations=(1,) * len(info.shape), kind=kind, header=h))
    return units


def assign(sizes: Sequence[int], world: int) -> tuple[int, ...]:
    """The reader rank of each unit (by bytes): largest first, each to the least loaded rank.

    Deterministic (ties: lower unit index first, then lower rank), so every rank computes the same
    assignment without talking to the others.
    """
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    loads = [0] * world
    readers = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        readers[i] = r
        loads[r] += sizes[i]
    return tuple(readers)


def read_unit(u: ReadUnit) -> np.ndarray:
    """This unit's piece from disk (its local shape)."""
    return st.read_tensors(u.file, [u.name], header=u.header)[u.name]


def place(out: dict[str, np.ndarray], u: ReadUnit, piece: np.ndarray) -> None:
    """Put a piece into its global tensor in ``out`` (created on first use), checking its shape."""
    whole = out.get(u.name)
    if whole is None:
        whole = out[u.name] = np.empty(u.global_shape, dtype=piece.dtype)
    region = u.region
    if whole[region].shape != piece.shape:
        raise CheckpointError(message=f"{u.file.name}: {u.name} shard {u.index} has shape {list(piece.shape)}, "
                              f"metadata.json says {list(whole[region].shape)}", path=str(u.file))
    whole[region] = piece
