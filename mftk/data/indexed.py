"""Megatron "MMIDIDX" indexed datasets: the `.idx`/`.bin` pair, read and written.

Layout (reference megatron-data.md §1), all little-endian, no padding:
``magic(9) version:u64 dtype:u8 N:u64 D:u64 lengths:i32[N] pointers:i64[N] doc_idx:i64[D]``.
The `.bin` is the concatenation of every sequence's tokens in the `.idx` dtype.

The reader validates everything a wrong or truncated file could get wrong, because a
half-written `.bin` silently read as tokens would poison a training run. The writer writes
under temporary names and renames into place only in `finalize()`, so an interrupted run
never leaves a pair that looks complete.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import os
import secrets
import struct
import threading
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from mftk.data import sidecar
from mftk.errors import DataFormatError, InputError
from mftk.files import regular_file_or_error

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 34  # 9 magic + 8 version + 1 dtype + 8 N + 8 D

# DType enum shared by Megatron-LM and MindSpore Transformers.
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8), 2: np.dtype(np.int8), 3: np.dtype(np.int16), 4: np.dtype(np.int32),
    5: np.dtype(np.int64), 6: np.dtype(np.float64), 7: np.dtype(np.float32), 8: np.dtype(np.uint16),
}
CODE_FOR_DTYPE: dict[np.dtype, int] = {v: k for k, v in DTYPE_CODES.items()}

COMPAT_MODES = ("megatron", "mindformers")
# Megatron's DType.optimal_dtype: uint16 strictly below this vocab size, else int32.
UINT16_VOCAB_LIMIT = 65500
# A builder has the `.bin` written to disk in the background every SYNC_EVERY bytes (`BackgroundSync`).
SYNC_EVERY = 4 << 20


def best_dtype(vocab_size: int, compat: str) -> np.dtype:
    """Token dtype the reference preprocessing script of ``compat`` would write.

    Megatron picks uint16 below 65500 tokens (headroom under 65536) and int32 above;
    MindSpore Transformers always writes int32. Matching the rule is what makes our files
    byte-identical to theirs.
    """
    if compat == "megatron":
        return np.dtype(np.uint16) if vocab_size < UINT16_VOCAB_LIMIT else np.dtype(np.int32)
    if compat == "mindformers":
        return np.dtype(np.int32)
    raise ValueError(f"compat must be one of {COMPAT_MODES}, got {compat!r}")


def data_paths(path_prefix: str | os.PathLike) -> tuple[Path, Path]:
    """(`.idx`, `.bin`) paths of a prefix; the prefix is what a YAML `data_path` names."""
    prefix = os.fspath(path_prefix)
    return Path(prefix + ".idx"), Path(prefix + ".bin")


def encode_index(dtype: np.dtype, lengths: np.ndarray, document_indices: np.ndarray) -> bytes:
    """The complete `.idx` bytes for these sequence lengths and document boundaries."""
    dtype = np.dtype(dtype)
    lengths = np.ascontiguousarray(lengths, dtype="<i4")
    pointers = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= dtype.itemsize
    docs = np.ascontiguousarray(document_indices, dtype="<i8")
    header = MAGIC + struct.pack("<QBQQ", VERSION, CODE_FOR_DTYPE[dtype], len(lengths), len(docs))
    return header + lengths.tobytes() + pointers.tobytes() + docs.tobytes()


class IndexedDataset:
    """Read-only view of a `.idx`/`.bin` pair, both memory-mapped and fully validated on open.

    ``sequence_lengths`` (int32), ``sequence_pointers`` (int64 byte offsets) and
    ``document_indices`` (int64, documents + 1 entries) are views into the `.idx` map.
    """

    def __init__(self, path_prefix: str | os.PathLike) -> None:
        self.path_prefix = os.fspath(path_prefix)
        self.idx_path, self.bin_path = data_paths(path_prefix)
        for p in (self.idx_path, self.bin_path):
            if not p.is_file() and not (p.exists() and not p.is_dir()):  # a FIFO or device: _map names it
                raise InputError(
                    message=f"{p}: no such file" + (" (it is a directory)" if p.is_dir() else ""),
                    path=str(p),
                    hint="data_path names the prefix without extension, e.g. data/wiki_text_document "
                    "for data/wiki_text_document.bin/.idx; create the pair with 'mftk preprocess'",
                )
        self._idx = _map(self.idx_path)
        self._parse_index()
        self._bin = _map(self.bin_path)
        self._check_bin()
        self._stamps = {p: _stamp(p) for p in (self.idx_path, self.bin_path)}
        # tokens are read with pread, not through the map: a `.bin` truncated under the run then gives a short
        # read (an error naming it), where a read through the map would be a SIGBUS killing the process
        self._bin_file = open(self.bin_path, "rb", buffering=0) if len(self._bin) else None
        meta = sidecar.read_checked(self.path_prefix, self._idx, self._bin) or {}
        # The tokenizer's vocabulary size and the largest id, when mftk wrote the pair (`mftk.data.sidecar`).
        self.vocab_size: int | None = meta.get("vocab_size")
        self.max_id: int | None = meta.get("max_id")

    def check_unchanged(self) -> None:
        """DataFormatError when the `.bin` or `.idx` is no longer the file that was opened (size, modification
        time or inode changed): a truncated map is a SIGBUS at the next read, a rewritten one silently other
        tokens than this run's indices describe. Cheap (one stat per file): the training loader calls it
        before every micro-batch (`mftk.data.loader.DataLoader.check_files`)."""
        for path, was in self._stamps.items():
            now = _stamp(path)
            if now != was:
                raise DataFormatError(
                    message=f"{path}: changed while the run was reading it ({_what_changed(was, now)})",
                    path=str(path), expected=f"{was[0]} bytes", found=f"{now[0]} bytes" if now[0] >= 0 else "missing",
                    hint="a data file must stay as it is while a run reads it: put the original back (or write new "
                         "data under another prefix)")

    # -- validation -------------------------------------------------------------------
    def _bad(self, path: Path, message: str, *, offset: int | None = None, expected: str = "",
             found: str = "") -> DataFormatError:
        return DataFormatError(
            message=f"{path}: {message}", path=str(path), offset=offset, expected=expected, found=found,
            hint="the file is not a complete Megatron .idx/.bin pair; regenerate it with 'mftk preprocess'",
        )

    def _parse_index(self) -> None:
        buf, path = self._idx, self.idx_path
        size = len(buf)
        if size < HEADER_BYTES:
            raise self._bad(path, f"index is {size} bytes, shorter than the {HEADER_BYTES}-byte header "
                            "(truncated or empty)", expected=f">= {HEADER_BYTES} bytes", found=f"{size} bytes")
        magic = bytes(buf[:9])
        if magic != MAGIC:
            raise self._bad(path, f"not a Megatron index: magic is {magic!r}", offset=0,
                            expected=repr(MAGIC), found=repr(magic))
        version, code, n, d = struct.unpack_from("<QBQQ", buf, 9)
        if version != VERSION:
            raise self._bad(path, f"unsupported index version {version}", offset=9, expected="1",
                            found=str(version))
        if code not in DTYPE_CODES:
            raise self._bad(path, f"unknown token dtype code {code}", offset=17,
                            expected="one of " + ", ".join(map(str, DTYPE_CODES)), found=str(code))
        need = HEADER_BYTES + 12 * n + 8 * d
        if size < need:
            raise self._bad(path, f"index is truncated: {size} bytes, but its header ({n} sequences, "
                            f"{d} document indices) needs 34 + 12*{n} + 8*{d} = {need}",
                            expected=f"{need} bytes", found=f"{size} bytes")
        if d < 1:
            raise self._bad(path, "document index is empty (it must hold at least the leading 0)", offset=26,
                            expected=">= 1", found=str(d))
        self.dtype = DTYPE_CODES[code]
        self.sequence_lengths = np.frombuffer(buf, dtype="<i4", count=n, offset=HEADER_BYTES)
        self.sequence_pointers = np.frombuffer(buf, dtype="<i8", count=n, offset=HEADER_BYTES + 4 * n)
        self.document_indices = np.frombuffer(buf, dtype="<i8", count=d, offset=HEADER_BYTES + 12 * n)
        lengths, pointers, docs = self.sequence_lengths, self.sequence_pointers, self.document_indices
        if n and lengths.min() < 0:
            i = int(np.argmax(lengths < 0))
            raise self._bad(path, f"sequence {i} has negative length {lengths[i]}",
                            offset=HEADER_BYTES + 4 * i, expected=">= 0", found=str(lengths[i]))
        expected_ptr = np.zeros(n, dtype=np.int64)
        if n > 1:
            np.cumsum(lengths[:-1], dtype=np.int64, out=expected_ptr[1:])
        expected_ptr *= self.dtype.itemsize
        if not np.array_equal(pointers, expected_ptr):
            i = int(np.argmax(pointers != expected_ptr))
            raise self._bad(path, f"sequence {i} points to byte {pointers[i]}, but the lengths before it "
                            f"put it at byte {expected_ptr[i]}", offset=HEADER_BYTES + 4 * n + 8 * i,
                            expected=str(expected_ptr[i]), found=str(pointers[i]))
        if docs[0] != 0 or docs[-1] != n or (d > 1 and np.any(np.diff(docs) < 0)):
            raise self._bad(path, f"document indices must rise from 0 to the sequence count {n}; "
                            f"found first={docs[0]}, last={docs[-1]}", offset=HEADER_BYTES + 12 * n,
                            expected=f"0 .. {n}, non-decreasing", found=f"{docs[0]} .. {docs[-1]}")
        self.total_tokens = int(lengths.sum(dtype=np.int64))

    def _check_bin(self) -> None:
        expected = self.total_tokens * self.dtype.itemsize
        found = len(self._bin)
        if found != expected:
            kind = "truncated" if found < expected else "longer than its index says"
            raise self._bad(self.bin_path, f"token file is {kind}: {found} bytes, but {self.idx_path.name} "
                            f"describes {self.total_tokens} {self.dtype.name} tokens = {expected} bytes "
                            "(mismatched or partially written pair)",
                            expected=f"{expected} bytes", found=f"{found} bytes")

    # -- access -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def document_count(self) -> int:
        """Number of documents (one less than ``len(document_indices)``)."""
        return len(self.document_indices) - 1

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens of sequence ``idx`` from token ``offset``, ``length`` of them (None: to the end).

        Returns a read-only array in the file's dtype, read with ``pread`` (`check_unchanged` explains why).
        """
        n = len(self)
        if idx < 0:
            idx += n
        if not 0 <= idx < n:
            raise IndexError(f"sequence {idx} out of range for {n} sequences in {self.path_prefix}")
        size = int(self.sequence_lengths[idx])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) out of range for sequence {idx} "
                             f"of length {size} in {self.path_prefix}")
        start = int(self.sequence_pointers[idx]) + offset * self.dtype.itemsize
        nbytes = length * self.dtype.itemsize
        if nbytes == 0:
            return np.zeros(0, dtype=self.dtype.newbyteorder("<"))
        data = os.pread(self._bin_file.fileno(), nbytes, start)
        if len(data) != nbytes:
            self.check_unchanged()  # names how the file changed
            raise DataFormatError(message=f"{self.bin_path}: ended at byte {start + len(data)} while reading "
                                  f"sequence {idx} (it was {self._stamps[self.bin_path][0]} bytes when opened)",
                                  path=str(self.bin_path), hint="a data file must stay as it is while a run reads it")
        return np.frombuffer(data, dtype=self.dtype.newbyteorder("<"))

    def __getitem__(self, idx: int) -> np.ndarray:
        return self.get(idx)

    def __repr__(self) -> str:
        return (f"IndexedDataset({self.path_prefix!r}, sequences={len(self)}, documents={self.document_count}, "
                f"tokens={self.total_tokens}, dtype={self.dtype.name})")


def _stamp(path: Path) -> tuple[int, int, int, int]:
    """(size, mtime_ns, inode, device); (-1, ...) when the file is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1, -1)
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _what_changed(was: tuple[int, ...], now: tuple[int, ...]) -> str:
    if now[0] < 0:
        return "it was removed"
    if now[2:] != was[2:]:
        return "it was replaced by another file"
    if now[0] != was[0]:
        return f"{'truncated' if now[0] < was[0] else 'grown'} from {was[0]} to {now[0]} bytes"
    return "it was rewritten in place"


def _map(path: Path) -> memoryview | bytes:
    """Memory-map a file read-only; an empty file (which mmap refuses) reads as b''."""
    try:
        if regular_file_or_error(path, what=f"{path.suffix or 'data'} file").st_size == 0:
            return b""
        return memoryview(np.memmap(path, dtype=np.uint8, mode="r"))
    except OSError as exc:
        raise InputError(message=f"{path}: cannot read ({exc.strerror or exc})", path=str(path)) from None


def new_run_id() -> str:
    """A name part no other run shares: temporary files of two runs can never collide."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def remove_partials(path_prefix: str | os.PathLike, keep_run: str | None = None) -> None:
    """Delete the temporary files earlier (stopped) builders left for this prefix.

    ``keep_run`` spares those of the run being resumed. Only safe while holding the output's
    lock (`mftk.lock.exclusive_output`): then no other run can be writing them.
    """
    prefix = glob.escape(os.fspath(path_prefix))
    for part in (".bin", ".idx", ".lengths", ".docs"):
        for name in glob.glob(prefix + part + ".*partial"):
            if keep_run is None or name != f"{os.fspath(path_prefix)}{part}.{keep_run}.partial":
                with contextlib.suppress(OSError):
                    os.unlink(name)


def write_error(exc: OSError, path: str | os.PathLike) -> InputError:
    """An `InputError` (exit 2) for a failed write, naming the file and, for a full disk, what to do."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    reason = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
    return InputError(message=f"{os.fspath(path)}: cannot write ({reason})", path=os.fspath(path),
                      hint="free space on that filesystem (or raise the quota), or choose another "
                      "--output-prefix; nothing partial was kept" if full else
                      "check the output directory's permissions and filesystem")


class BackgroundSync:
    """Has a growing file written to disk on a thread every `SYNC_EVERY` bytes, while writing goes on.

    The final ``fsync`` (which `IndexedDatasetBuilder.finalize` needs before the rename, so that a crash
    can never leave a complete-looking pair with data still in memory) then finds little left to
    write: on the 2-core test machine a 23 MB `.bin` took 70 ms to sync at the end, all of it after
    the last token was encoded. A failed background sync (a full disk surfaces there with delayed
    allocation) is raised by the next `wrote` or `wait`.
    """

    def __init__(self, file) -> None:
        self._file = file
        self._unsynced = 0
        self._thread: threading.Thread | None = None
        self._error: OSError | None = None

    def wrote(self, nbytes: int) -> None:
        self._raise()
        self._unsynced += nbytes
        if self._unsynced < SYNC_EVERY or (self._thread is not None and self._thread.is_alive()):
            return
        self._file.flush()
        self._unsynced = 0
        self._thread = threading.Thread(target=self._sync, args=(self._file.fileno(),), name="mftk-sync",
                                        daemon=True)
        self._thread.start()

    def _sync(self, fd: int) -> None:
        try:
            getattr(os, "fdatasync", os.fsync)(fd)
        except OSError as exc:
            self._error = exc

    def wait(self) -> None:
        """Wait for a sync under way; raise what a finished one raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


class IndexedDatasetBuilder:
    """Writes a `.bin`/`.idx` pair under temporary names; ``finalize()`` renames both into place.

    Tokens go to ``<prefix>.bin.<run>.partial``; sequence lengths and document ends go to side
    files (``.lengths.<run>.partial``, ``.docs.<run>.partial``) rather than memory, so memory stays
    bounded for any corpus size and a run can be resumed from a ``checkpoint()``. ``<run>`` is
    unique per builder, so two writers never share a temporary file. Use as a context manager:
    an exception inside the block calls ``abort()``. Nothing ever carries the final names until
    the pair is complete. A failed write (full disk) removes every temporary file and raises
    `InputError`.
    """

    def __init__(self, path_prefix: str | os.PathLike, dtype: np.dtype | type, *,
                 resume: dict | None = None, vocab_size: int | None = None) -> None:
        self.path_prefix = os.fspath(path_prefix)
        self.vocab_size = vocab_size  # the tokenizer's, recorded in the sidecar (`mftk.data.sidecar`)
        self.max_id = -1  # the largest token id written
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_FOR_DTYPE:
            raise ValueError(f"dtype {self.dtype} has no Megatron dtype code")
        self._le = self.dtype.newbyteorder("<")
        self.idx_path, self.bin_path = data_paths(path_prefix)
        self.run_id = resume["run"] if resume and "run" in resume else new_run_id()
        tmp = f"{self.run_id}.partial"
        self.tmp_bin = Path(f"{self.path_prefix}.bin.{tmp}")
        self.tmp_idx = Path(f"{self.path_prefix}.idx.{tmp}")
        self.tmp_lengths = Path(f"{self.path_prefix}.lengths.{tmp}")
        self.tmp_docs = Path(f"{self.path_prefix}.docs.{tmp}")
        self.sequence_count = self.document_count = self.token_count = 0
        self._range = None
        if self.dtype.kind in "iu":
            info = np.iinfo(self.dtype)
            self._range = (int(info.min), int(info.max))
        self._files: list = []
        self._sync: BackgroundSync | None = None
        self._closed = False
        try:
            self.bin_path.parent.mkdir(parents=True, exist_ok=True)
            if resume is None:
                self._files = [open(p, "wb") for p in (self.tmp_bin, self.tmp_lengths, self.tmp_docs)]
            else:
                self._reopen(resume)
        except OSError as exc:
            self._close_files()
            raise InputError(message=f"{self.bin_path.parent}: cannot write output ({exc.strerror or exc})",
                             path=str(self.bin_path.parent),
                             hint="choose a writable --output-prefix directory") from None
        self._bin, self._lengths, self._docs = self._files
        self._sync = BackgroundSync(self._bin)

    def _reopen(self, state: dict) -> None:
        """Continue from a checkpoint: truncate the side files to the recorded sizes."""
        if np.dtype(state["dtype"]) != self.dtype:
            raise DataFormatError(message=f"{self.tmp_bin}: cannot resume, it was started as {state['dtype']}",
                                  path=str(self.tmp_bin), hint="rerun without --resume")
        sizes = (state["tokens"] * self.dtype.itemsize, state["sequences"] * 4, state["documents"] * 8)
        for p, size in zip((self.tmp_bin, self.tmp_lengths, self.tmp_docs), sizes):
            if not p.is_file() or p.stat().st_size < size:
                raise DataFormatError(
                    message=f"{p}: cannot resume, the partial file is missing or shorter than recorded "
                    f"({size} bytes)", path=str(p), expected=f">= {size} bytes",
                    hint="rerun without --resume to start over")
            f = open(p, "r+b")
            f.truncate(size)
            f.seek(size)
            self._files.append(f)
        self.token_count, self.sequence_count, self.document_count = (
            state["tokens"], state["sequences"], state["documents"])
        self.max_id = state["max_id"] if "max_id" in state else _max_token(self.tmp_bin, self.dtype)

    def __enter__(self) -> IndexedDatasetBuilder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._closed:
            self.abort()

    def add_document(self, sequences: Sequence[np.ndarray]) -> None:
        """Append one document made of ``sequences`` (zero or more token arrays)."""
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int32, count=len(sequences))
        tokens = np.concatenate(sequences) if len(sequences) else np.zeros(0, self.dtype)
        self.add_batch(tokens, lengths, np.array([len(sequences)], dtype=np.int64))

    def add_batch(self, tokens: np.ndarray, lengths: np.ndarray, sequences_per_document: np.ndarray) -> None:
        """Append many documents at once: the fast path for preprocessing.

        ``tokens`` is every token of the batch, ``lengths`` the length of each sequence, and
        ``sequences_per_document`` how many consecutive sequences make each document.
        """
        self._check_open()
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int32)
        per_doc = np.asarray(sequences_per_document, dtype=np.int64)
        if int(lengths.sum(dtype=np.int64)) != len(tokens):
            raise ValueError(f"sequence lengths add up to {int(lengths.sum())}, but {len(tokens)} tokens given")
        if int(per_doc.sum()) != len(lengths):
            raise ValueError("sequences_per_document does not add up to the number of sequences")
        if len(tokens) and self._range is not None:
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < self._range[0] or hi > self._range[1]:
                raise ValueError(f"token id {hi if hi > self._range[1] else lo} does not fit in {self.dtype.name}")
            self.max_id = max(self.max_id, hi)
        with self._writing():
            data = np.ascontiguousarray(tokens, dtype=self._le).data
            self._bin.write(data)
            self._lengths.write(np.ascontiguousarray(lengths, dtype="<i4").data)
            self._docs.write((self.sequence_count + np.cumsum(per_doc)).astype("<i8").data)
            self._sync.wrote(data.nbytes)
        self.sequence_count += len(lengths)
        self.document_count += len(per_doc)
        self.token_count += len(tokens)

    def add_index(self, path_prefix: str | os.PathLike, *, chunk_bytes: int = 64 << 20) -> None:
        """Append every document of an existing pair (byte copy of its `.bin`); dtypes must match."""
        src = IndexedDataset(path_prefix)
        if src.dtype != self.dtype:
            raise DataFormatError(
                message=f"{src.path_prefix}: tokens are {src.dtype.name}, but the merged output is "
                f"{self.dtype.name}", path=str(src.idx_path), expected=self.dtype.name, found=src.dtype.name,
                hint="merge only prefixes written with the same --compat and tokenizer vocabulary size")
        self._check_open()
        data = src._bin
        if src.total_tokens:
            self.max_id = max(self.max_id, src.max_id if src.max_id is not None else _max_token(src.bin_path,
                                                                                                 src.dtype))
        with self._writing():
            for start in range(0, len(data), chunk_bytes):
                part = data[start:start + chunk_bytes]
                self._bin.write(part)
                self._sync.wrote(len(part))
            self._lengths.write(np.ascontiguousarray(src.sequence_lengths, dtype="<i4").data)
            self._docs.write((self.sequence_count + np.asarray(src.document_indices[1:], dtype=np.int64))
                             .astype("<i8").data)
        self.sequence_count += len(src)
        self.document_count += src.document_count
        self.token_count += src.total_tokens

    def checkpoint(self) -> dict:
        """Flush everything to disk and return the state ``IndexedDatasetBuilder(resume=...)`` takes."""
        self._flush(durable=self._files)
        return {"dtype": self.dtype.name, "tokens": self.token_count, "sequences": self.sequence_count,
                "documents": self.document_count, "run": self.run_id, "max_id": self.max_id}

    def _flush(self, durable: list) -> None:
        """Hand every file's buffer to the OS, and have ``durable`` ones on disk (``fsync``)."""
        self._check_open()
        with self._writing():
            self._sync.wait()
            for f in self._files:
                f.flush()
            for f in durable:
                os.fsync(f.fileno())

    def finalize(self) -> None:
        """Write the `.idx`, then rename `.bin` and `.idx` into place (in that order).

        Only the `.bin` and the `.idx` are synced to disk: the side files are read back from the page
        cache here and deleted (a progress record's `checkpoint` syncs them)."""
        self._flush(durable=[self._bin])
        try:
            self._close_files()
            lengths = np.fromfile(self.tmp_lengths, dtype="<i4")
            docs = np.concatenate([np.zeros(1, np.int64), np.fromfile(self.tmp_docs, dtype="<i8")])
            with open(self.tmp_idx, "wb") as f:
                f.write(encode_index(self.dtype, lengths, docs))
                f.flush()
                os.fsync(f.fileno())
            # Remove a stale .idx (and its sidecar) first so an old index never pairs with the new .bin.
            sidecar.remove(self.path_prefix)
            self.idx_path.unlink(missing_ok=True)
            os.replace(self.tmp_bin, self.bin_path)
            os.replace(self.tmp_idx, self.idx_path)
            sidecar.write(self.path_prefix, vocab_size=self.vocab_size,
                          max_id=self.max_id if self.token_count else None)
        except OSError as exc:
            self.abort()
            raise write_error(exc, self._user_path(exc)) from None
        except BaseException:
            self.abort()
            raise
        self._remove(self.tmp_lengths, self.tmp_docs)
        self._closed = True

    def close(self) -> None:
        """Stop writing but keep the partial files, so a later run can resume from a checkpoint."""
        self._close_files()
        self._closed = True

    def abort(self) -> None:
        """Close and delete the temporary files; the final names are left untouched."""
        self._close_files()
        self._remove(self.tmp_bin, self.tmp_idx, self.tmp_lengths, self.tmp_docs)
        self._closed = True

    @contextlib.contextmanager
    def _writing(self):
        """A failed write (ENOSPC, EIO...) removes every temporary file and becomes an `InputError`."""
        try:
            yield
        except OSError as exc:
            self.abort()
            raise write_error(exc, self._user_path(exc)) from None

    def _user_path(self, exc: OSError) -> Path:
        """The file a failed write concerns, by the name the user gave (never a temporary ``.partial`` name):
        a rename's target, else the final name of the temporary file that failed, else the ``.bin``."""
        finals = {str(self.tmp_bin): self.bin_path, str(self.tmp_idx): self.idx_path}
        for name in (exc.filename2, exc.filename):
            if name is not None:
                name = os.fspath(name)
                return finals.get(name) or (self.bin_path if name.endswith(".partial") else Path(name))
        return self.bin_path

    def _close_files(self) -> None:
        """Close every file; a close that fails (its last flush hits a full disk) still closes it."""
        if self._sync is not None:
            with contextlib.suppress(OSError):
                self._sync.wait()  # not while a sync of the file runs
        for f in self._files:
            if not f.closed:
                with contextlib.suppress(OSError):
                    f.close()

    @staticmethod
    def _remove(*paths: Path) -> None:
        for p in paths:
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"builder for {self.path_prefix} is already finalized or closed")


def merge(prefixes: Iterable[str | os.PathLike], output_prefix: str | os.PathLike) -> IndexedDataset:
    """Concatenate existing pairs into one, in order (Megatron's ``add_index``)."""
    prefixes = list(prefixes)
    if not prefixes:
        raise InputError(message="nothing to merge: give at least one input prefix")
    first = IndexedDataset(prefixes[0])
    vocabs = {IndexedDataset(p).vocab_size for p in prefixes}
    with IndexedDatasetBuilder(output_prefix, first.dtype,
                               vocab_size=vocabs.pop() if len(vocabs) == 1 else None) as builder:
        for prefix in prefixes:
            builder.add_index(prefix)
        builder.finalize()
    return IndexedDataset(output_prefix)


def _max_token(path: Path, dtype: np.dtype, chunk: int = 1 << 24) -> int:
    """The largest token id in a `.bin` (read in chunks): for pairs and partial files without a record."""
    data = np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r") if path.stat().st_size else []
    return max((int(data[i:i + chunk].max()) for i in range(0, len(data), chunk)), default=-1)
