"""One input group through reader, tokenizer and builders: the work of `mftk preprocess`.

The data stays in arrays from the file to the ``.bin``: the main thread reads and parses the
next chunk of lines (`mftk.data.jsonl`) while a worker thread encodes the previous one (both
tokenizers release the GIL while they encode; gigatoken returns one array per chunk); the main
thread then applies the reference scripts' rules to each encoded chunk with numpy (`assemble`)
and appends its token array to the ``.bin`` in one write, in chunk order, so that the worker goes
from one encode to the next. At most `IN_FLIGHT` chunks are in flight, so memory is bounded by a
few chunks (plus the longest line) whatever the corpus size.

Safety: outputs live under temporary names unique to the run until every input is done (the
caller holds the output's lock). Every few tens of MB of input, at a piece (file or byte range)
boundary, the builders are flushed and a small state file records the progress, so a run
stopped by a bad line or Ctrl-C can continue with ``resume=True`` from the next piece. A failed
write (full disk) is not resumable: every temporary file, the state file and the rejects list
are removed, so nothing is left taking space.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import msgspec
import numpy as np

from mftk.data.indexed import IndexedDataset, IndexedDatasetBuilder, remove_partials, write_error
from mftk.data.jsonl import Chunk, CorpusReader, count_lines
from mftk.data.shards import Piece
from mftk.data.tokenize import LoadedTokenizer
from mftk.errors import DataFormatError, InputError
from mftk.files import SMALL_JSON_LIMIT, read_json
from mftk.progress import Progress

STATE_VERSION = 2
IN_FLIGHT = 3  # chunks parsed ahead of the writer: bounds memory, keeps the encoder busy
# While a group runs: how long the parsing main thread may keep the GIL when the encoder thread asks for it
# (Python's default 5 ms would stall the encoder at each of its few Python steps per chunk); None: unchanged.
SWITCH_INTERVAL: float | None = 0.0005


# The run's records are msgspec Structs, made in C when the module loads (attrs would add 25-40 ms to every
# `mftk preprocess` start-up: see `mftk.errors`).
class OutputPair(msgspec.Struct):
    """One written `.bin/.idx` pair."""

    prefix: str
    key: str
    sequences: int
    documents: int
    tokens: int
    bin_bytes: int  # with --format mindrecord: the .mindrecord file
    idx_bytes: int  # with --format mindrecord: its .db index
    dropped_tokens: int = 0  # mindrecord: the final partial sample, not written


class SourceSummary(msgspec.Struct):
    name: str | None
    prefix: str
    files: list[str]
    outputs: list[OutputPair]
    documents: int = 0
    empty_documents: int = 0
    rejected: int = 0
    special_tokens_in_text: int = 0
    resumed_files: int = 0
    rejects_path: str | None = None

    @property
    def tokens(self) -> int:
        return self.outputs[0].tokens if self.outputs else 0


class RunOptions(msgspec.Struct):
    """Settings shared by every input group of one run."""

    keys: list[str]
    dtype: np.dtype
    compat: str
    append_eod: bool
    on_error: str
    max_errors: int | None
    chunk_bytes: int
    sample_length: int | None = None  # mindrecord: samples of seq_length + 1 tokens
    allow_empty: bool = False  # a shard may hold no tokens; its merge with the others is what counts
    # What a resumed run must match (callable values: called when needed).
    settings: dict = msgspec.field(default_factory=dict)
    # Called before anything encoded is kept (a progress record saved, an output finalized): the
    # tokenizer backend's pending verdict (`mftk.data.tokenize.BackendCheck.confirm`); it may raise.
    confirm: Callable[[], None] = lambda: None


class Meter:
    """Turns per-chunk counts into progress calls with rates."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.t0 = time.perf_counter()
        self.docs = self.tokens = self.bytes = 0

    def advance(self, nbytes: int, docs: int, tokens: int) -> None:
        self.docs += docs
        self.tokens += tokens
        self.bytes += nbytes
        dt = max(time.perf_counter() - self.t0, 1e-9)
        self.progress.advance(nbytes, docs=f"{self.docs / dt:,.0f}/s", MB=f"{self.bytes / dt / 1e6:.1f}/s",
                              tokens=f"{self.tokens / dt:,.0f}/s")


class Rejects:
    """Bad lines: raise at once (fail) or append to ``<prefix>.rejects.jsonl`` (skip)."""

    def __init__(self, path: Path, on_error: str, max_errors: int | None, count: int = 0) -> None:
        self.path, self.on_error, self.max_errors, self.count = path, on_error, max_errors, count
        self._file = None

    def add(self, file: Path, line: int | None, reason: str, resume_hint: str) -> None:
        where = f"{file}:{line}" if line else str(file)
        if self.on_error == "fail":
            raise DataFormatError(message=f"{where}: {reason}", path=str(file), line=line,
                                  hint="fix the line, or pass --on-error skip to skip bad lines (they are listed "
                                  f"in {self.path.name}){resume_hint}")
        self.count += 1
        try:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")
            self._file.write(json.dumps({"file": str(file), "line": line, "reason": reason}) + "\n")
        except OSError as exc:
            raise write_error(exc, self.path) from None
        if self.max_errors is not None and self.count > self.max_errors:
            self.close()
            raise DataFormatError(message=f"{where}: more than {self.max_errors} bad lines (--max-errors); "
                                  f"the last: {reason}", path=str(file), line=line,
                                  hint=f"see {self.path} for every rejected line")

    def size(self) -> int:
        try:
            if self._file is not None:
                self._file.flush()
            return self.path.stat().st_size if self.path.exists() else 0
        except OSError as exc:
            raise write_error(exc, self.path) from None

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def piece_id(piece: Piece) -> dict:
    """What identifies a processed piece for --resume: path, range, and the file's size and mtime."""
    st = piece.path.stat()
    return {"path": str(piece.path), "start": piece.start, "end": piece.end, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns}


class SourceRun:
    """One input group (its pieces, in order) to one builder per JSON key."""

    def __init__(self, name: str | None, prefix: str, pieces: list[Piece], tok: LoadedTokenizer,
                 options: RunOptions, meter: Meter) -> None:
        self.prefix, self.pieces, self.tok, self.opt, self.meter = prefix, pieces, tok, options, meter
        self.keys = options.keys
        self._settings: dict | None = None
        self.mindformers = options.compat == "mindformers"
        self.state_path = Path(prefix + ".preprocess-state.json")
        self.rejects = Rejects(Path(prefix + ".rejects.jsonl"), options.on_error, options.max_errors)
        self.summary = SourceSummary(name, prefix, [p.describe() for p in pieces], [])
        self.builders: dict = {}
        self.done: list[dict] = []
        self._unsaved_bytes = 0
        self._saved_at: float | None = None

    # -- state ---------------------------------------------------------------------------
    @property
    def settings(self) -> dict:
        """What a resumed run must match (computed when a progress record is first read or written)."""
        if self._settings is None:
            self._settings = {**{k: v() if callable(v) else v for k, v in self.opt.settings.items()},
                              "inputs": [p.describe() for p in self.pieces]}
        return self._settings

    def _load_state(self) -> dict | None:
        if not self.state_path.is_file():
            return None
        try:
            state = read_json(self.state_path, limit=SMALL_JSON_LIMIT, what="progress record")
        except (OSError, InputError):
            raise DataFormatError(message=f"{self.state_path}: unreadable progress record", path=str(self.state_path),
                                  hint="rerun without --resume to start over") from None
        if state.get("version") != STATE_VERSION or state.get("settings") != self.settings:
            raise InputError(message=f"{self.state_path}: the interrupted run used different inputs or settings",
                             path=str(self.state_path), hint="rerun with the same arguments, or without --resume")
        for record in state["done"]:
            path = Path(record["path"])
            if not path.is_file() or piece_id(Piece(path, record["start"], record["end"])) != record:
                raise InputError(message=f"{record['path']}: changed since the interrupted run processed it",
                                 path=record["path"], hint="rerun without --resume to start over")
        return state

    def _save_state(self) -> None:
        self.opt.confirm()  # a record may only cover tokens of a confirmed backend
        if self.opt.sample_length is not None:
            return  # mindrecord outputs cannot be resumed
        state = {"version": STATE_VERSION, "settings": self.settings, "done": self.done,
                 "builders": {k: b.checkpoint() for k, b in self.builders.items()},
                 "rejects_bytes": self.rejects.size(),
                 "counters": {k: v for k, v in msgspec.structs.asdict(self.summary).items() if isinstance(v, int)}}
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(state, indent=1), encoding="utf-8")
            os.replace(tmp, self.state_path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise write_error(exc, self.state_path) from None
        self._unsaved_bytes = 0
        self._saved_at = time.monotonic()

    def _state_due(self) -> bool:
        """Checkpoint after a piece unless one was made very recently (many small files)."""
        return (self._saved_at is None or time.monotonic() - self._saved_at >= 1.0
                or self._unsaved_bytes >= 8 * self.opt.chunk_bytes)

    def _open(self, resume: bool) -> None:
        state = self._load_state() if resume else None
        if state is None:
            self.state_path.unlink(missing_ok=True)
            self.rejects.path.unlink(missing_ok=True)
        try:
            self._open_builders(state)
        except BaseException:
            for b in self.builders.values():
                b.close() if state else b.abort()
            raise
        if state:
            self.done = state["done"]
            with open(self.rejects.path, "a+b") as f:
                f.truncate(state["rejects_bytes"])
            for name, value in state["counters"].items():
                setattr(self.summary, name, value)
            self.rejects.count = self.summary.rejected
            self.summary.resumed_files = len(self.done)

    def _open_builders(self, state: dict | None) -> None:
        for key in self.keys:
            if self.opt.sample_length is not None:
                from mftk.data.mindrecord import MindRecordBuilder, output_path, remove_partial_dirs

                out = output_path(f"{self.prefix}_{key}")
                remove_partial_dirs(out)
                self.builders[key] = MindRecordBuilder(out, self.opt.sample_length)
                continue
            out = f"{self.prefix}_{key}_document"
            saved = state["builders"][key] if state else None
            remove_partials(out, keep_run=saved.get("run") if saved else None)
            self.builders[key] = IndexedDatasetBuilder(out, self.opt.dtype, resume=saved,
                                                       vocab_size=self.tok.vocab_size)

    # -- run -----------------------------------------------------------------------------
    def run(self, resume: bool) -> SourceSummary:
        self._open(resume)
        outcome = "failed"
        try:
            done = {(d["path"], d["start"], d["end"]) for d in self.done}
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mftk-encode") as pool, _switch_interval():
                for i, piece in enumerate(self.pieces):
                    if (str(piece.path), piece.start, piece.end) in done:
                        self.meter.advance(piece.size(), 0, 0)
                        continue
                    self._piece(piece, pool, i)
                    self.done.append(piece_id(piece))
                    self._unsaved_bytes += piece.size()
                    if i + 1 < len(self.pieces) and self._state_due():
                        self._save_state()
            self._finish()
            outcome = "finished"
        except InputError:
            outcome = "write failed"  # mid-run, an InputError is a failed write: keep nothing
            raise
        finally:
            self.rejects.close()
            if outcome != "finished":
                self._stop(keep=outcome == "failed" and self.state_path.exists())
        return self.summary

    def _stop(self, keep: bool) -> None:
        """Keep the partial outputs for --resume, or remove every trace of the run."""
        for b in self.builders.values():
            b.close() if keep else b.abort()
        if not keep:
            for p in (self.state_path, self.state_path.with_name(self.state_path.name + ".tmp")):
                with contextlib.suppress(OSError):
                    p.unlink()
            if self.rejects.count and self.rejects.on_error == "skip":
                return  # the list of bad lines found so far is still worth reading
            with contextlib.suppress(OSError):
                self.rejects.path.unlink()

    def _resume_hint(self, index: int) -> str:
        if index == 0 or self.opt.sample_length is not None or not self.state_path.exists():
            return ""
        return f"; then rerun with --resume to continue from {self.pieces[index].describe()}"

    def _piece(self, piece: Piece, pool: ThreadPoolExecutor, index: int) -> None:
        reader = CorpusReader(piece.path, self.keys, start=piece.start, end=piece.end,
                              chunk_bytes=self.opt.chunk_bytes,
                              line_offset=(lambda: count_lines(piece.path, piece.start)) if piece.start else 0)
        hint = self._resume_hint(index)
        pending: deque[tuple[Chunk, Future]] = deque()
        last = 0
        try:
            for chunk in reader:
                for reject in chunk.rejects:
                    self._reject(piece.path, reject.line, reject.reason, hint)
                if chunk.documents:
                    pending.append((chunk, pool.submit(self._encode, chunk)))
                while len(pending) >= IN_FLIGHT or (pending and pending[0][1].done()):
                    self._write_chunk(*pending.popleft(), piece.path, hint)
                self.meter.advance(reader.bytes_read - last, 0, 0)
                last = reader.bytes_read
            while pending:
                self._write_chunk(*pending.popleft(), piece.path, hint)
        finally:
            for _, future in pending:
                future.cancel()
            for _, future in pending:
                if not future.cancelled():
                    with contextlib.suppress(BaseException):
                        future.result()  # let a running encode end before the tokenizer can go
            reader.close()
        self.meter.advance(piece.size() - last, 0, 0)
        if not reader.had_lines and piece.start == 0:
            self._reject(piece.path, None, "empty file (no lines)", hint)

    def _reject(self, path: Path, line: int | None, reason: str, hint: str) -> None:
        self.rejects.add(path, line, reason, hint)
        self.summary.rejected = self.rejects.count

    def _encode(self, chunk: Chunk) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Worker thread: every key of the chunk encoded, or None if the tokenizer failed on the chunk."""
        try:
            return [self.tok.encode(texts) for texts in chunk.texts]
        except Exception:  # noqa: BLE001 - found per document by `_write_chunk`, with its line
            return None

    def _write_chunk(self, chunk: Chunk, encoded: Future, path: Path, hint: str) -> None:
        """Main thread, in chunk order: write the chunk's encoded keys (documents the tokenizer failed on
        rejected first, one by one)."""
        result = encoded.result()
        if result is None:
            self._encode_one_by_one(chunk, path, hint)
            return
        self._write(result, chunk.sentences, chunk.documents, path)

    def _write(self, encoded: list[tuple[np.ndarray, np.ndarray]], sentences: list[np.ndarray | None],
               documents: int, path: Path) -> None:
        tokens_first = 0
        for k, key in enumerate(self.keys):
            flat, lengths = encoded[k]
            toks, seq_lengths, per_doc, empty = assemble(flat, lengths, sentences[k], self.tok.eod_id,
                                                        self.opt.append_eod, self.mindformers)
            try:
                self.builders[key].add_batch(toks, seq_lengths, per_doc)
            except ValueError as exc:  # a token id that does not fit the dtype: tokenizer/vocab mismatch
                raise DataFormatError(message=f"{path}: {exc}", path=str(path),
                                      hint="the tokenizer produced an id beyond its vocabulary size") from None
            if k == 0:
                self.summary.empty_documents += empty
                tokens_first = len(toks)
                if self.tok.eod_id is not None:
                    self.summary.special_tokens_in_text += int(np.count_nonzero(flat == self.tok.eod_id))
        self.summary.documents += documents
        self.meter.advance(0, documents, tokens_first)

    def _encode_one_by_one(self, chunk: Chunk, path: Path, hint: str) -> None:
        """The tokenizer failed on the chunk: find the documents it cannot encode, reject them.

        The backend's verdict comes first: a gigatoken that fails on text may have failed the check
        too, and then the run starts over with HF tokenizers rather than reject what HF encodes."""
        self.opt.confirm()
        counts = [s if s is not None else np.ones(chunk.documents, np.int64) for s in chunk.sentences]
        starts = [np.concatenate(([0], np.cumsum(c))) for c in counts]
        kept: list[int] = []
        per_key: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in self.keys]
        lines = chunk.document_lines()
        for d in range(chunk.documents):
            try:
                results = [self.tok.encode(chunk.texts[k][starts[k][d]:starts[k][d + 1]]) for k in range(len(self.keys))]
            except Exception as exc:  # noqa: BLE001 - the tokenizer's own message names the cause
                self._reject(path, lines[d], f"the tokenizer cannot encode this text ({str(exc)[:200]})", hint)
                continue
            kept.append(d)
            for k, res in enumerate(results):
                per_key[k].append(res)
        if not kept:
            return
        encoded = [(np.concatenate([f for f, _ in rs]), np.concatenate([n for _, n in rs])) for rs in per_key]
        self._write(encoded, [c[kept] for c in counts], len(kept), path)

    def _finish(self) -> None:
        self.opt.confirm()
        for key, builder in self.builders.items():
            if builder.token_count == 0 and not self.opt.allow_empty:
                raise DataFormatError(
                    message=f"{self.prefix}: no tokens to write for key {key!r} "
                    f"({self.summary.documents} documents, {self.summary.rejected} lines rejected)",
                    path=self.prefix, hint="an empty .bin cannot be memory-mapped by Megatron; check the inputs"
                    + (f" and {self.rejects.path}" if self.summary.rejected else ""))
        for key, builder in self.builders.items():
            if self.opt.sample_length is not None:
                out = builder.finalize()
                self.summary.outputs.append(OutputPair(out.path, key, out.samples, out.documents, out.tokens,
                                                       out.file_bytes, out.db_bytes, out.dropped_tokens))
                continue
            builder.finalize()
            ds = IndexedDataset(builder.path_prefix)
            self.summary.outputs.append(OutputPair(builder.path_prefix, key, len(ds), ds.document_count,
                                                   ds.total_tokens, ds.bin_path.stat().st_size,
                                                   ds.idx_path.stat().st_size))
        self.state_path.unlink(missing_ok=True)
        if self.summary.rejected:
            self.summary.rejects_path = str(self.rejects.path)


@contextlib.contextmanager
def _switch_interval():
    """`SWITCH_INTERVAL` as the interpreter's thread switch interval for the block, restored after."""
    previous = sys.getswitchinterval()
    if SWITCH_INTERVAL is not None:
        sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def assemble(flat: np.ndarray, lengths: np.ndarray, sentences_per_doc: np.ndarray | None, eod: int | None,
             append_eod: bool, mindformers: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Apply the reference scripts' rules to one encoded chunk, vectorised.

    Megatron drops empty sentences (an empty document then has no sequence); MindSpore
    Transformers keeps them as zero-length sequences. With ``append_eod`` the EOD id goes
    after the last token of every document that has tokens, counted in its last sequence.
    ``sentences_per_doc`` None means one sentence per document.
    Returns (tokens, sequence lengths, sequences per document, number of empty documents).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if sentences_per_doc is None:
        ndocs = len(lengths)
        doc_tokens = lengths
        keep = slice(None) if mindformers else lengths > 0
        seq_lengths = lengths[keep].astype(np.int32)
        per_doc = np.ones(ndocs, np.int64) if mindformers else (lengths > 0).astype(np.int64)
    else:
        ndocs = len(sentences_per_doc)
        doc_of = np.repeat(np.arange(ndocs), sentences_per_doc)
        doc_tokens = np.bincount(doc_of, weights=lengths, minlength=ndocs).astype(np.int64)
        keep = np.ones(len(lengths), bool) if mindformers else lengths > 0
        seq_lengths = lengths[keep].astype(np.int32)
        per_doc = np.bincount(doc_of[keep], minlength=ndocs).astype(np.int64)
    has_tokens = doc_tokens > 0
    empty = int(ndocs - np.count_nonzero(has_tokens))
    if append_eod and eod is not None and has_tokens.any():
        ends = np.cumsum(doc_tokens)[has_tokens]
        flat = np.insert(flat, ends, eod)
        last_seq = (np.cumsum(per_doc) - 1)[has_tokens]
        seq_lengths[last_seq] += 1
    return flat, seq_lengths, per_doc, empty
