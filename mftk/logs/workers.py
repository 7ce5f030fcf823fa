"""A large log's 4 MiB windows read by worker processes: the machine's cores share the column path's work.

The reader (`mftk.logs.parse.LogReader`) reads a log a window of `READ_CHUNK` bytes at a time and parses each
window's *body*: from the byte after the last newline before the window to the last newline in it. A body
depends only on the file's bytes, so workers (forked: they inherit the open file and the step-line shape) read
bodies ahead, in order, with the column path (`fastpath.read_chunk`); the reader adds their columns, or reads a
body itself, line by line, where a worker could not (a NUL byte, a terminal escape, an event line, another
shape, a step going back): the same bodies, the same code, the same table as one process gives.

A worker gives up (None) where a body's edges are not where the reader would put them: no newline in the
last `_TAIL` bytes before the window, or a line longer than the reader's limit at its end. The reader then
goes on alone from there. Only large logs use workers (`PARALLEL_MIN_BYTES`), so small ones stay in one process.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator

import attrs

from mftk.logs.fastpath import ChunkRead, FastShape, has_long_line, read_chunk

PARALLEL_MIN_BYTES = 64 << 20  # a log with less left to read than this is read in one process
_TAIL = 64 << 10  # bytes before a window searched for the newline that ends the previous body
_AHEAD = 2  # windows in flight per worker: enough to keep workers busy, few enough to bound memory
_state: dict = {}  # the worker's open file, window size and shape (set once per worker)


@attrs.frozen
class Body:
    """One window's body: bytes [start, end) of the file, and the column path's reading of it (or None)."""

    start: int
    end: int
    read: ChunkRead | None


def worker_count() -> int:
    """Workers to use: the cores this process may run on, at most 2 (each holds a window and its columns)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return min(cores, 2)


def read_bodies(fd: int, windows: range, *, chunk: int, max_line: int, fast: FastShape,
                workers: int) -> Iterator[Body | None]:
    """Each window's body in order, read by `workers` forked processes; None where a worker gave up, and the
    end of the bodies where a worker died (killed for memory, say): the reader goes on alone from there."""
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_init,
                               initargs=(fd, chunk, max_line, fast.pattern, fast.fields, fast.ordered))
    try:
        todo = iter(windows)
        queued: deque = deque(pool.submit(_read_window, k) for k in itertools.islice(todo, workers * _AHEAD))
        while queued:
            try:
                body = queued.popleft().result()
            except BrokenProcessPool:
                return
            k = next(todo, None)
            if k is not None:
                queued.append(pool.submit(_read_window, k))
            yield body
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _init(fd: int, chunk: int, max_line: int, pattern: str, fields: list[tuple[str, type]], ordered: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's to handle: it stops the workers
    _state.update(fd=fd, chunk=chunk, max_line=max_line, fast=FastShape(pattern, fields, ordered))


def _read_window(k: int) -> Body | None:
    """Window k's body: it starts after the last newline before the window, and ends at the last newline in it."""
    fd, chunk = _state["fd"], _state["chunk"]
    low = k * chunk
    back = min(_TAIL, low)
    data = os.pread(fd, chunk + back, low - back)
    if len(data) < chunk + back:  # the file shrank meanwhile: the reader sees to it
        return None
    head = data.rfind(b"\n", 0, back)
    end = data.rfind(b"\n", back) + 1
    if (low and head < 0) or end == 0 or len(data) - end > _state["max_line"]:
        return None
    body = data[head + 1:end]
    read = None
    if b"\0" not in body and b"\x1b" not in body and not has_long_line(body, _state["max_line"]):
        # (NUL runs, escapes and long lines: the reader's own handling)
        read = read_chunk(body.decode("utf-8", errors="replace"), _state["fast"])
    return Body(low - back + head + 1, low - back + end, read)
