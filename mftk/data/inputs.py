"""The inputs of `mftk preprocess` before any is parsed: groups, files, compressed or JSON array, a sample.

Compression is told by the file's first bytes, never by its name: gzip, xz and bzip2 are read through the
standard library; zstd (no reader in the standard library, and `zstandard` is not a dependency) is refused
naming the file and the command that decompresses it, rather than read as invalid UTF-8.

Only the standard library is imported here (`mftk.errors` where an error is raised), because the
command starts the HF helper process (`mftk.data.hf_reference`) with the input files before the
data layer is imported, and the helper samples the input with `sample_texts` itself.
"""
from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path
from typing import BinaryIO, NamedTuple

BOM = b"\xef\xbb\xbf"
GZIP_MAGIC = b"\x1f\x8b"
# First bytes of each compressed format (RFC 1952; the .xz file format §2.1.1.1; bzip2; RFC 8878 §3.1.1).
MAGIC = {"gzip": GZIP_MAGIC, "xz": b"\xfd7zXZ\x00", "bzip2": b"BZh", "zstd": b"\x28\xb5\x2f\xfd"}
COMPRESSED_SUFFIXES = (".gz", ".xz", ".bz2", ".zst")
_NAMED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)=(.+)$")
SAMPLE_TEXTS = 128  # input texts the tokenizer backend check encodes with both tokenizers (cut to SAMPLE_CHARS)
SAMPLE_CHARS = 1024


class Source(NamedTuple):
    """One group of inputs that becomes one output prefix (per JSON key)."""

    name: str | None
    patterns: list[str]


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
        from mftk.errors import InputError

        raise InputError(message="mixing named inputs (NAME=PATH) with unnamed ones",
                         hint="name every input group, e.g. --input wiki=wiki/*.jsonl --input code=code.jsonl")
    return [Source(name, patterns) for name, patterns in groups.items()]


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Input paths in a stable order: each pattern as given, globs expanded and sorted, no duplicates.

    A pattern that names an existing file is taken literally even if it contains glob characters
    (a file called ``data[1].jsonl``).
    """
    from mftk.errors import InputError

    paths: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern) and not os.path.exists(pattern):
            matches = sorted(glob.glob(pattern, recursive=True))
            matches = [m for m in matches if os.path.isfile(m)]
            if not matches:
                raise InputError(message=f"{pattern}: no file matches this pattern", path=pattern,
                                 hint="check the glob (quote it so the shell does not expand it)")
            paths.extend(Path(m) for m in matches)
        else:
            p = Path(pattern)
            if not p.exists():
                raise InputError(message=f"{p}: no such input file", path=str(p))
            if not p.is_file():
                raise InputError(message=f"{p}: not a file", path=str(p),
                                 hint="pass files or a quoted glob such as 'data/*.jsonl'")
            paths.append(p)
    seen: set[Path] = set()
    unique = []
    for p in paths:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def compression(path: Path) -> str | None:
    """'gzip', 'xz', 'bzip2' or 'zstd' from the file's first bytes; None for a plain file."""
    with open(path, "rb") as f:
        head = f.read(6)
    return next((name for name, magic in MAGIC.items() if head.startswith(magic)), None)


def open_input(path: Path) -> BinaryIO:
    """Open for binary reading, through the decompressor its first bytes name (the raw file as ``.fileobj``)."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        from mftk.errors import InputError

        raise InputError(message=f"{path}: cannot read ({exc.strerror or exc})", path=str(path)) from None
    head = f.read(6)
    f.seek(0)
    kind = next((name for name, magic in MAGIC.items() if head.startswith(magic)), None)
    if kind is None:
        return f
    if kind == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    if kind == "zstd":
        f.close()
        from mftk.errors import DataFormatError

        raise DataFormatError(message=f"{path}: zstd-compressed, which mftk does not read", path=str(path),
                              hint=f"decompress it first (zstd -d {path}) or recompress it as .gz or .xz")
    if kind == "xz":
        import lzma

        stream = lzma.LZMAFile(f, mode="rb")
    else:
        import bz2

        stream = bz2.BZ2File(f, mode="rb")  # type: ignore[assignment]
    stream.fileobj = f  # type: ignore[attr-defined]  # what progress counts (compressed bytes), as for gzip
    return stream  # type: ignore[return-value]


def is_read_error(exc: BaseException) -> bool:
    """An error of reading a (compressed) input: OSError (gzip.BadGzipFile, bz2's), EOFError (truncated), or
    lzma.LZMAError (not an OSError; told by name so that lzma is imported only for .xz inputs)."""
    return isinstance(exc, (OSError, EOFError)) or type(exc).__name__ == "LZMAError"


def is_gzip(path: Path) -> bool:
    """Compressed in any format (the name is kept for its callers): such a file is read whole, from its start."""
    return compression(path) is not None


def plain_name(name: str) -> str:
    """A file name without its compression suffix: ``a.json.xz`` -> ``a.json``."""
    for suffix in COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def is_json_array(path: Path) -> bool:
    """A ``.json`` file whose first character is ``[``: one array of objects, not JSON Lines."""
    if not plain_name(path.name).endswith(".json"):
        return False
    stream = open_input(path)
    try:
        data = stream.read(4096).removeprefix(BOM).lstrip()
    except Exception as exc:  # noqa: BLE001 (only read errors are expected; others propagate)
        if not is_read_error(exc):
            raise
        return False
    finally:
        stream.close()
    return data[:1] == b"["


def sample_texts(paths: list[Path], keys: list[str], count: int = 256, max_chars: int = 2048) -> list[str]:
    """About ``count`` texts spread evenly over the inputs (by size), each cut to ``max_chars``.

    What the tokenizer backend check encodes: real input, cheap to read (a seek and a line per
    text in a plain file; the first few MB of a gzip or JSON-array file). Lines that do not parse
    are left out here; the run itself reports them.
    """
    sizes = [max(p.stat().st_size, 1) for p in paths]
    total = sum(sizes)
    texts: list[str] = []
    for path, size in zip(paths, sizes):
        want = max(1, round(count * size / total))
        try:
            lines = _sample_lines(path, want)
        except Exception as exc:  # noqa: BLE001 (only read errors are expected; others propagate)
            if not is_read_error(exc):
                raise
            continue
        for raw in lines:
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if not isinstance(obj, dict):
                continue
            for key in keys:
                value = obj.get(key)
                values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
                texts.extend(v[:max_chars] for v in values[:4] if isinstance(v, str) and _encodable(v))
    return list(dict.fromkeys(texts))  # a small file is sampled at the same lines again and again


def _sample_lines(path: Path, want: int) -> list[bytes]:
    if is_gzip(path) or is_json_array(path):
        with open_input(path) as f:
            head = f.read(4 << 20)
        if is_json_array(path):
            return []  # arrays are not split into lines; the edge cases still apply
        lines = head.split(b"\n")[:-1] or head.split(b"\n")
        step = max(1, len(lines) // want)
        return lines[::step][:want]
    size = path.stat().st_size
    out = []
    with open(path, "rb") as f:
        for i in range(want):
            offset = size * i // want
            f.seek(offset)
            if offset:
                f.readline(1 << 20)  # the rest of the line the seek landed in
            line = f.readline(1 << 20)
            if line.endswith(b"\n") or f.tell() == size:
                out.append(line.removeprefix(BOM) if f.tell() - len(line) == 0 else line)
    return out


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_sample(paths: list[Path], keys: list[str]) -> list[str]:
    """The input texts the tokenizer backend check encodes (`mftk.data.tokenize.BackendCheck`)."""
    return sample_texts(paths, keys, SAMPLE_TEXTS, SAMPLE_CHARS)


def sample_request(inputs: list[str] | None, keys: list[str] | None) -> dict | None:
    """What the HF helper samples the check texts from: every input file (of every group) and the keys;
    None where the inputs do not name files (the run reports that itself)."""
    from mftk.errors import MftkError

    if not inputs:
        return None
    try:
        paths = [str(p) for source in parse_sources(inputs) for p in expand_inputs(source.patterns)]
    except (MftkError, OSError):
        return None
    return {"paths": paths, "keys": list(keys or ["text"])}
