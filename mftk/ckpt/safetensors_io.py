"""Safetensors files with numpy only: header parsing that trusts nothing, tensor reads, and writes.

Format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``),
then the data region; offsets are relative to the start of the data region.

We parse headers ourselves (rather than with the ``safetensors`` package) so that
``inspect-ckpt`` never touches tensor data, can report *every* problem of a hostile file
at once, and understands dtypes numpy lacks (BF16, F8) for size arithmetic.
BF16 tensors are returned as float32 (exact: bf16 is the top half of an fp32); write them
with :func:`to_bf16`.
"""
from __future__ import annotations

import json
import math
import os
import struct
import zlib
from typing import Any, BinaryIO, Iterable, Mapping

import attrs
import numpy as np

from mftk.errors import CheckpointError
from mftk.files import open_regular, parse_json

# safetensors dtype → (bytes per element, numpy dtype or None when numpy cannot hold it)
DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (1, "bool"), "U8": (1, "<u1"), "I8": (1, "<i1"),
    "F8_E4M3": (1, None), "F8_E5M2": (1, None),
    "U16": (2, "<u2"), "I16": (2, "<i2"), "F16": (2, "<f2"), "BF16": (2, None),
    "U32": (4, "<u4"), "I32": (4, "<i4"), "F32": (4, "<f4"),
    "U64": (8, "<u8"), "I64": (8, "<i8"), "F64": (8, "<f8"),
}
_NUMPY_TO_ST = {np.dtype(v).newbyteorder("<").str: k for k, (_, v) in DTYPES.items() if v}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors package's own limit
_ALIGN = 8
# ``__metadata__`` key holding every tensor's CRC-32 (zlib's, of its data bytes) as JSON {name: "8 hex digits"}.
# Other readers (the safetensors package, MindSpore) ignore metadata keys they do not know.
CHECKSUM_KEY = "mftk_crc32"


@attrs.frozen
class TensorInfo:
    """One header entry; ``begin``/``end`` are relative to the data region."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@attrs.frozen
class SafetensorsHeader:
    """What a file's header says, checked against the file's length."""

    path: str
    header_bytes: int
    file_bytes: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]

    @property
    def data_start(self) -> int:
        return 8 + self.header_bytes

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


@attrs.frozen
class Bf16:
    """A bf16 tensor for writing: the raw upper 16 bits of each fp32 value (see :func:`to_bf16`)."""

    bits: np.ndarray  # uint16, any shape


def to_bf16(x: np.ndarray) -> Bf16:
    """Round fp32 to bf16 (round-to-nearest-even, NaN kept NaN), as frameworks cast."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return Bf16(bits=rounded)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Exact widening: a bf16 is the upper half of an fp32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Parse and check a header without reading tensor data; every problem found goes in one error."""
    p = str(path)
    try:
        with open_regular(p, error=CheckpointError, what="safetensors file") as fh:
            file_bytes = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            if len(head) < 8:
                raise _bad(p, f"file is {file_bytes} bytes, too short for the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > file_bytes - 8:
                raise _bad(p, f"header length {n} runs past the end of the file ({file_bytes} bytes): truncated or not safetensors")
            if n > MAX_HEADER_BYTES:
                raise _bad(p, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
            raw = fh.read(n)
    except OSError as exc:
        raise CheckpointError(message=f"cannot read {p}: {exc.strerror or exc}", path=p) from None
    try:
        obj = parse_json(raw, where="header", error=CheckpointError)
    except CheckpointError as exc:
        raise _bad(p, f"header is not UTF-8 JSON ({exc.message.removeprefix('header: ')})") from None
    if not isinstance(obj, dict):
        raise _bad(p, f"header is JSON {type(obj).__name__}, expected an object")
    return _check_header(p, n, file_bytes, obj)


def _bad(path: str, problem: str) -> CheckpointError:
    return CheckpointError(message=f"{path}: not a valid safetensors file", path=path, problems=[problem],
                           hint="the file is damaged or was not written completely; use an earlier checkpoint")


def _check_header(p: str, n: int, file_bytes: int, obj: dict[str, Any]) -> SafetensorsHeader:
    problems: list[str] = []
    meta = obj.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        problems.append("__metadata__ must map strings to strings")
        meta = {}
    data_bytes = file_bytes - 8 - n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in obj.items():
        info = _check_entry(name, entry, data_bytes, problems)
        if info is not None:
            tensors[name] = info
    problems += _check_packing(list(tensors.values()), data_bytes)
    if problems:
        raise CheckpointError(message=f"{p}: {len(problems)} problem(s) in the safetensors header", path=p,
                              problems=problems, hint="the file is damaged; use an earlier checkpoint")
    return SafetensorsHeader(path=p, header_bytes=n, file_bytes=file_bytes, tensors=tensors, metadata=dict(meta))


def _check_entry(name: str, entry: Any, data_bytes: int, problems: list[str]) -> TensorInfo | None:
    if not isinstance(entry, dict):
        problems.append(f"{name}: entry is not an object")
        return None
    dtype, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPES:
        problems.append(f"{name}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        return None
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        problems.append(f"{name}: shape {shape!r} is not a list of non-negative integers")
        return None
    if not (isinstance(offs, list) and len(offs) == 2 and all(_is_uint(o) for o in offs)):
        problems.append(f"{name}: data_offsets {offs!r} is not [begin, end]")
        return None
    begin, end = offs
    expected = math.prod(shape) * DTYPES[dtype][0]
    if end < begin or end - begin != expected:
        problems.append(f"{name}: data_offsets [{begin}, {end}] hold {end - begin} bytes, "
                        f"but {dtype}{list(shape)} needs {expected}")
        return None
    if end > data_bytes:
        problems.append(f"{name}: data ends at {end}, past the {data_bytes}-byte data region (file truncated?)")
        return None
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_packing(infos: list[TensorInfo], data_bytes: int) -> list[str]:
    """Tensors must tile the data region: no overlap (two names sharing bytes), no hole, no tail."""
    problems: list[str] = []
    pos, prev = 0, None
    for t in sorted(infos, key=lambda t: (t.begin, t.end)):
        if t.begin < pos:
            problems.append(f"{t.name}: bytes [{t.begin}, {t.end}) overlap {prev}")
        elif t.begin > pos:
            problems.append(f"{t.name}: {t.begin - pos} unused bytes before it (at {pos})")
        pos, prev = max(pos, t.end), t.name
    if infos and pos != data_bytes:
        problems.append(f"data region is {data_bytes} bytes but tensors end at {pos}")
    return problems


def read_tensors(path: str | os.PathLike, names: Iterable[str] | None = None,
                 header: SafetensorsHeader | None = None) -> dict[str, np.ndarray]:
    """Read tensors (all, or ``names``) as numpy arrays; BF16 comes back as float32."""
    h = header or read_header(path)
    wanted = list(h.tensors) if names is None else list(names)
    missing = [n for n in wanted if n not in h.tensors]
    if missing:
        raise CheckpointError(message=f"{h.path}: {len(missing)} tensor(s) not in file", path=h.path,
                              problems=[f"missing: {n}" for n in missing[:20]])
    out: dict[str, np.ndarray] = {}
    with open_regular(h.path, error=CheckpointError, what="safetensors file") as fh:
        for name in wanted:
            out[name] = _read_one(fh, h, h.tensors[name])
    return out


def _read_one(fh: BinaryIO, h: SafetensorsHeader, t: TensorInfo) -> np.ndarray:
    return decode(h, t, read_tensor_bytes(fh, h, t))


def decode(h: SafetensorsHeader, t: TensorInfo, buf: bytes) -> np.ndarray:
    """A tensor's bytes as a numpy array (BF16 widened to float32)."""
    size, np_dtype = DTYPES[t.dtype]
    if t.dtype == "BF16":
        return bf16_to_float32(np.frombuffer(buf, dtype="<u2")).reshape(t.shape)
    if np_dtype is None:
        raise CheckpointError(message=f"{h.path}: {t.name} has dtype {t.dtype}, which numpy cannot read",
                              path=h.path)
    return np.frombuffer(buf, dtype=np_dtype).reshape(t.shape).copy()


def _st_dtype(arr: np.ndarray | Bf16) -> str:
    if isinstance(arr, Bf16):
        return "BF16"
    key = arr.dtype.newbyteorder("<").str
    if key not in _NUMPY_TO_ST:
        raise ValueError(f"numpy dtype {arr.dtype} has no safetensors equivalent")
    return _NUMPY_TO_ST[key]


def _as_bytes(arr: np.ndarray | Bf16) -> memoryview:
    a = arr.bits.astype("<u2", copy=False) if isinstance(arr, Bf16) else arr
    if not isinstance(arr, Bf16) and a.dtype != np.bool_:
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return memoryview(np.ascontiguousarray(a)).cast("B")


def crc32(data: bytes | memoryview) -> str:
    """The checksum recorded for one tensor's bytes: zlib's CRC-32 as 8 hex digits (about 0.35 s per GB here;
    bench/ckpt_checksum.py)."""
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def recorded_checksums(h: SafetensorsHeader) -> dict[str, str] | None:
    """The CRC-32 of each tensor as the writer recorded it, or None for a file written without checksums
    (by mftk before it recorded them, or by another tool). A damaged record is an error."""
    raw = h.metadata.get(CHECKSUM_KEY)
    if raw is None:
        return None
    try:
        sums = json.loads(raw)
        if not isinstance(sums, dict) or not all(isinstance(v, str) and len(v) == 8 for v in sums.values()):
            raise ValueError("not an object of 8-digit hex strings")
    except ValueError as exc:
        raise _bad(h.path, f"__metadata__[{CHECKSUM_KEY!r}] is unreadable ({exc})") from None
    return sums


def read_tensor_bytes(fh: BinaryIO, h: SafetensorsHeader, t: TensorInfo) -> bytes:
    """One tensor's raw data bytes, as stored."""
    fh.seek(h.data_start + t.begin)
    buf = fh.read(t.nbytes)
    if len(buf) != t.nbytes:
        raise _bad(h.path, f"{t.name}: file ended while reading its data (truncated)")
    return buf


def encode_header(tensors: Mapping[str, np.ndarray | Bf16], metadata: Mapping[str, str] | None = None,
                  checksums: bool = True) -> bytes:
    """The 8-byte length plus the JSON header, padded with spaces to 8-byte alignment; ``checksums`` records
    each tensor's CRC-32 under ``__metadata__[CHECKSUM_KEY]`` (computed from the bytes that will be written)."""
    head: dict[str, Any] = {}
    meta = dict(metadata or {})
    if checksums:
        meta[CHECKSUM_KEY] = json.dumps({name: crc32(_as_bytes(arr)) for name, arr in tensors.items()},
                                        separators=(",", ":"))
    if meta:
        head["__metadata__"] = meta
    pos = 0
    for name, arr in tensors.items():
        shape = arr.bits.shape if isinstance(arr, Bf16) else arr.shape
        nbytes = _as_bytes(arr).nbytes
        head[name] = {"dtype": _st_dtype(arr), "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    raw = json.dumps(head, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % _ALIGN)
    return struct.pack("<Q", len(raw)) + raw


def write_file(path: str | os.PathLike, tensors: Mapping[str, np.ndarray | Bf16],
               metadata: Mapping[str, str] | None = None, checksums: bool = True) -> int:
    """Write a safetensors file (with every tensor's CRC-32 in its metadata unless ``checksums`` is False)
    and fsync it; returns bytes written. Raises OSError (disk full...)."""
    ordered = {k: tensors[k] for k in sorted(tensors)}
    total = 0
    with open(path, "wb") as fh:
        total += write_all(fh, encode_header(ordered, metadata, checksums))
        for arr in ordered.values():
            total += write_all(fh, _as_bytes(arr))
        fh.flush()
        os.fsync(fh.fileno())
    return total


def write_all(fh: BinaryIO, data: bytes | memoryview) -> int:
    """One place every checkpoint byte goes through (tests patch it to simulate a full disk)."""
    fh.write(data)
    return len(data)
