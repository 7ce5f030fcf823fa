"""A long log's steps spilled to disk a segment at a time, so `parse-log` holds a fixed number of rows at once.

A reader (`mftk.logs.parse.LogReader`) keeps its steps in a `StepTable` (~36 bytes a step). For a log of any
size that would grow without bound, so once a file's table holds `SEGMENT_ROWS` steps that only go up (one
rank, no resume in it), every row but the last (a skip line may still mark it) is written here as one segment
file and dropped from memory. The analysis (`mftk.logs.stream`) then reads the segments back one at a time.

A segment is an uncompressed ``.npz`` (NumPy arrays only, loaded with ``allow_pickle=False``): each column's
stored values (or its arithmetic pattern, `base + delta * i`, in the metadata), its per-row state bytes where
it has gaps, and the rows' texts (values that were no number) as JSON. It lives in a temporary directory that
is removed when the run is closed or collected.
"""
from __future__ import annotations

import json
import tempfile
from array import array
from pathlib import Path
from typing import Iterator

import numpy as np

from mftk.logs.table import Column, StepTable

# Steps held in memory per file before the oldest are spilled: ~36 MiB of columns for a PyNative step line,
# and the analysis's per-segment arrays (a few float64 columns of this many rows) stay under 100 MiB.
SEGMENT_ROWS = 1 << 20


class Spill:
    """The segments one file spilled, in order; each `write` adds one."""

    def __init__(self) -> None:
        self._dir: tempfile.TemporaryDirectory | None = None
        self.paths: list[Path] = []
        self.rows = 0  # steps spilled, all segments together
        self.last_step: int | None = None

    def write(self, table: StepTable, count: int) -> None:
        """Write the first `count` rows of `table` as the next segment (the caller drops them)."""
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="mftk-parse-log-")
        path = Path(self._dir.name) / f"segment_{len(self.paths):05d}.npz"
        arrays: dict[str, np.ndarray] = {}
        meta: dict = {"n": count, "columns": {}, "texts": {str(i): v for i, v in table.texts.items() if i < count}}
        for j, (key, col) in enumerate(table.columns.items()):
            info = {"kind": col.kind, "base": col.base, "delta": col.delta, "state": col.state is not None}
            if col.data is not None:
                arrays[f"d{j}"] = np.frombuffer(col.data, dtype={"i": np.int32, "q": np.int64,
                                                                 "d": np.float64}[col.data.typecode])[:count]
            if col.state is not None:
                arrays[f"s{j}"] = np.frombuffer(col.state, dtype=np.uint8)[:count]
            meta["columns"][key] = info
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        self.paths.append(path)
        self.rows += count
        self.last_step = int(table.values("step")[count - 1]) if count else self.last_step

    def tables(self) -> Iterator[StepTable]:
        """Each segment back as a table, in order (one in memory at a time)."""
        for path in self.paths:
            yield load(path)

    def column_names(self) -> list[str]:
        """Every segment's columns in first-seen order (read from their metadata only). A column exists only
        once some row had the field, so these are the fields of the spilled steps."""
        names: dict[str, None] = {}
        for path in self.paths:
            with np.load(path, allow_pickle=False) as z:
                names.update(dict.fromkeys(json.loads(bytes(z["meta"]).decode())["columns"]))
        return list(names)

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
        self._dir, self.paths, self.rows, self.last_step = None, [], 0, None


def load(path: Path) -> StepTable:
    """One segment file as a table (its columns stored as they were)."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        table = StepTable()
        table.n = meta["n"]
        for j, (key, info) in enumerate(meta["columns"].items()):
            col = Column(info["kind"], 0)
            col.base, col.delta, col.n = info["base"], info["delta"], table.n
            if f"d{j}" in z:
                data = z[f"d{j}"]
                col.data = array({np.dtype(np.int32): "i", np.dtype(np.int64): "q",
                                  np.dtype(np.float64): "d"}[data.dtype], data.tobytes())
            if info["state"]:
                col.state = bytearray(z[f"s{j}"].tobytes())
            table.columns[key] = col
        table.texts = {int(i): v for i, v in meta["texts"].items()}
    return table
