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

import math
import os
import re
from pathlib import Path
from typing import Any, Callable

import attrs

from mftk.errors import DataFormatError, InputError
from mftk.files import open_regular
from mftk.logs.format import read_fields, parse_metrics_record, parse_number, parse_step_line

FORMATS = ("auto", "mindformers", "megatron", "mftk")
_EXPECTED = ("MindSpore Transformers `{ step:[n/N], ... loss: ..., per_step_time: ...ms, ... }` "
             "or static-graph `{ Epoch:[..], step:[..], ... }` lines, Megatron-LM `iteration n/N | ...` "
             "lines, or mftk JSON-lines metrics")
_MAX_EXAMPLES = 5

# ---------------------------------------------------------------- line grammars

_STATIC_HEAD = re.compile(r"\{ Epoch:\[\s*(\d+)/\s*(\d+)\], step:\[\s*(\d+)/\s*(\d+)\],")
_STATIC_RENAME = {"global_norm": "grad_norm", "train_throughput_per_npu": "throughput"}


def parse_static_line(line: str) -> dict[str, Any] | None:
    """The older static-graph MFLossMonitor line; `step` is made global from epoch and step."""
    start = line.find("{ Epoch:[")
    if start < 0:
        return None
    m = _STATIC_HEAD.match(line, start)
    if m is None:
        raise ValueError("epoch/step counters are not `[n/N]`")
    epoch, epochs, step, per_epoch = (int(g) for g in m.groups())
    record: dict[str, Any] = {"step": (epoch - 1) * per_epoch + step, "total_steps": epochs * per_epoch,
                              "epoch": epoch}
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
    if "{ Epoch:[" in line:
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


_RANK_IN_PATH = (re.compile(r"worker_(\d+)\.log"), re.compile(r"rank_(\d+)"))
READ_CHUNK = 16 << 20  # bytes read at a time: memory stays bounded whatever the log's size
MAX_LINE_BYTES = 1 << 20  # no log line is this long; longer ones are skipped (and counted)
# The zero-filled blocks a crashed writer leaves (the file grew, its data never reached the disk): a run of
# NUL bytes at the end of what was read, one that fills whole lines, or a long one. Short NUL runs among
# other bytes are what binary files (.idx, .bin, safetensors) look like.
_HOLE = rb"\x00{512,}|(?:^|(?<=\n))\x00+(?=\n|\Z)"
_NUL_RUN = re.compile(_HOLE + rb"|\x00+\Z")
_NUL_RUN_INSIDE = re.compile(_HOLE.replace(rb"|\Z", rb""))  # for a window that is not the end of the data
_INTERLEAVE_LAG = 2  # ranks of one job log a step at most this many steps apart


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
    a file that shrank since the last read was truncated or rotated: it is read again from the start
    and `restarted` tells the caller to drop what it kept from the earlier content.
    """

    def __init__(self, path: Path, *, fmt: str = "auto", rank: int = 0) -> None:
        self.path = Path(path)
        self.summary = FileSummary(path=str(path), format=fmt, rank=rank)
        self._offset = 0
        self._pending = b""
        self._skipping = False  # inside a line longer than MAX_LINE_BYTES
        self.restarted = False

    def read_new(self, *, final: bool = True) -> list[dict[str, Any]]:
        """Parse new complete lines; with `final`, a last line without newline counts too."""
        self.restarted = False
        out: list[dict[str, Any]] = []
        try:
            with open_regular(self.path, what="log file", hint="pass the training log file or its directory") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._offset:  # truncated or rotated: start over
                    self._start_over()
                f.seek(self._offset)
                while chunk := f.read(READ_CHUNK):
                    if self._offset == 0:
                        _reject_binary(self.path, chunk)
                    self._offset += len(chunk)
                    out += self._feed(chunk, last=False)
        except FileNotFoundError:
            raise InputError(message=f"cannot read log {self.path}: it no longer exists", path=str(self.path),
                             hint="check the path") from None
        except OSError as exc:
            raise InputError(message=f"cannot read log {self.path}: {exc.strerror or exc}", path=str(self.path),
                             hint="check the path and its permissions") from None
        if final:
            out += self._feed(b"", last=True)
        return out

    def _start_over(self) -> None:
        fmt = self.summary.format if self.summary.format in PARSERS else "auto"
        self.summary = FileSummary(path=self.summary.path, format=fmt, rank=self.summary.rank,
                                   truncations=self.summary.truncations + 1)
        self._offset, self._pending, self._skipping, self.restarted = 0, b"", False, True

    def _feed(self, chunk: bytes, *, last: bool) -> list[dict[str, Any]]:
        data = self._pending + chunk
        cut = len(data) if last else data.rfind(b"\n") + 1
        self._pending = data[cut:]
        if len(self._pending) > MAX_LINE_BYTES:  # a line with no end in sight: skip to its newline
            self._pending, self._skipping = b"", True
            self.summary.long_lines += 1
        body = data[:cut]
        if self._skipping and body:
            newline = body.find(b"\n")
            body = body[newline + 1:] if newline >= 0 else b""
            self._skipping = newline < 0 and not last
        if b"\0" in body:
            kept = _NUL_RUN.sub(b"", body)
            self.summary.nul_bytes += len(body) - len(kept)
            body = kept
        return self._parse_text(body.decode("utf-8", errors="replace"))

    def _parse_text(self, text: str) -> list[dict[str, Any]]:
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
                out.append(record)
                break
        summary.lines = lineno
        summary.records += len(out)
        return out


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


def split_interleaved(records: list[dict[str, Any]], summary: FileSummary) -> list[dict[str, Any]]:
    """One file's records, with the ranks told apart when several ranks' lines were written into it.

    msrun's console (``--tail_worker_log``), ``tee`` of a job's output or ``cat worker_*.log`` put every
    rank's step line into one file, and the line names no rank. Such a file shows each step R ≥ 2 times
    in lockstep: every step (but the last two, which a stop may cut short) exactly R times, and never a
    step more than `_INTERLEAVE_LAG` steps behind the newest one. Then the k-th line of a step is rank
    ``base + k``. A resumed run does not look like that (its replayed steps repeat, the others do not;
    a restart from scratch goes back further than the lag) and keeps one rank.
    """
    summary.interleaved = 0
    order: dict[int, int] = {}
    counts: dict[int, int] = {}
    newest = None
    for r in records:
        step = r["step"]
        if step not in order:
            order[step] = len(order)
        counts[step] = counts.get(step, 0) + 1
        if newest is not None and order[step] < order[newest] - _INTERLEAVE_LAG:
            return records
        if newest is None or order[step] > order[newest]:
            newest = step
    steps = list(order)
    ranks = counts[steps[0]] if steps else 0
    body = steps[:-2] if len(steps) > 2 else steps[:1]
    if ranks < 2 or any(counts[s] != ranks for s in body) or any(counts[s] > ranks for s in steps):
        return records
    seen: dict[int, int] = {}
    out = []
    for r in records:
        k = seen.get(r["step"], 0)
        seen[r["step"]] = k + 1
        out.append({**r, "rank": summary.rank + k})
    summary.interleaved = ranks
    return out


# ---------------------------------------------------------------- a run: one or more files

@attrs.define
class Run:
    """Every record read for one run (all ranks), in file order, and per-file accounting."""

    name: str
    files: list[FileSummary]
    records: list[dict[str, Any]]
    warnings: list[str] = attrs.field(factory=list)
    _series: dict[int, list[dict[str, Any]]] | None = attrs.field(default=None, init=False, repr=False, eq=False)

    @property
    def ranks(self) -> list[int]:
        return sorted(self._by_rank())

    def series(self, rank: int) -> list[dict[str, Any]]:
        """One rank's records by step; after a resume (step going back) the later line wins."""
        return self._by_rank().get(rank, [])

    def _by_rank(self) -> dict[int, list[dict[str, Any]]]:
        if self._series is None:  # computed once: records are complete when a Run is built
            by_rank: dict[int, dict[int, dict[str, Any]]] = {}
            for r in self.records:
                by_rank.setdefault(r["rank"], {})[r["step"]] = r
            self._series = {rank: [steps[s] for s in sorted(steps)] for rank, steps in by_rank.items()}
        return self._series

    @property
    def primary_rank(self) -> int:
        """The lowest rank that logs real losses (non-last pipeline stages log `N/A`)."""
        with_loss = sorted({r["rank"] for r in self.records if _finite_or_nan(r.get("loss"))})
        return with_loss[0] if with_loss else min(r["rank"] for r in self.records)


def _finite_or_nan(value: Any) -> bool:
    return isinstance(value, (int, float)) and not math.isinf(value)


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


def collect(readers: list[LogReader], name: str, records: list[dict[str, Any]] | None = None) -> Run:
    """Build a `Run` from readers; raises when no file held a single step line."""
    records = records if records is not None else []
    run = Run(name=name, files=[r.summary for r in readers], records=records)
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
    return run


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


def parse_run(logs: list[Path], *, fmt: str = "auto", name: str | None = None) -> Run:
    """Parse every file of one run (all ranks) in one pass."""
    readers = open_readers(logs, fmt=fmt)
    records = [rec for reader in readers for rec in split_interleaved(reader.read_new(final=True), reader.summary)]
    run = collect(readers, name or ", ".join(str(p) for p in logs), records)
    require_steps(run)
    return run
