"""MindRecord pretraining data: the `MindDataset` path of MindSpore Transformers (reference megatron-data.md §8).

Format convention (what MF's ``llama_preprocess.py``-style scripts write and its models read):
each record holds one int32 ``input_ids`` column of exactly ``seq_length + 1`` tokens. Documents
are tokenized in input order (EOD appended after each when asked), concatenated into one token
stream and cut into consecutive, non-overlapping pieces of ``seq_length + 1`` tokens; a document
may therefore continue from one sample into the next, and the final partial piece is dropped
(its size is reported). The model reads ``input_ids[:-1]`` as inputs and ``input_ids[1:]`` as
labels. Unlike GPTDataset there is no index, no document shuffle and no blending: files are
read in the order given and samples in file order.

MindSpore is imported lazily, only by the functions that write or read the files, so that the
Megatron path and ``mftk --help`` never load it. Reading loads every sample into memory
(4 bytes per token) because the loader needs random access for data-parallel shards and resume.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from mftk.data.gpt_dataset import SampleOptions, make_sample
from mftk.errors import ConfigError, DataFormatError, InputError, Problem
from mftk.files import open_regular
from mftk.progress import NULL_PROGRESS, Progress

LOADER_TYPE = "MindDataset"
COLUMN = "input_ids"
SCHEMA = {COLUMN: {"type": "int32", "shape": [-1]}}
SCHEMA_DESC = "mftk_pretrain"
_WRITE_CHUNK = 1024  # samples per write_raw_data call
_LOADER = "train_dataset.dataloader"


def output_path(prefix: str) -> Path:
    """``<prefix>.mindrecord`` (a prefix already ending in .mindrecord is kept as is)."""
    return Path(prefix if prefix.endswith(".mindrecord") else prefix + ".mindrecord")


def remove_partial_dirs(path: Path) -> None:
    """Delete the temporary directories of earlier (stopped) writers of ``path``; hold its lock."""
    import glob

    for name in glob.glob(os.path.join(glob.escape(str(path.parent)), glob.escape(f".{path.name}.") + "*.partial")):
        shutil.rmtree(name, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------
@attrs.define
class MindRecordOutput:
    """What a finished writer produced."""

    path: str
    samples: int
    documents: int
    tokens: int  # tokens stored (samples · sample_length)
    dropped_tokens: int  # the final partial sample, not written
    file_bytes: int
    db_bytes: int


class MindRecordBuilder:
    """Packs documents into ``sample_length``-token records, written by MindSpore's ``FileWriter``.

    Same batch interface as ``IndexedDatasetBuilder`` so the preprocess pipeline drives either.
    FileWriter stores the file's own name inside it, so the output is written under its final
    name in a hidden temporary directory next to it (named uniquely per run) and both files
    (``X.mindrecord`` and its SQLite index ``X.mindrecord.db``) are moved into place only after
    ``commit``, the data file last: a ``.mindrecord`` at the final path is always complete.
    """

    def __init__(self, path: str | os.PathLike, sample_length: int) -> None:
        from mindspore.mindrecord import FileWriter

        self.path = Path(path)
        self.path_prefix = str(self.path)
        self.sample_length = int(sample_length)
        from mftk.data.indexed import new_run_id

        self.tmp_dir = self.path.parent / f".{self.path.name}.{new_run_id()}.partial"  # unique per run
        self.tmp_dir.mkdir(parents=True)
        self._writer = FileWriter(str(self.tmp_dir / self.path.name), shard_num=1, overwrite=True)
        self._writer.add_schema(SCHEMA, SCHEMA_DESC)
        self._carry = np.zeros(0, np.int64)
        self.token_count = self.document_count = self.sample_count = 0
        self._done = False

    def add_batch(self, tokens: np.ndarray, lengths: np.ndarray, sequences_per_document: np.ndarray) -> None:
        """Append one batch of documents (flat tokens in document order) to the stream."""
        tokens = np.asarray(tokens)
        if len(tokens) and (tokens.min() < 0 or tokens.max() > np.iinfo(np.int32).max):
            raise ValueError(f"token id {int(tokens.max())} does not fit the int32 input_ids column")
        self.token_count += len(tokens)
        self.document_count += len(sequences_per_document)
        stream = np.concatenate((self._carry, tokens.astype(np.int64, copy=False)))
        n = len(stream) // self.sample_length
        samples = stream[: n * self.sample_length].astype(np.int32).reshape(n, self.sample_length)
        self._carry = stream[n * self.sample_length:]
        for i in range(0, n, _WRITE_CHUNK):
            self._writer.write_raw_data([{COLUMN: s} for s in samples[i:i + _WRITE_CHUNK]])
        self.sample_count += n

    def checkpoint(self) -> dict:
        return {}  # not resumable: a MindRecord file cannot be appended to after commit

    def finalize(self) -> MindRecordOutput:
        if self.sample_count == 0:
            self.abort()
            raise DataFormatError(
                message=f"{self.path}: only {self.token_count} tokens, fewer than one sample of "
                f"seq_length + 1 = {self.sample_length} tokens", path=str(self.path),
                expected=f">= {self.sample_length} tokens", found=str(self.token_count),
                hint="lower --seq-length or add data")
        self._writer.commit()
        self._done = True
        db = self.path.with_name(self.path.name + ".db")
        mask = os.umask(0)
        os.umask(mask)
        for f in (self.tmp_dir / db.name, self.tmp_dir / self.path.name):
            os.chmod(f, 0o666 & ~mask)  # FileWriter creates 0600 files; give them the usual permissions
        os.replace(self.tmp_dir / db.name, db)
        os.replace(self.tmp_dir / self.path.name, self.path)  # last: its presence means complete
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        return MindRecordOutput(str(self.path), self.sample_count, self.document_count,
                                self.sample_count * self.sample_length, len(self._carry),
                                self.path.stat().st_size, db.stat().st_size)

    def abort(self) -> None:
        """Drop everything written so far (the final path is never touched)."""
        if not self._done:
            self._done = True
            try:
                self._writer.commit()  # releases the writer's files before they are removed
            except Exception:  # noqa: BLE001 - nothing to keep either way
                pass
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    close = abort  # no partial state worth keeping: the preprocess run cannot resume this format


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------
def _config_error(path: str, message: str, value: Any = None, hint: str = "") -> ConfigError:
    return ConfigError(message=f"{path}: {message}",
                       problems=[Problem(path=path, message=message, value=value, hint=hint)])


def _is_data_file(p: Path) -> bool:
    return ".mindrecord" in p.name and not p.name.endswith(".db") and not p.name.startswith(".")


def find_files(entries: list[str], yaml_path: str) -> list[Path]:
    """Files named by ``dataset_files`` / ``dataset_dir``: files as given, directories searched
    recursively for ``*.mindrecord*`` (not ``.db``, not hidden), sorted; no duplicates."""
    files: list[Path] = []
    for i, entry in enumerate(entries):
        where = f"{yaml_path}[{i}]" if yaml_path.endswith("files") else yaml_path
        p = Path(str(entry))
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and _is_data_file(q)
                           and not any(part.endswith(".partial") for part in q.relative_to(p).parts))
            if not found:
                raise _config_error(where, f"no .mindrecord file under directory {p}", str(entry),
                                    "write one with: mftk preprocess --format mindrecord --seq-length N ...")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise _config_error(where, f"file not found: {p}", str(entry),
                                "check the path (relative paths are relative to the working directory)")
    unique, seen = [], set()
    for f in files:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append(f)
    return unique


def _check_header(path: Path) -> None:
    """Cheap format check before MindSpore's reader, whose errors name neither file nor cause well."""
    try:
        with open_regular(path, what="MindRecord file") as f:
            head = f.read(24)
    except OSError as exc:
        raise InputError(message=f"{path}: cannot read ({exc.strerror or exc})", path=str(path)) from None
    if len(head) < 24 or not head[8:].startswith(b'{"header_size"'):
        raise DataFormatError(message=f"{path}: not a MindRecord file", path=str(path),
                              expected="a MindRecord header", found=repr(head[:16]),
                              hint="MindDataset reads files written by mindspore.mindrecord.FileWriter "
                              "(mftk preprocess --format mindrecord); Megatron .bin/.idx data needs "
                              "type: BlendedMegatronDatasetDataLoader")
    db = path.with_name(path.name + ".db")
    if not db.is_file():
        raise DataFormatError(message=f"{path}: its index file {db.name} is missing", path=str(db),
                              hint="a MindRecord file is read with the .db written next to it; copy both")


def read_samples(path: str | os.PathLike, *, expected_length: int | None = None,
                 length_from: str = f"{_LOADER}.config.seq_length") -> np.ndarray:
    """All ``input_ids`` records of one MindRecord file as an int32 array (samples, length).

    ``expected_length`` (seq_length + 1) is checked on every record; a mismatch is a ConfigError
    on ``length_from``, the YAML key that set it.
    """
    from mindspore.mindrecord import FileReader

    path = Path(path)
    _check_header(path)
    try:
        reader = FileReader([str(path)], num_consumer=max(1, min(4, os.cpu_count() or 1)))
    except Exception as exc:  # noqa: BLE001 - MindSpore raises RuntimeError with a multi-line report
        raise DataFormatError(message=f"{path}: MindSpore cannot open it ({_first_line(exc)})",
                              path=str(path), hint="the file may be truncated; rewrite it") from None
    try:
        schema = reader.schema()
        if COLUMN not in schema:
            raise DataFormatError(message=f"{path}: no {COLUMN} column (columns: {', '.join(sorted(schema))})",
                                  path=str(path), expected=f"an int32 {COLUMN} column", found=str(schema),
                                  hint="write pretraining data with mftk preprocess --format mindrecord")
        count = reader.len()
        rows: list[np.ndarray] = []
        try:
            for i, item in enumerate(reader.get_next()):
                row = np.asarray(item[COLUMN]).reshape(-1)
                want = expected_length if expected_length is not None else (len(rows[0]) if rows else len(row))
                if len(row) != want:
                    raise _length_error(path, i, len(row), want, length_from if expected_length else None)
                rows.append(row)
        except (DataFormatError, ConfigError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise DataFormatError(message=f"{path}: MindSpore cannot read it ({_first_line(exc)})",
                                  path=str(path), hint="the file may be truncated; rewrite it") from None
    finally:
        reader.close()
    if len(rows) != count:
        raise DataFormatError(message=f"{path}: header lists {count} samples but {len(rows)} were read",
                              path=str(path), hint="the file may be truncated; rewrite it")
    if not rows:
        raise DataFormatError(message=f"{path}: holds no sample", path=str(path), hint="rewrite it with data")
    return np.stack(rows).astype(np.int32, copy=False)


def _length_error(path: Path, record: int, found: int, want: int, key: str | None) -> Exception:
    if key is not None:
        return _config_error(key,
                             f"{path} holds samples of {found} tokens (seq_length {found - 1}), but seq_length "
                             f"{want - 1} needs {want} (record {record})", want - 1,
                             f"set seq_length: {found - 1}, or rewrite the data with "
                             f"mftk preprocess --format mindrecord --seq-length {want - 1}")
    return DataFormatError(message=f"{path}: record {record} has {found} tokens, earlier records {want}",
                           path=str(path), expected=f"{want} tokens", found=str(found),
                           hint="every MindDataset sample must have seq_length + 1 tokens")


def _first_line(exc: BaseException) -> str:
    """MindSpore's own reason: the ``[ERROR]`` line of its multi-line report, else the first line."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    reason = next((ln for ln in lines if ln.startswith("[ERROR]")), lines[0])
    return reason.removeprefix("[ERROR]").strip()[:300]


class MindRecordDataset:
    """Samples of one or more MindRecord files, in file order, as GPTDataset-shaped dicts."""

    def __init__(self, files: list[str], samples: list[np.ndarray], options: SampleOptions) -> None:
        self.files = files
        self.samples = samples
        self.options = options
        self.offsets = np.cumsum([0] + [len(s) for s in samples])
        self.size = int(self.offsets[-1])
        self.weights = [len(s) / self.size for s in samples] if self.size else []
        self.datasets = samples

    def __len__(self) -> int:
        return self.size

    def source(self, i: int) -> tuple[int, int]:
        """(file number, record number inside that file) of sample ``i``."""
        if not 0 <= i < self.size:
            raise IndexError(f"sample {i} out of range for {self.size} samples")
        f = int(np.searchsorted(self.offsets, i, side="right") - 1)
        return f, int(i - self.offsets[f])

    def text(self, i: int) -> np.ndarray:
        f, j = self.source(i)
        return self.samples[f][j].astype(np.int64)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return make_sample(self.text(i), self.options)


def sample_options(dataloader: Any, seq_length: int | None) -> tuple[SampleOptions | None, Any, str]:
    """(options, options-for-a-length function, YAML key of seq_length) from ``dataloader.config``;
    options is None when seq_length is unknown (neither the section nor the model gives it).

    ``create_attention_mask`` is off: MindDataset feeds only input_ids and the model builds its own
    causal mask.
    """
    from mftk.config.sections import DatasetConfig

    cfg = dataloader.config if dataloader.config is not None else DatasetConfig()
    seq, where = cfg.seq_length, f"{_LOADER}.config.seq_length"
    if seq is None:
        seq, where = seq_length, "model.seq_length"

    def options(length: int) -> SampleOptions:
        return SampleOptions(seq_length=length, eod=cfg.eod, pad=cfg.pad, eod_mask_loss=cfg.eod_mask_loss,
                             reset_position_ids=cfg.reset_position_ids, reset_attention_mask=cfg.reset_attention_mask,
                             create_attention_mask=False,
                             create_compressed_eod_mask=bool(cfg.create_compressed_eod_mask),
                             eod_pad_length=cfg.eod_pad_length)

    return (options(seq) if seq is not None else None), options, where


def build_mindrecord_dataset(dataloader: Any, *, seq_length: int | None = None,
                             progress: Progress = NULL_PROGRESS) -> tuple[MindRecordDataset, list[str]]:
    """Read every file of ``dataset_files`` (or ``dataset_dir``) into a MindRecordDataset.

    ``seq_length`` (the model's) is used when the section has no ``config.seq_length``; without
    either, it is taken from the data (all files must agree). Returns (dataset, warnings).
    """
    if dataloader.dataset_files:
        files = find_files(list(dataloader.dataset_files), f"{_LOADER}.dataset_files")
    else:  # the config rules require one of the two
        files = find_files([dataloader.dataset_dir], f"{_LOADER}.dataset_dir")
    warnings: list[str] = []
    options, make_options, where = sample_options(dataloader, seq_length)
    want = options.seq_length + 1 if options is not None else None
    samples = []
    progress.start("read MindRecord", total=len(files))
    try:
        for f in files:
            if options is not None:
                samples.append(read_samples(f, expected_length=want, length_from=where))
            else:  # length taken from the data: the files must agree with the first
                samples.append(read_samples(f))
                want = want or samples[0].shape[1]
            if samples[-1].shape[1] != want:
                raise DataFormatError(message=f"{f}: samples of {samples[-1].shape[1]} tokens, but {files[0]} has "
                                      f"{want}", path=str(f), hint="all MindDataset files need the same seq_length")
            progress.advance(1)
    finally:
        progress.done()
    if options is None:
        options = make_options(want - 1)
        warnings.append(f"seq_length not given; {want - 1} taken from the data")
    return MindRecordDataset([str(f) for f in files], samples, options), warnings
