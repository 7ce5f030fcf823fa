"""Cutting one input group into N shards, so N machines each preprocess a deterministic 1/N.

The files of a group, in their order, are treated as one stream of bytes cut into N equal
byte ranges; shard K takes every line that *starts* inside its range. A line therefore belongs
to exactly one shard, the shards are contiguous runs of the single-run order, and merging the
N outputs in shard order (``--merge``) gives exactly the ``.bin/.idx`` of one run over all of it.
Small files end up whole in one shard, a large file is cut at line ends. Files that cannot be
entered at a byte offset (gzip, JSON arrays) and empty files go whole to the shard whose
range contains their first byte.
"""
from __future__ import annotations

import bisect
from pathlib import Path
from typing import NamedTuple

from mftk.data.inputs import is_gzip, is_json_array
from mftk.errors import InputError


class Piece(NamedTuple):
    """The lines of ``path`` that start in ``[start, end)`` (``end`` None: to the end of the file)."""

    path: Path
    start: int = 0
    end: int | None = None

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end is None

    def size(self) -> int:
        return (self.path.stat().st_size if self.end is None else self.end) - self.start

    def describe(self) -> str:
        return str(self.path) if self.whole else f"{self.path} (bytes {self.start}-{self.end})"


def check_shard(num_shards: int | None, shard_index: int | None) -> tuple[int, int] | None:
    """(N, K) from the two options, which come together; None when not sharding."""
    if num_shards is None and shard_index is None:
        return None
    if num_shards is None or shard_index is None:
        raise InputError(message="--num-shards and --shard-index go together",
                         hint="e.g. --num-shards 8 --shard-index $SLURM_ARRAY_TASK_ID (0-based)")
    if isinstance(num_shards, bool) or num_shards < 1:
        raise InputError(message=f"--num-shards must be a positive integer, not {num_shards}")
    if isinstance(shard_index, bool) or not 0 <= shard_index < num_shards:
        raise InputError(message=f"--shard-index {shard_index} is outside 0..{num_shards - 1}",
                         hint="shard indices count from 0 to --num-shards minus one")
    return num_shards, shard_index


def shard_name(num_shards: int, shard_index: int) -> str:
    """``shard03of12``: zero-padded so that sorted names are in shard order."""
    width = len(str(num_shards - 1))
    return f"shard{shard_index:0{width}d}of{num_shards}"


def shard_pieces(paths: list[Path], num_shards: int, shard_index: int) -> list[Piece]:
    """The pieces of ``paths`` that shard ``shard_index`` of ``num_shards`` processes, in order."""
    sizes = [p.stat().st_size for p in paths]
    total = sum(sizes)
    bounds = [total * k // num_shards for k in range(num_shards + 1)]
    lo, hi = bounds[shard_index], bounds[shard_index + 1]
    pieces = []
    base = 0
    for path, size in zip(paths, sizes):
        if size == 0 or is_gzip(path) or is_json_array(path):
            if _owner(bounds, base, num_shards) == shard_index:
                pieces.append(Piece(path))
        else:
            a, b = max(lo - base, 0), min(hi - base, size)
            if a < b:
                start, end = _line_start(path, a), _line_start(path, b)
                if start < end:
                    pieces.append(Piece(path, start, None if end == size else end))
        base += size
    return pieces


def _owner(bounds: list[int], offset: int, num_shards: int) -> int:
    """The shard whose range holds byte ``offset`` (the last shard for the very end)."""
    return min(bisect.bisect_right(bounds, offset) - 1, num_shards - 1)


def _line_start(path: Path, offset: int) -> int:
    """The first line start at or after ``offset``: 0, just after a ``\\n``, or the file size."""
    if offset == 0:
        return 0
    with open(path, "rb") as f:
        f.seek(offset - 1)
        pos = offset - 1
        while True:
            block = f.read(1 << 20)
            if not block:
                return pos
            i = block.find(b"\n")
            if i >= 0:
                return pos + i + 1
            pos += len(block)
