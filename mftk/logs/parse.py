"""Read training logs into step records: one format per file, detected or forced, ranks merged.

A step record is a plain dict keyed by the field names of the MindSpore Transformers PyNative
line (`step`, `loss`, `per_step_time`, `lr`, `grad_norm`, `throughput`, ...) plus `rank`.
Other formats are renamed into those names (`global_norm` -> `grad_norm`, Megatron's
`lm loss` -> `loss`), so one summary, anomaly pass and plot serve every format.

Lines that are not step lines are ignored; lines that look like step lines but cannot be read
are counted (and a few kept as examples), never fatal. `LogReader` reads incrementally, so the
same code serves a one-shot parse and `--follow` on a growing log.
"""
from __future__ import annotations

import os
import re
from array import array
from pathlib import Path
from typing import Any, Callable

import attrs
import numpy as np

from mftk.errors import DataFormatError, InputError
from mftk.files import open_regular
from mftk.logs.fastpath import ChunkRead, FastShape, has_long_line, read_chunk, shape_of
from mftk.logs.format import read_fields, parse_metrics_record, parse_number, parse_step_line
from mftk.logs import workers
from mftk.logs import ranks as rank_split
from mftk.logs.ranks import SpillPlan, occurrence_ranks, split_interleaved, spill_plan
from mftk.logs.spill import SEGMENT_ROWS, Spill
from mftk.logs.table import StepTable, TableView, as_table
from mftk.logs.workers import worker_count

FORMATS = ("auto", "mindformers", "megatron", "mftk")
_EXPECTED = ("MindSpore Transformers `{ step:[n/N], ... loss: ..., per_step_time: ...ms, ... }` "
             "or static-graph `{ Epoch:[..], step:[..], ... }` lines, Megatron-LM `iteration n/N | ...` "
             "lines, or mftk JSON-lines metrics")
_MAX_EXAMPLES = 5

# ---------------------------------------------------------------- line grammars

# Static-graph MFLossMonitor lines, every shape since 2023 (mindformers/core/callback/callback.py,
# `print_output_info`): r0.6-r1.x `Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.3f/%5.3f], time:%5.3f ms,
# lr:%s, overflow cond: %s, loss_scale: %s` (no braces; behind the file logger's `print_output_info: ` or the
# console's `- mindformers - INFO - `); r1.3-2.1.0 `{ Epoch:[%3d/%3d], step:[%5d/%5d], loss: %5.6f, ...
# per_step_time: %dms, lr: %s, overflow cond: %s, loss_scale: %s, global_norm: %s[, train_throughput_per_npu:
# %.3fT]` (non-sink mode: `loss:[%5.6f/%5.6f]`); and the form MF's monitor tests print, `{Epoch:[  1],
# step:[  10/ 100], loss: 2.5, ...}` (an epoch without a total).
_STATIC_HEAD = re.compile(r"\{?\s*Epoch:\[\s*(\d+)(?:/\s*(\d+))?\],\s*step:\[\s*(\d+)/\s*(\d+)\],?")
_STATIC_RENAME = {"global_norm": "grad_norm", "train_throughput_per_npu": "throughput", "time": "per_step_time"}


def parse_static_line(line: str) -> dict[str, Any] | None:
    """The static-graph MFLossMonitor line; `step` is made global from epoch and step."""
    start = line.find("Epoch:[")
    if start < 0:
        return None
    m = _STATIC_HEAD.search(line, max(start - 8, 0))
    if m is None:
        raise ValueError("epoch/step counters are not `[n/N]`")
    epoch, epochs, step, per_epoch = (None if g is None else int(g) for g in m.groups())
    record: dict[str, Any] = {"step": (epoch - 1) * per_epoch + step, "epoch": epoch}
    if epochs is not None:
        record["total_steps"] = epochs * per_epoch
    body = line[m.end():].rstrip().removesuffix("}").replace("global_norm [", "global_norm: [")
    read_fields(body, record)
    for old, new in _STATIC_RENAME.items():
        if old in record:
            record[new] = record.pop(old)
    if "loss" not in record:
        raise ValueError("no `loss:` field")
    return record


_MEG_HEAD = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|")
_MEG_RENAME = {
    "consumed_samples": "consumed_samples", "consumed_tokens": "consumed_tokens",
    "elapsed_time_per_iteration_ms": "per_step_time", "throughput_per_gpu_tflop_s_gpu": "throughput",
    "learning_rate": "lr", "global_batch_size": "global_batch_size", "lm_loss": "loss",
    "loss_scale": "loss_scale", "grad_norm": "grad_norm", "number_of_skipped_iterations": "skipped_iterations",
    "number_of_nan_iterations": "nan_iterations",
}


def parse_megatron_line(line: str) -> dict[str, Any] | None:
    """Megatron-LM's `iteration n/N | key: value | ...` training log line."""
    if "iteration" not in line or "|" not in line:
        return None
    m = _MEG_HEAD.search(line)
    if m is None:
        return None
    record: dict[str, Any] = {"step": int(m.group(1)), "total_steps": int(m.group(2))}
    for part in line[m.end():].split("|"):
        name, sep, value = part.partition(":")
        if not sep:
            continue
        key = re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")
        record[_MEG_RENAME.get(key, key)] = parse_number(value)
    return record


def _parse_mindformers(line: str) -> dict[str, Any] | None:
    if "{ step:[" in line:
        return parse_step_line(line)
    if "Epoch:[" in line:
        return parse_static_line(line)
    return None


def _parse_mftk(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    return parse_metrics_record(line)


PARSERS: dict[str, Callable[[str], dict[str, Any] | None]] = {
    "mindformers": _parse_mindformers,
    "megatron": parse_megatron_line,
    "mftk": _parse_mftk,
}


# ---------------------------------------------------------------- one file, read incrementally

@attrs.define
class FileSummary:
    """What was read from one file: its format, rank, and how many lines were usable."""

    path: str
    format: str
    rank: int
    lines: int = 0
    records: int = 0
    malformed: int = 0
    examples: list[str] = attrs.field(factory=list)  # "line N: reason: text" for malformed lines
    nul_bytes: int = 0  # NUL bytes skipped (the zero-filled tail a crash leaves in a log)
    long_lines: int = 0  # lines over MAX_LINE_BYTES, skipped
    interleaved: int = 0  # > 1: this many ranks' step lines were interleaved in the file
    truncations: int = 0  # times the file shrank while followed (its earlier lines were dropped)
    rotations: int = 0  # times the path was replaced by a new file while followed (old file read to its end)
    concatenated: list[str] = attrs.field(factory=list)  # "line N: ..." where another log was appended
    stop: str | None = None  # "line N: ..." an exception or stop message after the last step line


_RANK_IN_PATH = (re.compile(r"worker_(\d+)\.log"), re.compile(r"rank_(\d+)"))
READ_CHUNK = 4 << 20  # bytes read at a time: memory stays bounded whatever the log's size
MAX_LINE_BYTES = 1 << 20  # no log line is this long; longer ones are skipped (and counted)
# The zero-filled blocks a crashed writer leaves (the file grew, its data never reached the disk): a run of
# NUL bytes at the end of what was read, one that fills whole lines, or a long one. Short NUL runs among
# other bytes are what binary files (.idx, .bin, safetensors) look like.
_HOLE = rb"\x00{512,}|(?:^|(?<=\n))\x00+(?=\n|\Z)"
_NUL_RUN = re.compile(_HOLE + rb"|\x00+\Z")
_NUL_RUN_INSIDE = re.compile(_HOLE.replace(rb"|\Z", rb""))  # for a window that is not the end of the data
# Terminal escapes (colour, cursor) that a coloured logger or `script`/`tee` of a console leaves in a log:
# CSI `ESC [ ... final`, OSC `ESC ] ... BEL|ST`, and two-byte escapes.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# The logger prefix's time (Python logging's `YYYY-MM-DD HH:MM:SS,mmm`; ISO `T` and `.` accepted).
_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[,.](\d{1,6}))?")
# The last line of a Python traceback, or MF's own "…, stop training..." (callback.py, skip-data and
# global-norm checks): after the last step line, it is why the run stopped.
_STOP = re.compile(r"(?:^|[\s:])((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt)): (.*)|(.*stop training.*)")
_MAX_BACK_STEPS = 1000  # step-went-back points remembered per file (a resume or two, or another log appended)
_MIN_SEGMENT = 4096  # a file's share of `SEGMENT_ROWS` is at least this many rows (a run of very many files)
_PROBE_ROWS = 4096  # rows read before a long file is probed for interleaved ranks


def rank_from_path(path: Path) -> int | None:
    """msrun names worker logs `worker_N.log`; MF's own log files sit under `rank_N/`."""
    text = path.as_posix()
    for pattern in _RANK_IN_PATH:
        found = pattern.findall(text)
        if found:
            return int(found[-1])
    return None


class LogReader:
    """Reads the complete lines appended to one log since the last call.

    The file is read in chunks (bounded memory); runs of NUL bytes where a line would start are
    skipped and counted (a crashed writer leaves a zero-filled tail, which is not a binary file);
    terminal escapes are stripped. The file stays open between calls (as `tail -F` does): a file that
    shrank was truncated, and is read again from the start (`restarted` tells the caller to drop what
    it kept from the earlier content); a path that now names another file (inode) was rotated
    (`mv f.log f.log.1`, a new f.log): the old file is read to its end, then the new one from its start.
    """

    def __init__(self, path: Path, *, fmt: str = "auto", rank: int = 0) -> None:
        self.path = Path(path)
        self.summary = FileSummary(path=str(path), format=fmt, rank=rank)
        self._offset = 0
        self._pending = b""
        self._skipping = False  # inside a line longer than MAX_LINE_BYTES
        self._file: Any = None
        self.table = StepTable()  # every step read from this file (since it was last truncated)
        self._last: dict[str, Any] | int | None = None  # the last step read, as a pending record or a table row
        self._last_step: int | None = None
        self._last_line = ""
        self._fast: FastShape | None = None  # the file's step-line shape, read a chunk at a time
        self._worker_tries = 0  # times worker processes were started for this file
        self.back_steps: list[tuple[int, bool]] = []  # (record index, timestamps went back) where step went back
        self.restarted = False
        self.spills: dict[int, Spill] = {}  # the rows written to disk, by rank (`enable_spill`)
        self._spill_rows = 0  # rows held before the oldest are spilled; 0: never
        self._spilled = 0  # rows spilled since the file was last truncated
        self.rank_base = rank  # the rank of the first row held (appended logs move it on)
        self.interleaved = 0  # R, once a spill found R ranks interleaved in this file
        self.appended: list[str] = []  # where another log was appended, in rows already spilled
        self.held_why: str | None = None  # why the rows held could not be spilled (then no spill is tried again)
        self._probed = False  # looked for interleaved ranks on the first rows (`_probe_interleaved`)

    def enable_spill(self, share: int = 1) -> None:
        """Spill the oldest steps to disk whenever the table holds `SEGMENT_ROWS / share` (the files of one run
        share the bound; see `mftk.logs.spill`)."""
        self._spill_rows = max(SEGMENT_ROWS // max(share, 1), min(_MIN_SEGMENT, SEGMENT_ROWS))

    def _maybe_spill(self) -> None:
        """Write the rows held to disk when the table is full: each rank's rows (`mftk.logs.ranks`) to its
        `Spill`, a resume (the step went back, the clock did not) starting a new sequence there. The last row
        stays (a skip line may still mark it), and of interleaved ranks the last few steps. Rows whose ranks
        cannot be told apart yet stay held (`held_why`)."""
        table = self.table
        if self._spill_rows and not self._probed and table.n >= min(_PROBE_ROWS, self._spill_rows):
            self._probe_interleaved()
        if not self._spill_rows or table.n < self._spill_rows or self._last != table.n - 1:
            return
        steps = table.values("step").astype(np.int64)
        back = [(index - self._spilled, clock) for index, clock in self.back_steps]
        plan = spill_plan(steps, back, base=self.rank_base, interleaved=self.interleaved, summary=self.summary,
                          max_back=_MAX_BACK_STEPS)
        if plan is None:  # interleaved ranks, no step complete yet: try again when more are read
            return
        if isinstance(plan, str) or not self._spill_by_rank(table, steps, plan):
            self.held_why = plan if isinstance(plan, str) else "a rank's steps in lockstep went back"
            self._spill_rows = 0  # the rows held stay so: not tried again at every read
            return
        self.appended += [f"step {steps[i - 1]} -> {steps[i]} with the time going back: read from there as rank "
                          f"{plan.ranks[i]}" for i in plan.appended]
        self.interleaved, self.rank_base = plan.interleaved, int(plan.ranks[plan.keep])
        if self.interleaved and self._fast is not None and self._fast.ordered:  # the column path reads them on
            self._fast = FastShape(self._fast.pattern, self._fast.fields, ordered=False)
        self.table = table.take(np.arange(plan.keep, table.n))
        self._spilled += plan.keep
        self._last = self.table.n - 1
        self.back_steps = [(i, c) for i, c in self.back_steps if i >= self._spilled]

    def _probe_interleaved(self) -> None:
        """Once, on a long file's first rows: ranks interleaved in lockstep are read on by the column path
        (`FastShape.ordered` False), which otherwise leaves every chunk whose steps go back to the line reader."""
        self._probed = True
        if self._fast is None or len(self.back_steps) <= rank_split.MAX_SPILL_RESUMES:
            return
        probe = FileSummary(path=self.summary.path, format=self.summary.format, rank=self.summary.rank)
        if split_interleaved([int(x) for x in self.table.values("step").tolist()], probe) is not None:
            self._fast = FastShape(self._fast.pattern, self._fast.fields, ordered=False)

    def _spill_by_rank(self, table: StepTable, steps: np.ndarray, plan: SpillPlan) -> bool:
        """Write each rank's rows before `plan.keep`; False (nothing written) when a rank's rows go back where
        that cannot be a resume, or too often."""
        pieces = []
        for rank in dict.fromkeys(plan.ranks[:plan.keep].tolist()):
            rows = np.nonzero(plan.ranks == rank)[0]
            starts = np.nonzero(np.diff(steps[rows]) <= 0)[0] + 1  # where a new sequence starts
            if len(starts) and (plan.interleaved or len(starts) > rank_split.MAX_SPILL_RESUMES):
                return False
            pieces.append((rank, rows, starts))
        for rank, rows, starts in pieces:
            spill = self.spills.setdefault(rank, Spill())
            for a, b in zip([0, *starts.tolist()], [*starts.tolist(), len(rows)]):
                if a:
                    spill.resume(int(steps[rows[a - 1]]), int(steps[rows[a]]))
                part = rows[a:b][rows[a:b] < plan.keep]
                if len(part) and part[-1] - part[0] + 1 == len(part) and table.constant("rank") == rank:
                    spill.write(table, len(part), start=int(part[0]))  # rows as they are: no copy
                elif len(part):
                    piece = table.take(part)
                    piece.set_constant("rank", rank)
                    spill.write(piece, piece.n)
        return True

    @property
    def rows_read(self) -> int:
        """Steps read since the file was last truncated: those spilled and those held."""
        return self._spilled + self.table.n

    def read_new(self, *, final: bool = True) -> range:
        """Parse new complete lines into `self.table`; with `final`, a last line without newline counts too
        (and the file is closed). Returns the rows added, numbered from the file's first (after a truncation,
        `restarted`: all of them)."""
        self.restarted = False
        start = self.rows_read
        try:
            if self._file is None:
                self._file = self._open()
            self._drain()
            if self._replaced():  # rotated: the old file was read to its end above
                self._file.close()
                self._feed(b"", last=True)
                self._file, self._offset = self._open(), 0
                self.summary.rotations += 1
                self._drain()
        except FileNotFoundError:
            self.close()
            raise InputError(message=f"cannot read log {self.path}: it no longer exists", path=str(self.path),
                             hint="check the path") from None
        except OSError as exc:
            self.close()
            raise InputError(message=f"cannot read log {self.path}: {exc.strerror or exc}", path=str(self.path),
                             hint="check the path and its permissions") from None
        if final:
            self._feed(b"", last=True)
            self.close()
        return range(0 if self.restarted else start, self.rows_read)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> Any:
        return open_regular(self.path, what="log file", hint="pass the training log file or its directory")

    def _replaced(self) -> bool:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:  # moved away, the new file not created yet: keep the old one
            return False
        was = os.fstat(self._file.fileno())
        return (now.st_ino, now.st_dev) != (was.st_ino, was.st_dev)

    def _drain(self) -> None:
        f = self._file
        if os.fstat(f.fileno()).st_size < self._offset:  # truncated: start over
            self._start_over()
        f.seek(self._offset)
        while chunk := f.read(READ_CHUNK):
            if self._offset == 0:
                _reject_binary(self.path, chunk)
            self._offset += len(chunk)
            self._feed(chunk, last=False)
            if self._workers_help():
                self._read_with_workers()
                f.seek(self._offset)

    def _workers_help(self) -> bool:
        """Whether to read on with worker processes: a large log left to read, its step-line shape known, and
        the reader between whole windows (a few times at most: each try forks the workers)."""
        if (self._fast is None or self._skipping or self._offset % READ_CHUNK or self._worker_tries >= 3
                or worker_count() < 2):
            return False
        return os.fstat(self._file.fileno()).st_size - self._offset >= workers.PARALLEL_MIN_BYTES

    def _read_with_workers(self) -> None:
        """Read the log's whole windows left with workers (mftk.logs.workers), adding their columns in order;
        a body a worker could not read is read here, line by line. Leaves the reader as reading alone would."""
        self._worker_tries += 1
        fd = self._file.fileno()
        start = self._offset - len(self._pending)  # where the next body starts
        windows = range(self._offset // READ_CHUNK, os.fstat(fd).st_size // READ_CHUNK)
        bodies = workers.read_bodies(fd, windows, chunk=READ_CHUNK, max_line=MAX_LINE_BYTES, fast=self._fast,
                                     workers=worker_count())
        try:
            for k, body in zip(windows, bodies):
                if body is None or body.start != start:
                    break
                if body.read is None or not self._take(body.read):
                    self._feed_body(os.pread(fd, body.end - body.start, body.start))
                start, self._offset = body.end, (k + 1) * READ_CHUNK
                self._maybe_spill()
        finally:
            bodies.close()
        self._pending = os.pread(fd, self._offset - start, start)

    def _start_over(self) -> None:
        fmt = self.summary.format if self.summary.format in PARSERS else "auto"
        self.summary = FileSummary(path=self.summary.path, format=fmt, rank=self.summary.rank,
                                   truncations=self.summary.truncations + 1, rotations=self.summary.rotations)
        self._offset, self._pending, self._skipping, self.restarted = 0, b"", False, True
        self._last, self._last_step, self._last_line, self.back_steps = None, None, "", []
        self.table, self._fast = StepTable(), None
        for spill in self.spills.values():
            spill.close()
        self.spills, self._spilled, self.rank_base = {}, 0, self.summary.rank
        self.interleaved, self.appended, self.held_why, self._probed = 0, [], None, False

    def _feed(self, chunk: bytes, *, last: bool) -> None:
        data = self._pending + chunk
        cut = len(data) if last else data.rfind(b"\n") + 1
        body, self._pending = data[:cut], data[cut:]
        if self._skipping and body:  # the rest of a long line read before
            newline = body.find(b"\n")
            body = body[newline + 1:] if newline >= 0 else b""
            self._skipping = newline < 0 and not last
        if len(self._pending) > MAX_LINE_BYTES:  # a line with no end in sight: skip to its newline
            self.summary.long_lines += not self._skipping  # once per line, however many chunks it spans
            self._pending, self._skipping = b"", True
        self._feed_body(body)

    def _feed_body(self, body: bytes) -> None:
        """Parse complete lines: a column at a time where the chunk allows, else line by line."""
        if b"\0" in body:
            kept = _NUL_RUN.sub(b"", body)
            self.summary.nul_bytes += len(body) - len(kept)
            body = kept
        text = body.decode("utf-8", errors="replace")
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        if self._fast is None and len(text) > _SHAPE_PROBE:  # learn the shape on the chunk's head
            cut = text.find("\n", _SHAPE_PROBE) + 1 or len(text)
            self._parse_text(text[:cut])
            text = text[cut:]
        if not (self._fast is not None and not has_long_line(body, MAX_LINE_BYTES) and self._parse_fast(text)):
            self._parse_text(text)  # (the line reader counts and skips a long line)
        self._maybe_spill()

    def _parse_fast(self, text: str) -> bool:
        """Read a chunk whose step lines all have the file's shape, a column at a time (no dict per line).

        Only when nothing in it needs the line-by-line reader: every step line matches, steps only go up,
        no skip, exception or stop line. Otherwise the caller reads it line by line."""
        got = read_chunk(text, self._fast)
        return got is not None and self._take(got)

    def _take(self, got: ChunkRead) -> bool:
        """Add a chunk read by the column path, unless its steps do not go on from the last one (a resume or
        another log: the line reader looks at the timestamps)."""
        summary = self.summary
        if got.count and self._last_step is not None and got.first_step <= self._last_step and self._fast.ordered:
            return False
        if got.count:
            got.cols["rank"] = _repeat(summary.rank, got.count)
            self.table.append_columns(got.count, got.cols)
            self._last, self._last_step, summary.stop = self.table.n - 1, got.last_step, None
            self._last_line = got.last_line
        summary.lines += got.lines
        summary.records += got.count
        return True

    def _parse_text(self, text: str) -> None:
        out: list[dict[str, Any]] = []
        summary = self.summary
        lineno = summary.lines
        parsers = list(PARSERS.items()) if summary.format == "auto" else [(summary.format, PARSERS[summary.format])]
        for line in text.splitlines():
            lineno += 1
            if len(line) > MAX_LINE_BYTES:
                summary.long_lines += 1
                continue
            for name, parse in parsers:
                try:
                    record = parse(line)
                except (ValueError, IndexError) as exc:
                    summary.malformed += 1
                    if len(summary.examples) < _MAX_EXAMPLES:
                        summary.examples.append(f"line {lineno}: {exc}: {line.strip()[:160]}")
                    break
                if record is None:
                    continue
                if len(parsers) > 1:  # lock onto the first format found: faster, and no cross-talk
                    summary.format, parsers = name, [(name, parse)]
                record.setdefault("rank", summary.rank)
                if self._last_step is not None and record["step"] <= self._last_step:
                    self._went_back(summary.records + len(out), line)
                out.append(record)
                self._last, self._last_step, self._last_line, summary.stop = record, record["step"], line, None
                if self._fast is None and name == "mindformers":
                    self._fast = shape_of(line)
                break
            else:
                if self._last is not None or summary.records:
                    self._event(line, lineno)
        summary.lines = lineno
        summary.records += len(out)
        self.table.append_records(out)
        if out and self._last is out[-1]:
            self._last = self.table.n - 1

    def _went_back(self, index: int, line: str) -> None:
        """Remember where the step went back, and whether the logger's clock did too: a resumed run logs
        later than the lines it replaces; another rank's log appended to this one (`cat`) starts earlier."""
        if len(self.back_steps) < _MAX_BACK_STEPS:
            before, now = _stamp(self._last_line), _stamp(line)
            self.back_steps.append((index, before is not None and now is not None and now < before))

    def _event(self, line: str, lineno: int) -> None:
        """Lines after a step line that say something about it: MF's skip-data line (`opt_global_step: N,
        skip_data_grad_norm_threshold: T, is_skip: [ True]`, callback.py) marks the step before it skipped;
        an exception or `stop training` message is kept until another step line follows it."""
        if "is_skip:" in line and self._last is not None:
            try:
                skipped = parse_number(line.rsplit("is_skip:", 1)[1])
            except ValueError:
                skipped = None
            if skipped and isinstance(self._last, dict):
                self._last["is_skip"] = 1
            elif skipped:
                self.table.set(self._last, "is_skip", 1)
            return
        if ("Error" in line or "Exception" in line or "stop training" in line or "Interrupt" in line) \
                and (m := _STOP.search(line)):
            self.summary.stop = f"line {lineno}: {(m.group(1) + ': ' + m.group(2)) if m.group(1) else m.group(3)}"[:240].strip()


_SHAPE_PROBE = 1 << 16  # bytes of a chunk read line by line before its step-line shape is known


def _repeat(value: int, count: int) -> array:
    return array("q", [value]) * count


def _stamp(line: str) -> str | None:
    """The line's logger time as a sortable string (ISO date, time, fraction padded), or None."""
    m = _STAMP.search(line)
    if m is None:
        return None
    return f"{m.group(1)} {m.group(2)}.{(m.group(3) or '').ljust(6, '0')}"


def _reject_binary(path: Path, head: bytes) -> None:
    if head[:2] == b"\x1f\x8b":
        raise DataFormatError(message=f"{path} is gzip-compressed, not a text log", path=str(path),
                              expected="text log", found="gzip data",
                              hint=f"decompress it first: gunzip -k {path}")
    window = head[:8192]
    holes = _NUL_RUN if len(head) <= len(window) else _NUL_RUN_INSIDE
    nul = holes.sub(lambda m: b"\n" * len(m.group()), window).find(b"\0")  # a crash's zero-filled holes are fine
    if nul >= 0:
        raise DataFormatError(message=f"{path} looks like a binary file (NUL byte at offset {nul}), not a text log",
                              path=str(path), offset=nul, expected="text log", found="binary data",
                              hint="pass the training log (msrun's worker_N.log, or rank_N/info.log), not a data "
                                   "or checkpoint file")


def split_concatenated(steps: list[int], reader: LogReader) -> list[int] | None:
    """The rank of each of the rows `reader` holds when whole logs were appended into its file, else None: a
    new rank from each point where the step and the logger's clock both went back. That is `cat worker_0.log
    worker_1.log` (each rank's log starts when the job starts, long before the first one ends), never a
    resume (whose lines are logged after those they replace). Without timestamps the two cannot be told
    apart, and a step going back stays a resume. Points in rows already spilled were noted then."""
    summary = reader.summary
    cuts = [index - reader._spilled for index, clock_back in reader.back_steps
            if clock_back and 0 < index - reader._spilled < len(steps)]
    summary.concatenated = list(reader.appended)
    if not cuts:
        return None
    out = rank_split.concatenated_ranks(len(steps), cuts, reader.rank_base)
    summary.concatenated += [f"step {steps[c - 1]} -> {steps[c]} with the time going back: read from there as "
                             f"rank {out[c]}" for c in cuts]
    return out.tolist()


def split_ranks(reader: LogReader) -> StepTable:
    """The table `reader` holds, its `rank` column telling apart the ranks whose lines share the file:
    interleaved lines, or whole logs appended one after another (`mftk.logs.ranks`). Steps that only go up
    need neither. What an earlier spill found (R interleaved ranks, appended logs) holds for the rest."""
    table = reader.table
    summary = reader.summary
    summary.interleaved, summary.concatenated = reader.interleaved, list(reader.appended)
    ranks = None
    if reader.interleaved:
        ranks = occurrence_ranks(table.values("step").astype(np.int64), summary.rank).tolist()
    elif not table.increasing("step"):
        as_list = [int(x) for x in table.values("step").tolist()]
        ranks = None if reader._spilled else split_interleaved(as_list, summary)
        if ranks is None:
            ranks = split_concatenated(as_list, reader)
    if ranks is None:
        table.set_constant("rank", reader.rank_base)
    else:
        table.set_column("rank", np.asarray(ranks))
    return table


# ---------------------------------------------------------------- a run: one or more files

@attrs.define
class Run:
    """Every record read for one run (all ranks), in file order, and per-file accounting."""

    name: str
    files: list[FileSummary]
    records: StepTable = attrs.field(converter=lambda r: as_table(r))
    warnings: list[str] = attrs.field(factory=list)
    spills: dict[int, list[Spill]] = attrs.field(factory=dict)  # by rank, each file's steps spilled before `records`
    held: list[str] = attrs.field(factory=list)  # why steps past a segment stay in memory (`held_in_memory`)
    _series: dict[int, TableView] | None = attrs.field(default=None, init=False, repr=False, eq=False)

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self._by_rank()) | set(self.spills))

    @property
    def spilled(self) -> bool:
        """Whether some steps are on disk (`spills`): the run is analyzed a segment at a time (`mftk.logs.stream`)."""
        return bool(self.spills)

    def series(self, rank: int) -> TableView:
        """One rank's records by step; after a resume (step going back) the later line wins."""
        found = self._by_rank().get(rank)
        return found if found is not None else TableView(self.records, np.zeros(0, dtype=np.int64))

    def _by_rank(self) -> dict[int, TableView]:
        if self._series is None:  # computed once: records are complete when a Run is built
            only = self.records.constant("rank")
            if only is not None and self.records.increasing("step"):  # one rank, never went back: as read
                self._series = {int(only): TableView(self.records, None)} if self.records.n else {}
                return self._series
            ranks = self.records.values("rank").astype(np.int64)
            steps = self.records.values("step")
            self._series = {}
            for rank in np.unique(ranks).tolist():
                rows = np.nonzero(ranks == rank)[0][::-1]  # newest first: np.unique keeps the first of each
                _, first = np.unique(steps[rows], return_index=True)
                self._series[int(rank)] = TableView(self.records, rows[first])
        return self._series

    @property
    def primary_rank(self) -> int:
        """The lowest rank that logs real losses (non-last pipeline stages log `N/A`)."""
        only = self.records.constant("rank")
        if only is not None and not self.spills:
            return int(only)
        ranks = self.records.values("rank").astype(np.int64)
        loss = self.records.values("loss")
        real = self.records.numeric("loss") & ~np.isinf(loss)
        spilled = [r for r, spills in self.spills.items() if any(s.real_loss for s in spills)]
        with_loss = [*ranks[real].tolist(), *spilled]
        return int(min(with_loss)) if with_loss else min(self.ranks)


def expand_paths(log: Path) -> list[Path]:
    """A directory means msrun's `--log_dir` (worker_*.log) or MF's log root (rank_*/info.log)."""
    if not log.exists():
        raise InputError(message=f"log not found: {log}", path=str(log),
                         hint="msrun writes worker_N.log under its --log_dir; MF writes output/log/rank_N/info.log")
    if not log.is_dir():  # a file, or a FIFO/device the reader refuses by name
        return [log]
    for pattern in ("worker_*.log", "rank_*/info.log", "*.log", "*.jsonl"):
        found = sorted(log.glob(pattern), key=lambda p: (rank_from_path(p) or 0, p.name))
        if found:
            return found
    raise InputError(message=f"no log files in directory {log}", path=str(log),
                     hint="expected worker_N.log (msrun), rank_N/info.log (MindSpore Transformers) or *.log/*.jsonl")


def open_readers(logs: list[Path], *, fmt: str = "auto") -> list[LogReader]:
    """One reader per file; ranks come from the file names, else from argument order."""
    if fmt not in FORMATS:
        raise InputError(message=f"unknown log format {fmt!r}", hint=f"use one of: {', '.join(FORMATS)}")
    paths = [p for log in logs for p in expand_paths(Path(log))]
    readers = []
    for index, path in enumerate(paths):
        rank = rank_from_path(path)
        readers.append(LogReader(path, fmt=fmt, rank=index if rank is None else rank))
    return readers


def collect(readers: list[LogReader], name: str) -> Run:
    """Build a `Run` from readers, each file's ranks told apart (see `split_ranks`)."""
    tables = [split_ranks(reader) for reader in readers]
    records = tables[0] if len(tables) == 1 else StepTable.concat(tables)
    spills: dict[int, list[Spill]] = {}
    for reader in readers:
        for rank, spill in reader.spills.items():
            if spill.paths:
                spills.setdefault(rank, []).append(spill)
    run = Run(name=name, files=[r.summary for r in readers], records=records, spills=spills)
    run.held = held_in_memory(readers)
    for f in run.files:
        if f.records == 0:
            run.warnings.append(_no_steps_message(f))
        elif f.malformed:
            run.warnings.append(f"{f.path}: {f.malformed} step line(s) could not be read; first: {f.examples[0]}")
        if f.nul_bytes:
            run.warnings.append(f"{f.path}: {f.nul_bytes:,} NUL byte(s) skipped (the zero-filled tail a crash "
                                "leaves in a log)")
        if f.long_lines:
            run.warnings.append(f"{f.path}: {f.long_lines} line(s) longer than {MAX_LINE_BYTES:,} bytes skipped")
        if f.interleaved:
            run.warnings.append(f"{f.path}: every step appears {f.interleaved} times: read as {f.interleaved} ranks "
                                "interleaved in one file (numbered in order of appearance)")
        if f.truncations:
            run.warnings.append(f"{f.path}: the file was truncated or replaced while followed; only its current "
                                "content is shown")
        if f.rotations:
            run.warnings.append(f"{f.path}: the log was rotated while followed (the path now names a new file, "
                                f"{f.rotations} time(s)): the old file was read to its end, then the new one from "
                                "its start")
        if f.concatenated:
            run.warnings.append(f"{f.path}: several logs appended into one file (not a resume: the timestamps go "
                                f"back too): {'; '.join(f.concatenated[:5])}")
    return run


def held_in_memory(readers: list[LogReader]) -> list[str]:
    """Why some file's steps stay in memory past its share of `SEGMENT_ROWS` (~36 bytes a step, not bounded):
    rows whose ranks cannot be told apart as they are read (`held_why`) are held until the end."""
    out = []
    for reader in readers:
        if reader.held_why:
            out.append(f"{reader.summary.path}: {reader.table.n:,} steps held in memory ({reader.held_why}): "
                       "parse-log bounds memory for files of one rank (resumes allowed), ranks interleaved in "
                       "lockstep and logs appended one after another")
    return out


def enable_spill(readers: list[LogReader]) -> None:
    """Let every file of a run spill its oldest steps, the files sharing one bound (`SEGMENT_ROWS`)."""
    for reader in readers:
        reader.enable_spill(share=len(readers))


def require_steps(run: Run) -> None:
    if run.records:
        return
    f = run.files[0]
    found = "0 lines" if f.lines == 0 else f"{f.lines} lines, none a step line"
    raise DataFormatError(message=_no_steps_message(f), path=f.path, expected=_EXPECTED, found=found,
                          hint="check this is the training log (rank with the last pipeline stage has the loss); "
                               "pass --format mindformers|megatron|mftk to force a format")


def _no_steps_message(f: FileSummary) -> str:
    if f.lines == 0:
        return f"{f.path} is empty: no training steps to read"
    fmt = "" if f.format == "auto" else f" as {f.format}"
    extra = f" ({f.malformed} malformed, first: {f.examples[0]})" if f.examples else ""
    return f"{f.path}: no training step lines found{fmt} in {f.lines} lines{extra}"


def parse_run(logs: list[Path], *, fmt: str = "auto", name: str | None = None, spill: bool = False) -> Run:
    """Parse every file of one run (all ranks) in one pass; with `spill`, a run longer than `SEGMENT_ROWS`
    steps (all files together) is held a segment at a time (`mftk.logs.spill`, analyzed by `mftk.logs.stream`)."""
    readers = open_readers(logs, fmt=fmt)
    if spill:
        enable_spill(readers)
    for reader in readers:
        reader.read_new(final=True)
    run = collect(readers, name or ", ".join(str(p) for p in logs))
    require_steps(run)
    return run
