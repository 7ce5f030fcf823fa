"""A long log's steps spilled to disk a segment at a time, so `parse-log` holds a fixed number of rows at once.

A reader (`mftk.logs.parse.LogReader`) keeps its steps in a `StepTable` (~36 bytes a step). For a log of any
size that would grow without bound, so once a file's table holds its share of `SEGMENT_ROWS` steps (all the
files of a run together hold at most about that many), the rows are written here, one `Spill` per rank the
file holds, and dropped from memory; the last row stays (a skip line may still mark it), and of ranks
interleaved in one file, the last few steps' lines. Where the step went back
with the logger's clock going on (a resume, not another log appended), the rows before it end one *sequence*
of segments and the rows from it start the next: each sequence's steps only go up, and the analysis
(`mftk.logs.stream`) merges the sequences by step, a later sequence's line winning, as the in-memory series does.

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
        self.sequence = 0  # the current run of steps that only go up; a resume starts the next one
        self.segments: list[tuple[int, int, int]] = []  # (sequence, first step, last step) of each segment
        self.resumes: list[tuple[int, int]] = []  # (step before, step after) where a new sequence started
        self.real_loss = False  # some spilled step logged a real loss (`Run.primary_rank`: not a non-last stage)

    def resume(self, prev: int, step: int) -> None:
        """The steps went back from `prev` to `step` (a resumed run): later segments start a new sequence."""
        self.sequence += 1
        self.resumes.append((prev, step))

    def write(self, table: StepTable, count: int, start: int = 0) -> None:
        """Write rows `start`..`start + count` of `table` as the next segment (the caller drops them)."""
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="mftk-parse-log-")
        path = Path(self._dir.name) / f"segment_{len(self.paths):05d}.npz"
        arrays: dict[str, np.ndarray] = {}
        end = start + count
        meta: dict = {"n": count, "columns": {},
                      "texts": {str(i - start): v for i, v in table.texts.items() if start <= i < end}}
        for j, (key, col) in enumerate(table.columns.items()):
            base = col.base + col.delta * start if col.data is None and col.base is not None else col.base
            info = {"kind": col.kind, "base": base, "delta": col.delta, "state": col.state is not None}
            if col.data is not None:
                arrays[f"d{j}"] = np.frombuffer(col.data, dtype={"i": np.int32, "q": np.int64,
                                                                 "d": np.float64}[col.data.typecode])[start:end]
            if col.state is not None:
                arrays[f"s{j}"] = np.frombuffer(col.state, dtype=np.uint8)[start:end]
            meta["columns"][key] = info
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        self.paths.append(path)
        self.rows += count
        loss = table.values("loss")[start:end]
        self.real_loss = self.real_loss or bool(np.any(table.numeric("loss")[start:end] & ~np.isinf(loss)))
        if count:
            steps = table.values("step")
            self.segments.append((self.sequence, int(steps[start]), int(steps[end - 1])))
            self.last_step = int(steps[end - 1])

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
        self.sequence, self.segments, self.resumes, self.real_loss = 0, [], [], False


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
