"""`mftk preprocess`: JSON/JSONL corpora to Megatron `.bin/.idx`, byte-identical to the reference tools.

This module checks the arguments, picks the tokenizer backend (`mftk.data.tokenize`: gigatoken
when it reproduces the tokenizer exactly, else HF tokenizers), takes each output's lock
(`mftk.lock`) and runs every input group through `mftk.data.pipeline`, which keeps the data in
arrays from the JSONL bytes to the ``.bin``.

``num_shards``/``shard_index`` process a deterministic 1/N of each group (`mftk.data.shards`)
into ``<prefix>[_<name>]_shard<K>of<N>_<key>_document``; ``merge_only`` of the N outputs in
shard order gives exactly what one run over everything writes.

``format="mindrecord"`` writes ``<prefix>[_<name>]_<key>.mindrecord`` instead: the same tokens,
packed into fixed ``seq_length + 1`` samples for ``type: MindDataset`` (see ``mftk.data.mindrecord``
for the packing rule); that path imports MindSpore and cannot be resumed or sharded.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import time
from pathlib import Path

import msgspec
import numpy as np

from mftk.data.indexed import best_dtype, data_paths, merge
from mftk.data.inputs import Source, check_sample, expand_inputs, parse_sources
from mftk.data.jsonl import CHUNK_BYTES
from mftk.data.pipeline import Meter, OutputPair, RunOptions, SourceRun, SourceSummary
from mftk.data.shards import Piece, check_shard, shard_name, shard_pieces
from mftk.data.preload import TokenizerPreload, use_threads
from mftk.data.tokenize import BackendMismatch, choose_backend, load_tokenizer
from mftk.errors import InputError
from mftk.files import LARGE_JSON_LIMIT, read_bytes
from mftk.lock import exclusive_output
from mftk.progress import NULL_PROGRESS, Progress

__all__ = ["OutputPair", "PreprocessSummary", "Source", "SourceSummary", "parse_sources", "preprocess"]

LOCK_WHAT = "mftk preprocess output"


class PreprocessSummary(msgspec.Struct):
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
    backend: str | None = None  # tokenizer backend used: gigatoken or hf
    backend_note: str = ""  # why (the check it passed, or why gigatoken was not used)
    shard: list[int] | None = None  # [K, N]: this run wrote shard K of N
    setup_s: float = 0.0  # of wall_s: until the first chunk is read (tokenizers loaded, backend chosen)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.sources)

    def as_dict(self) -> dict:
        """Every field, nested records as dicts (the command's ``--json`` output)."""
        return msgspec.to_builtins(self)

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

    def merge_commands(self) -> list[str]:
        """For a shard: the ``--merge`` command that joins all N shards of each output."""
        if self.shard is None:
            return []
        k, n = self.shard
        own = shard_name(n, k)
        commands = []
        for s in self.sources:
            for o in s.outputs:
                pattern = o.prefix.replace(own, f"shard{'?' * len(str(n - 1))}of{n}")
                commands.append(f"mftk preprocess --merge --input '{pattern}' --output-prefix "
                                f"'{o.prefix.replace('_' + own, '')}'")
        return commands


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
    batch_bytes: int = CHUNK_BYTES,
    format: str = "megatron",
    seq_length: int | None = None,
    tokenizer_backend: str = "auto",
    num_shards: int | None = None,
    shard_index: int | None = None,
    progress: Progress = NULL_PROGRESS,
    preload: TokenizerPreload | None = None,
) -> PreprocessSummary:
    """Tokenize every input group into ``<output_prefix>[_<name>]_<key>_document.{bin,idx}``.

    ``merge_only`` instead concatenates existing prefixes (``inputs``, globs allowed) into
    ``output_prefix``. ``format="mindrecord"`` (needs ``seq_length``) writes
    ``<output_prefix>[_<name>]_<key>.mindrecord``. ``batch_bytes`` is the size of the chunks the
    input is read, parsed and encoded in. ``preload``: the tokenizers, already loading
    (`mftk.data.preload`; the command starts it before importing this module); else started here.
    """
    started = time.perf_counter()
    if not inputs:
        raise InputError(message="no input given", hint="pass --input PATH (repeatable; globs allowed)")
    shard = check_shard(num_shards, shard_index)
    _check_format(format, seq_length, merge_only=merge_only, resume=resume, weights=weights, shard=shard)
    if compat not in ("megatron", "mindformers"):
        raise InputError(message=f"--compat must be megatron or mindformers, not {compat!r}")
    if on_error not in ("fail", "skip"):
        raise InputError(message=f"--on-error must be fail or skip, not {on_error!r}")
    if merge_only:
        if shard is not None:
            raise InputError(message="--merge takes no --num-shards/--shard-index",
                             hint="merge the shard outputs in one run: --merge --input 'PREFIX_shard*of8_text_document'")
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
    pieces = [shard_pieces(paths, *shard) if shard else [Piece(p) for p in paths] for paths in files]
    if format == "mindrecord":
        output_prefix = re.sub(r"\.mindrecord$", "", output_prefix)
    _check_writable(output_prefix)
    prefixes = [_group_prefix(output_prefix, s.name, shard) for s in sources]
    _check_output_names([out for prefix in prefixes for out in _outputs(prefix, keys, format)], format)
    with contextlib.ExitStack() as locks:
        for path in prefixes + [out for prefix in prefixes for out in _outputs(prefix, keys, format)]:
            locks.enter_context(exclusive_output(path, LOCK_WHAT))  # the group's state and each output pair
        use_threads(workers)
        if preload is None:
            preload = TokenizerPreload(tokenizer, tokenizer_backend, eod_token, inputs=inputs, keys=keys)
        locks.callback(preload.close)
        tok = load_tokenizer(tokenizer, eod_token, preload)
        if append_eod and tok.eod_id is None:
            raise InputError(message=f"{tok.path}: no end-of-document token found for --append-eod",
                             hint="pass --eod-token with the token your model uses, e.g. <|endoftext|>")
        all_files = [p for group in files for p in group]
        check = choose_backend(tok, tokenizer_backend, lambda: check_sample(all_files, keys), preload)
        options = _options(tok, keys, compat, append_eod, on_error, max_errors, batch_bytes, format, seq_length,
                           shard)
        options.confirm = check.confirm
        total = sum(p.size() for group in pieces for p in group)
        setup_s = time.perf_counter() - started
        try:
            summaries = _run_groups(sources, prefixes, pieces, tok, options, progress, total, resume)
        except BackendMismatch:  # nothing was kept; tok encodes with HF tokenizers now
            summaries = _run_groups(sources, prefixes, pieces, tok, options, progress, total, resume)
    tokens = [s.tokens for s in summaries]
    if weights is None:
        total = sum(tokens) or 1
        weights = [t / total for t in tokens]
    return PreprocessSummary(summaries, tok.path, tok.vocab_size, tok.eod_id, tok.eod_token, options.dtype.name,
                             compat, append_eod, list(weights), time.perf_counter() - started, format, seq_length,
                             tok.backend, tok.backend_note, [shard[1], shard[0]] if shard else None, setup_s)


def _run_groups(sources: list[Source], prefixes: list[str], pieces: list[list[Piece]], tok, options: RunOptions,
                progress: Progress, total: int, resume: bool) -> list[SourceSummary]:
    progress.start("preprocess", total=total)
    meter = Meter(progress)
    try:
        return [SourceRun(source.name, prefix, group, tok, options, meter).run(resume)
                for source, prefix, group in zip(sources, prefixes, pieces)]
    finally:
        progress.done()


def _group_prefix(output_prefix: str, name: str | None, shard: tuple[int, int] | None) -> str:
    prefix = output_prefix if name is None else f"{output_prefix}_{name}"
    return prefix if shard is None else f"{prefix}_{shard_name(*shard)}"


def _outputs(prefix: str, keys: list[str], format: str) -> list[str]:
    """What a group writes, by the name a --merge into it would lock: each key's pair (or .mindrecord)."""
    if format == "mindrecord":
        return [f"{prefix}_{key}.mindrecord" for key in keys]
    return [f"{prefix}_{key}_document" for key in keys]


def _options(tok, keys: list[str], compat: str, append_eod: bool, on_error: str, max_errors: int | None,
             chunk_bytes: int, format: str, seq_length: int | None, shard: tuple[int, int] | None) -> RunOptions:
    dtype = best_dtype(tok.vocab_size, compat) if format == "megatron" else np.dtype(np.int32)
    settings = {"keys": keys, "compat": compat, "append_eod": append_eod, "eod_id": tok.eod_id,
                "dtype": dtype.name, "tokenizer_sha256": TokenizerDigest(Path(tok.path)), "shard": list(shard or ())}
    sample_length = None
    if format == "mindrecord":
        sample_length = seq_length + 1
        settings["mindrecord_sample_length"] = sample_length
    return RunOptions(keys, dtype, compat, append_eod, on_error, max_errors, chunk_bytes, sample_length,
                      allow_empty=shard is not None, settings=settings)


def _check_format(format: str, seq_length: int | None, *, merge_only: bool, resume: bool,
                  weights: list[float] | None, shard: tuple[int, int] | None) -> None:
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
    for flag, given in (("--merge", merge_only), ("--resume", resume), ("--weights", weights is not None),
                        ("--num-shards", shard is not None)):
        if given:
            raise InputError(message=f"{flag} is not available with --format mindrecord",
                             hint="MindDataset reads its files in order without blending; a MindRecord file "
                             "cannot be appended to, so rerun the whole conversion")


def _merge(inputs: list[str], output_prefix: str, started: float) -> PreprocessSummary:
    prefixes = _merge_inputs(inputs)
    _check_writable(output_prefix)
    _check_output_names([output_prefix], "megatron")
    with exclusive_output(output_prefix, LOCK_WHAT):
        merged = merge(prefixes, output_prefix)
    idx, bin_ = data_paths(output_prefix)
    pair = OutputPair(output_prefix, "", len(merged), merged.document_count, merged.total_tokens,
                      bin_.stat().st_size, idx.stat().st_size)
    source = SourceSummary(None, output_prefix, prefixes, [pair], documents=merged.document_count)
    return PreprocessSummary([source], None, None, None, None, merged.dtype.name, "", False, [1.0],
                             time.perf_counter() - started)


def _merge_inputs(inputs: list[str]) -> list[str]:
    """Prefixes to merge, in order; a glob (matched against ``.idx`` files) expands sorted."""
    prefixes = []
    for item in inputs:
        item = re.sub(r"\.(bin|idx)$", "", item)
        if glob.has_magic(item) and not os.path.exists(item + ".idx"):
            matches = sorted(m.removesuffix(".idx") for m in glob.glob(item + ".idx"))
            if not matches:
                raise InputError(message=f"{item}: no .idx file matches this pattern", path=item,
                                 hint="give the prefixes without extension, e.g. 'data/wiki_shard*of4_text_document'")
            prefixes.extend(matches)
        else:
            prefixes.append(item)
    return prefixes


def _check_writable(text: str) -> None:
    """Fail before any work if the prefix names a directory (``-o .``, ``-o out/``: the prefix starts file names),
    or if the output directory cannot be created or written."""
    prefix = Path(text)
    if text.endswith(("/", os.sep)) or prefix.name in ("", ".", "..") or prefix.is_dir():
        raise InputError(message=f"--output-prefix {text!r} is a directory; the prefix starts the output file names",
                         path=text, hint=f"name the files inside it, e.g. --output-prefix "
                                         f"{os.path.join(text, 'corpus')} (writes corpus_text_document.bin/.idx)")
    probe = prefix.parent / f".{prefix.name}.mftk-write-test-{os.getpid()}"
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise InputError(message=f"{prefix.parent}: cannot write output ({exc.strerror or exc})",
                         path=str(prefix.parent), hint="choose a writable --output-prefix directory") from None


def _check_output_names(outputs: list[str], format: str) -> None:
    """An output file name already taken by a directory is refused by that name, before any work."""
    suffixes = ("",) if format == "mindrecord" else (".bin", ".idx")
    for out in outputs:
        for suffix in suffixes:
            if os.path.isdir(out + suffix):
                raise InputError(message=f"{out}{suffix} is a directory, so the output cannot be written there",
                                 path=out + suffix, hint="move that directory away, or choose another --output-prefix")


class TokenizerDigest:
    """The tokenizer.json's SHA-256, computed when a progress record first needs it (most runs save none)."""

    def __init__(self, path: Path) -> None:
        self.path, self._hex = path, None

    def __call__(self) -> str:
        if self._hex is None:
            import hashlib

            data = read_bytes(self.path, limit=LARGE_JSON_LIMIT, what="tokenizer file")
            self._hex = hashlib.sha256(data).hexdigest()
        return self._hex
