"""`mftk preprocess`: JSON/JSONL corpora to Megatron `.bin/.idx`, byte-identical to the reference tools.

The run is a three-stage pipeline on one machine: the main thread reads and validates the
next batch of lines while a worker thread runs the tokenizer's own parallel ``encode_batch``
(GIL released) on the current one; token arrays are then written with numpy in one call per
batch. Memory is bounded by a few batches, whatever the corpus size.

Safety: outputs live under ``.partial`` names until every input is done; after each completed
input file the builders are flushed and a small state file records the progress, so a run
stopped by an error or Ctrl-C can continue with ``resume=True`` from the next file.

``format="mindrecord"`` writes ``<prefix>[_<name>]_<key>.mindrecord`` instead: the same tokens,
packed into fixed ``seq_length + 1`` samples for ``type: MindDataset`` (see ``mftk.data.mindrecord``
for the packing rule); that path imports MindSpore and cannot be resumed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import attrs
import numpy as np

from mftk.data.indexed import IndexedDataset, IndexedDatasetBuilder, best_dtype, data_paths, merge
from mftk.data.jsonl import CorpusReader, Record, Reject, expand_inputs
from mftk.data.tokenize import LoadedTokenizer, load_tokenizer
from mftk.errors import DataFormatError, InputError
from mftk.progress import NULL_PROGRESS, Progress

STATE_VERSION = 1
_NAMED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)=(.+)$")


@attrs.define
class Source:
    """One group of inputs that becomes one output prefix (per JSON key)."""

    name: str | None
    patterns: list[str]


@attrs.define
class OutputPair:
    """One written `.bin/.idx` pair."""

    prefix: str
    key: str
    sequences: int
    documents: int
    tokens: int
    bin_bytes: int  # with --format mindrecord: the .mindrecord file
    idx_bytes: int  # with --format mindrecord: its .db index
    dropped_tokens: int = 0  # mindrecord: the final partial sample, not written


@attrs.define
class SourceSummary:
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


@attrs.define
class PreprocessSummary:
    """What a run wrote; the command renders it as a table or JSON."""

    sources: list[SourceSummary]
    tokenizer: str | None
    vocab_size: int | None
    eod_id: int | None
    eod_token: str | None
    dtype: str
    compat: str
    append_eod: bool
    weights: list[float]
    wall_s: float
    format: str = "megatron"
    seq_length: int | None = None  # mindrecord: samples hold seq_length + 1 tokens

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.sources)

    def data_path_block(self) -> str:
        """The `data_path:` list for the training YAML: weight, prefix pairs (first JSON key).

        With the mindrecord format, the ``dataloader`` keys for ``type: MindDataset`` instead.
        """
        if self.format == "mindrecord":
            lines = ["type: MindDataset", "dataset_files:"]
            lines += [f"  - '{s.outputs[0].prefix}'" for s in self.sources]
            return "\n".join(lines)
        lines = ["data_path:"]
        for weight, source in zip(self.weights, self.sources):
            lines.append(f"  - '{weight:.6g}'")
            lines.append(f"  - '{source.outputs[0].prefix}'")
        return "\n".join(lines)


def parse_sources(inputs: list[str]) -> list[Source]:
    """``NAME=PATTERN`` puts a pattern in group NAME; plain patterns form one unnamed group."""
    groups: dict[str | None, list[str]] = {}
    for item in inputs:
        m = _NAMED.match(item)
        if m and not os.path.exists(item):
            groups.setdefault(m.group(1), []).append(m.group(2))
        else:
            groups.setdefault(None, []).append(item)
    if None in groups and len(groups) > 1:
        raise InputError(message="mixing named inputs (NAME=PATH) with unnamed ones",
                         hint="name every input group, e.g. --input wiki=wiki/*.jsonl --input code=code.jsonl")
    return [Source(name, patterns) for name, patterns in groups.items()]


def preprocess(
    inputs: list[str],
    output_prefix: str,
    tokenizer: str | os.PathLike | None,
    *,
    json_keys: tuple[str, ...] | list[str] = ("text",),
    append_eod: bool = False,
    eod_token: str | None = None,
    compat: str = "megatron",
    on_error: str = "fail",
    max_errors: int | None = None,
    workers: int | None = None,
    weights: list[float] | None = None,
    resume: bool = False,
    merge_only: bool = False,
    batch_bytes: int = 2 << 20,
    format: str = "megatron",
    seq_length: int | None = None,
    progress: Progress = NULL_PROGRESS,
) -> PreprocessSummary:
    """Tokenize every input group into ``<output_prefix>[_<name>]_<key>_document.{bin,idx}``.

    ``merge_only`` instead concatenates existing prefixes (``inputs``) into ``output_prefix``.
    ``format="mindrecord"`` (needs ``seq_length``) writes ``<output_prefix>[_<name>]_<key>.mindrecord``.
    """
    started = time.perf_counter()
    if not inputs:
        raise InputError(message="no input given", hint="pass --input PATH (repeatable; globs allowed)")
    _check_format(format, seq_length, merge_only=merge_only, resume=resume, weights=weights)
    if compat not in ("megatron", "mindformers"):
        raise InputError(message=f"--compat must be megatron or mindformers, not {compat!r}")
    if on_error not in ("fail", "skip"):
        raise InputError(message=f"--on-error must be fail or skip, not {on_error!r}")
    if merge_only:
        return _merge(inputs, output_prefix, started)
    if tokenizer is None:
        raise InputError(message="--tokenizer is required", hint="pass a tokenizer.json or its directory")
    keys = list(json_keys)
    if not keys or len(set(keys)) != len(keys):
        raise InputError(message=f"--json-keys must be distinct and non-empty, got {keys}")
    sources = parse_sources(inputs)
    if weights is not None and len(weights) != len(sources):
        raise InputError(message=f"{len(weights)} weights for {len(sources)} input groups",
                         hint="give one --weights value per input group, in order")
    files = [expand_inputs(s.patterns) for s in sources]  # missing inputs fail before any work
    _check_writable(Path(output_prefix))
    tok = load_tokenizer(tokenizer, eod_token)
    if append_eod and tok.eod_id is None:
        raise InputError(message=f"{tok.path}: no end-of-document token found for --append-eod",
                         hint="pass --eod-token with the token your model uses, e.g. <|endoftext|>")
    if workers:
        os.environ.setdefault("RAYON_NUM_THREADS", str(workers))  # read once, at the pool's first use
    dtype = best_dtype(tok.vocab_size, compat) if format == "megatron" else np.dtype(np.int32)
    settings = {"keys": keys, "compat": compat, "append_eod": append_eod, "eod_id": tok.eod_id,
                "dtype": dtype.name, "tokenizer_sha256": _sha256(Path(tok.path))}
    if format == "mindrecord":
        settings["mindrecord_sample_length"] = seq_length + 1
        output_prefix = re.sub(r"\.mindrecord$", "", output_prefix)
    total_bytes = sum(p.stat().st_size for group in files for p in group)
    progress.start("preprocess", total=total_bytes)
    meter = _Meter(progress)
    try:
        summaries = []
        for source, paths in zip(sources, files):
            prefix = output_prefix if source.name is None else f"{output_prefix}_{source.name}"
            run = _SourceRun(source, prefix, paths, tok, settings, dtype, on_error, max_errors, batch_bytes, meter)
            summaries.append(run.run(resume))
    finally:
        progress.done()
    tokens = [s.tokens for s in summaries]
    if weights is None:
        total = sum(tokens) or 1
        weights = [t / total for t in tokens]
    return PreprocessSummary(summaries, tok.path, tok.vocab_size, tok.eod_id, tok.eod_token, dtype.name, compat,
                             append_eod, list(weights), time.perf_counter() - started, format, seq_length)


def _check_format(format: str, seq_length: int | None, *, merge_only: bool, resume: bool,
                  weights: list[float] | None) -> None:
    if format not in ("megatron", "mindrecord"):
        raise InputError(message=f"--format must be megatron or mindrecord, not {format!r}")
    if format == "megatron":
        if seq_length is not None:
            raise InputError(message="--seq-length applies only to --format mindrecord",
                             hint="Megatron .bin/.idx data is cut into samples at training time (config seq_length)")
        return
    if seq_length is None or isinstance(seq_length, bool) or seq_length <= 0:
        raise InputError(message="--format mindrecord needs --seq-length N (a positive integer)",
                         hint="use the model's seq_length; each record then holds N + 1 tokens")
    for flag, given in (("--merge", merge_only), ("--resume", resume), ("--weights", weights is not None)):
        if given:
            raise InputError(message=f"{flag} is not available with --format mindrecord",
                             hint="MindDataset reads its files in order without blending; a MindRecord file "
                             "cannot be appended to, so rerun the whole conversion")


def _merge(inputs: list[str], output_prefix: str, started: float) -> PreprocessSummary:
    prefixes = [re.sub(r"\.(bin|idx)$", "", p) for p in inputs]
    merged = merge(prefixes, output_prefix)
    idx, bin_ = data_paths(output_prefix)
    pair = OutputPair(output_prefix, "", len(merged), merged.document_count, merged.total_tokens,
                      bin_.stat().st_size, idx.stat().st_size)
    source = SourceSummary(None, output_prefix, prefixes, [pair], documents=merged.document_count)
    return PreprocessSummary([source], None, None, None, None, merged.dtype.name, "", False, [1.0],
                             time.perf_counter() - started)


def _check_writable(prefix: Path) -> None:
    """Fail before any work if the output directory cannot be created or written."""
    probe = prefix.parent / f".{prefix.name}.mftk-write-test-{os.getpid()}"
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise InputError(message=f"{prefix.parent}: cannot write output ({exc.strerror or exc})",
                         path=str(prefix.parent), hint="choose a writable --output-prefix directory") from None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _file_id(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class _Meter:
    """Turns per-batch counts into progress calls with rates."""

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


class _Rejects:
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
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps({"file": str(file), "line": line, "reason": reason}) + "\n")
        if self.max_errors is not None and self.count > self.max_errors:
            self.close()
            raise DataFormatError(message=f"{where}: more than {self.max_errors} bad lines (--max-errors); "
                                  f"the last: {reason}", path=str(file), line=line,
                                  hint=f"see {self.path} for every rejected line")

    def size(self) -> int:
        if self._file is not None:
            self._file.flush()
        return self.path.stat().st_size if self.path.exists() else 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _SourceRun:
    """One input group to one set of builders (one per JSON key)."""

    def __init__(self, source: Source, prefix: str, paths: list[Path], tok: LoadedTokenizer, settings: dict,
                 dtype: np.dtype, on_error: str, max_errors: int | None, batch_bytes: int, meter: _Meter) -> None:
        self.source, self.prefix, self.paths, self.tok = source, prefix, paths, tok
        self.settings = {**settings, "inputs": [str(p) for p in paths]}
        self.dtype, self.batch_bytes, self.meter = dtype, batch_bytes, meter
        self.keys: list[str] = settings["keys"]
        self.sample_length: int | None = settings.get("mindrecord_sample_length")
        self.mindformers = settings["compat"] == "mindformers"
        self.append_eod = settings["append_eod"]
        self.state_path = Path(prefix + ".preprocess-state.json")
        self.rejects = _Rejects(Path(prefix + ".rejects.jsonl"), on_error, max_errors)
        self.summary = SourceSummary(source.name, prefix, [str(p) for p in paths], [])
        self.builders: dict[str, IndexedDatasetBuilder] = {}
        self.done: list[dict] = []

    # -- state ---------------------------------------------------------------------------
    def _load_state(self) -> dict | None:
        if not self.state_path.is_file():
            return None
        try:
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise DataFormatError(message=f"{self.state_path}: unreadable progress record", path=str(self.state_path),
                                  hint="rerun without --resume to start over") from None
        if state.get("version") != STATE_VERSION or state.get("settings") != self.settings:
            raise InputError(message=f"{self.state_path}: the interrupted run used different inputs or settings",
                             path=str(self.state_path), hint="rerun with the same arguments, or without --resume")
        for record in state["done"]:
            if not Path(record["path"]).is_file() or _file_id(Path(record["path"])) != record:
                raise InputError(message=f"{record['path']}: changed since the interrupted run processed it",
                                 path=record["path"], hint="rerun without --resume to start over")
        return state

    def _save_state(self) -> None:
        if self.sample_length is not None:
            return  # mindrecord outputs cannot be resumed
        state = {"version": STATE_VERSION, "settings": self.settings, "done": self.done,
                 "builders": {k: b.checkpoint() for k, b in self.builders.items()},
                 "rejects_bytes": self.rejects.size(),
                 "counters": attrs.asdict(self.summary, filter=lambda a, v: isinstance(v, int))}
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=1), encoding="utf-8")
        os.replace(tmp, self.state_path)

    def _open(self, resume: bool) -> None:
        state = self._load_state() if resume else None
        if state is None:
            self.state_path.unlink(missing_ok=True)
            self.rejects.path.unlink(missing_ok=True)
        for key in self.keys:
            if self.sample_length is not None:
                from mftk.data.mindrecord import MindRecordBuilder, output_path

                self.builders[key] = MindRecordBuilder(output_path(f"{self.prefix}_{key}"), self.sample_length)
                continue
            out = f"{self.prefix}_{key}_document"
            self.builders[key] = IndexedDatasetBuilder(out, self.dtype,
                                                       resume=state["builders"][key] if state else None)
        if state:
            self.done = state["done"]
            with open(self.rejects.path, "a+b") as f:
                f.truncate(state["rejects_bytes"])
            for name, value in state["counters"].items():
                setattr(self.summary, name, value)
            self.rejects.count = self.summary.rejected
            self.summary.resumed_files = len(self.done)

    # -- run -----------------------------------------------------------------------------
    def run(self, resume: bool) -> SourceSummary:
        self._open(resume)
        finished = False
        try:
            done_paths = {d["path"] for d in self.done}
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mftk-encode") as pool:
                for i, path in enumerate(self.paths):
                    if str(path) in done_paths:
                        self.meter.advance(path.stat().st_size, 0, 0)
                        continue
                    self._file(path, pool, i)
                    self.done.append(_file_id(path))
                    self._save_state()
            self._finish()
            finished = True
        finally:
            self.rejects.close()
            if not finished:
                for b in self.builders.values():
                    b.close() if self.state_path.exists() else b.abort()
        return self.summary

    def _resume_hint(self, index: int) -> str:
        if index == 0 or self.sample_length is not None:
            return ""
        return f"; then rerun with --resume to continue from {self.paths[index].name}"

    def _file(self, path: Path, pool: ThreadPoolExecutor, index: int) -> None:
        reader = CorpusReader(path, self.keys)
        hint = self._resume_hint(index)
        pending: Future | None = None
        last = 0
        lines = 0
        try:
            for batch in self._batches(reader, hint):
                lines += len(batch)
                nxt = pool.submit(self._encode, batch)
                if pending is not None:
                    self._write(*pending.result(), path, hint)
                pending = nxt
                self.meter.advance(reader.bytes_read - last, 0, 0)
                last = reader.bytes_read
            if pending is not None:
                self._write(*pending.result(), path, hint)
                pending = None
        finally:
            if pending is not None:
                pending.cancel()
            reader.close()
        self.meter.advance(path.stat().st_size - last, 0, 0)
        if not self._had_lines:
            self._reject(path, None, "empty file (no lines)", hint)

    def _reject(self, path: Path, line: int | None, reason: str, hint: str) -> None:
        self.rejects.add(path, line, reason, hint)
        self.summary.rejected = self.rejects.count

    def _batches(self, reader: CorpusReader, hint: str) -> Iterator[list[Record]]:
        batch: list[Record] = []
        size = 0
        self._had_lines = False
        for item in reader:
            self._had_lines = True
            if isinstance(item, Reject):
                self._reject(reader.path, item.line, item.reason, hint)
                continue
            batch.append(item)
            size += item.nbytes
            if size >= self.batch_bytes:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch

    def _encode(self, batch: list[Record]) -> tuple[list[Record], list[tuple[np.ndarray, np.ndarray] | None]]:
        """Worker thread: per key, (flat ids, length per sentence) of the whole batch."""
        out = []
        for k in range(len(self.keys)):
            texts = [s for r in batch for s in r.texts[k]]
            try:
                out.append(self.tok.encode(texts))
            except Exception:  # noqa: BLE001 - found per record in _write
                out.append(None)
        return batch, out

    def _write(self, batch: list[Record], encoded: list, path: Path, hint: str) -> None:
        if any(e is None for e in encoded):
            batch, encoded = self._encode_one_by_one(batch, path, hint)
            if not batch:
                return
        tokens_first = 0
        for k, key in enumerate(self.keys):
            flat, lengths = encoded[k]
            sentences = np.fromiter((len(r.texts[k]) for r in batch), dtype=np.int64, count=len(batch))
            toks, seq_lengths, per_doc, empty = _assemble(flat, lengths, sentences, self.tok.eod_id,
                                                         self.append_eod, self.mindformers)
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
        self.summary.documents += len(batch)
        self.meter.advance(0, len(batch), tokens_first)

    def _encode_one_by_one(self, batch: list[Record], path: Path, hint: str):
        kept, per_key = [], [[] for _ in self.keys]
        for r in batch:
            try:
                results = [self.tok.encode(r.texts[k]) for k in range(len(self.keys))]
            except Exception as exc:  # noqa: BLE001 - the tokenizer's own message names the cause
                self._reject(path, r.line, f"the tokenizer cannot encode this text ({str(exc)[:200]})", hint)
                continue
            kept.append(r)
            for k, res in enumerate(results):
                per_key[k].append(res)
        encoded = [(np.concatenate([f for f, _ in rs]) if rs else np.zeros(0, np.int64),
                    np.concatenate([n for _, n in rs]) if rs else np.zeros(0, np.int32)) for rs in per_key]
        return kept, encoded

    def _finish(self) -> None:
        for key, builder in self.builders.items():
            if builder.token_count == 0:
                raise DataFormatError(
                    message=f"{self.prefix}: no tokens to write for key {key!r} "
                    f"({self.summary.documents} documents, {self.summary.rejected} lines rejected)",
                    path=self.prefix, hint="an empty .bin cannot be memory-mapped by Megatron; check the inputs"
                    + (f" and {self.rejects.path}" if self.summary.rejected else ""))
        for key, builder in self.builders.items():
            if self.sample_length is not None:
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


def _assemble(flat: np.ndarray, lengths: np.ndarray, sentences_per_doc: np.ndarray, eod: int | None,
              append_eod: bool, mindformers: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Apply the reference scripts' rules to one encoded batch, vectorised.

    Megatron drops empty sentences (an empty document then has no sequence); MindSpore
    Transformers keeps them as zero-length sequences. With ``append_eod`` the EOD id goes
    after the last token of every document that has tokens, counted in its last sequence.
    Returns (tokens, sequence lengths, sequences per document, number of empty documents).
    """
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
