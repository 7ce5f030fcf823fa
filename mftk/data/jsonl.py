"""Reading corpora: JSONL or JSON-array files, plain or gzip, as a stream of validated records.

Every line is either a `Record` (texts per key) or a `Reject` (line number and a reason a
person can act on); the caller decides whether a reject stops the run or is skipped. Files
are read in large binary chunks and split on ``\\n`` only, so memory is bounded by the chunk
size plus the longest line, whatever the file size.

Documented choices for unusual input:
- CRLF line ends are accepted (``\\r`` before ``\\n`` is JSON whitespace), as is a UTF-8
  byte-order mark at the very start of a file (stripped, as ``utf-8-sig`` would).
- A raw ``\\r`` (or any control character) *inside a JSON string* is invalid JSON and
  rejected, as the reference tools' ``json.loads`` rejects it; between tokens it is whitespace.
- Blank and whitespace-only lines are rejected, not silently skipped, because they usually
  mean a broken export.
- A lone UTF-16 surrogate escape (``"\\ud800"``) cannot be encoded and is rejected.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import re
from pathlib import Path
from typing import BinaryIO, Iterator

import attrs

from mftk.errors import DataFormatError, InputError

CHUNK_BYTES = 4 << 20
BOM = b"\xef\xbb\xbf"
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_DECODER = json.JSONDecoder()


@attrs.define(slots=True)
class Record:
    """One accepted document: for each JSON key, its sentences (one string = one sentence)."""

    line: int
    texts: list[list[str]]  # parallel to the json keys
    nbytes: int


@attrs.define(slots=True)
class Reject:
    """One line that cannot be used, and why."""

    line: int
    reason: str


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Input paths in a stable order: each pattern as given, globs expanded and sorted, no duplicates."""
    paths: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
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


def open_input(path: Path) -> BinaryIO:
    """Open for binary reading, through gzip when the file starts with the gzip magic bytes."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InputError(message=f"{path}: cannot read ({exc.strerror or exc})", path=str(path)) from None
    if f.read(2) == b"\x1f\x8b":
        f.seek(0)
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    f.seek(0)
    return f


class CorpusReader:
    """Iterates the records of one input file; ``bytes_read`` tracks progress on disk."""

    def __init__(self, path: Path, keys: list[str]) -> None:
        self.path = path
        self.keys = keys
        self._stream = open_input(path)
        self._raw = getattr(self._stream, "fileobj", None) or self._stream
        self.bytes_read = 0

    def close(self) -> None:
        self._stream.close()
        if self._raw is not self._stream:
            self._raw.close()

    def _chunks(self) -> Iterator[bytes]:
        try:
            while True:
                chunk = self._stream.read(CHUNK_BYTES)
                self.bytes_read = self._raw.tell()
                if not chunk:
                    return
                yield chunk
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise DataFormatError(message=f"{self.path}: cannot read compressed data ({exc})", path=str(self.path),
                                  hint="the gzip file is truncated or corrupt") from None

    def _lines(self) -> Iterator[tuple[int, bytes]]:
        """(line number, raw line without its ``\\n``); the last line may lack one."""
        rest = b""
        number = 0
        first = True
        for chunk in self._chunks():
            if first:
                first = False
                if chunk.startswith(BOM):
                    chunk = chunk[3:]
            parts = (rest + chunk).split(b"\n")
            rest = parts.pop()
            for part in parts:
                number += 1
                yield number, part
        if rest:
            yield number + 1, rest

    def __iter__(self) -> Iterator[Record | Reject]:
        head = self._peek()
        if head == b"[" and self.path.name.removesuffix(".gz").endswith(".json"):
            yield from self._array()
            return
        for number, raw in self._lines():
            yield self._parse_line(number, raw)

    def _peek(self) -> bytes:
        stream = open_input(self.path)
        try:
            data = stream.read(4096).removeprefix(BOM).lstrip()
        except (OSError, EOFError, gzip.BadGzipFile):
            return b""
        finally:
            stream.close()
        return data[:1]

    def _parse_line(self, number: int, raw: bytes) -> Record | Reject:
        if not raw.strip():
            return Reject(number, "blank line" if not raw.rstrip(b"\r") else "whitespace-only line")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Reject(number, f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line")
        if text.startswith("\ufeff"):
            return Reject(number, "UTF-8 byte-order mark in the middle of the file (only allowed at its start)")
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            return Reject(number, _json_reason(exc, text))
        except RecursionError:
            return Reject(number, "JSON nested too deeply")
        return self._record(number, obj, len(raw), _SURROGATE_ESCAPE.search(raw) is not None)

    def _record(self, number: int, obj: object, nbytes: int, maybe_surrogate: bool) -> Record | Reject:
        if not isinstance(obj, dict):
            return Reject(number, f"the line is a JSON {_kind(obj)}, expected an object such as "
                          '{"text": "..."}')
        texts = []
        for key in self.keys:
            if key not in obj:
                have = ", ".join(repr(k) for k in list(obj)[:5]) or "none"
                return Reject(number, f"missing key {key!r} (keys present: {have})")
            value = obj[key]
            if isinstance(value, str):
                sentences = [value]
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                sentences = value
            else:
                found = _kind(value) if not isinstance(value, list) else "list containing a non-string"
                return Reject(number, f"{key!r} is {found}, expected a string or a list of strings")
            if maybe_surrogate:
                for s in sentences:
                    try:
                        s.encode("utf-8")
                    except UnicodeEncodeError as exc:
                        return Reject(number, f"{key!r} contains a lone UTF-16 surrogate "
                                      f"(\\u{ord(s[exc.start]):04x}), which is not valid Unicode")
            texts.append(sentences)
        return Record(number, texts, nbytes)

    def _array(self) -> Iterator[Record | Reject]:
        """A `.json` file holding one array of objects, parsed element by element for line numbers."""
        raw = b"".join(self._chunks())
        try:
            text = raw.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise DataFormatError(message=f"{self.path}:{line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x})",
                                  path=str(self.path), line=line) from None
        pos = text.index("[") + 1
        n = len(text)
        while True:
            pos = _skip_ws(text, pos)
            if pos < n and text[pos] == "]":
                break
            start = pos
            line = text.count("\n", 0, start) + 1
            try:
                obj, pos = _DECODER.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise DataFormatError(message=f"{self.path}:{exc.lineno}: {_json_reason(exc, text)}",
                                      path=str(self.path), line=exc.lineno,
                                      hint="a broken JSON array cannot be resumed after the error; "
                                      "fix the file or convert it to JSONL (one object per line)") from None
            piece = text[start:pos]
            yield self._record(line, obj, len(piece), "\\u" in piece)
            pos = _skip_ws(text, pos)
            if pos < n and text[pos] == ",":
                pos += 1
            elif pos < n and text[pos] == "]":
                break
            else:
                line = text.count("\n", 0, pos) + 1
                raise DataFormatError(message=f"{self.path}:{line}: expected ',' or ']' after an array element",
                                      path=str(self.path), line=line)
        trailing = text[pos + 1:].strip()
        if trailing:
            line = text.count("\n", 0, pos) + 1
            raise DataFormatError(message=f"{self.path}:{line}: extra data after the closing ']'",
                                  path=str(self.path), line=line)


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _json_reason(exc: json.JSONDecodeError, text: str) -> str:
    """A JSON error in words, with a guess at the usual cause."""
    msg = exc.msg
    if msg.startswith("Extra data"):
        return f"trailing characters after the JSON object (column {exc.colno})"
    if msg.startswith("Expecting property name enclosed in double quotes") and "'" in text:
        return f"invalid JSON at column {exc.colno}: single quotes are not JSON (use double quotes)"
    if msg.startswith("Invalid control character"):
        ch = text[exc.pos] if exc.pos < len(text) else ""
        name = {"\r": "raw carriage return (\\r)", "\t": "raw tab", "\n": "raw newline"}.get(ch, "control character")
        return f"invalid JSON at column {exc.colno}: {name} inside a string (escape it)"
    if exc.pos >= len(text.rstrip()) or msg.startswith("Unterminated string"):
        return f"truncated JSON ({msg.lower()} at column {exc.colno})"
    return f"invalid JSON: {msg} at column {exc.colno}"
