"""Reading corpora: JSONL or JSON-array files, plain or gzip, as chunks of validated documents.

A `CorpusReader` yields `Chunk`s: the accepted documents of a few MB of lines as flat lists of
texts (no object per document), plus a `Reject` (line number and a reason a person can act on)
for every line that cannot be used; the caller decides whether a reject stops the run or is
skipped. Files are read in binary chunks and split on ``\\n`` only, so memory is bounded by the
chunk size plus the longest line, whatever the file size. A reader can cover a byte range of a
file (``start``/``end`` at line starts, see `mftk.data.shards`).

Parsing is done once per line, in bulk: ``msgspec`` decodes each line straight into the
requested keys (other keys are skipped without building Python objects; 10-15x faster than
``json`` on short documents). A chunk in which any line fails that fast path is re-read line by
line by the careful path, which gives each bad line its reason, so a line is accepted or
rejected the same way wherever it sits. The careful path accepts exactly what the reference
tools' ``json.loads`` accepts (NaN, Infinity, lone surrogates in keys that are not read) and
also deep nesting in keys that are not read, which ``json`` would give up on.

Documented choices for unusual input:
- CRLF line ends are accepted (``\\r`` before ``\\n`` is JSON whitespace), as is a UTF-8
  byte-order mark at the very start of a file (stripped, as ``utf-8-sig`` would).
- A raw ``\\r`` (or any control character) *inside a JSON string* is invalid JSON and
  rejected, as the reference tools' ``json.loads`` rejects it; between tokens it is whitespace.
- Blank and whitespace-only lines are rejected, not silently skipped, because they usually
  mean a broken export.
- A line that is not valid UTF-8 anywhere (even in a key that is not read) is rejected.
- A lone UTF-16 surrogate escape (``"\\ud800"``) in a text cannot be encoded and is rejected.
"""
from __future__ import annotations

import json
import operator
import re
from pathlib import Path
from typing import Callable, Iterator, Union

import msgspec
import numpy as np

from mftk.data.inputs import BOM, is_json_array, is_read_error, open_input
from mftk.errors import DataFormatError

# Input is read, parsed and encoded in chunks of about CHUNK_BYTES: 1 MB encodes faster than 4 MB (the texts
# still in cache when the encoder takes them: 0.18 against 0.24 s for the 50 MB benchmark corpus) and bounds
# memory. A chunk holds at least MIN_LINES lines (up to MAX_GATHER chunks' worth), so that the tokenizer's
# threads, which share a batch out by document, have documents enough to share on a corpus of long ones.
CHUNK_BYTES = 1 << 20
MIN_LINES = 16
MAX_GATHER = 8
# The first read of a file (or byte range): the encoder waits for the first parsed chunk, so a small one
# starts it sooner; later reads are CHUNK_BYTES.
FIRST_CHUNK_BYTES = 256 << 10
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_DECODER = json.JSONDecoder()
_FAST_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)


class Record(msgspec.Struct):
    """One accepted document: for each JSON key, its sentences (one string = one sentence)."""

    line: int
    texts: list[list[str]]  # parallel to the json keys
    nbytes: int


class Reject(msgspec.Struct):
    """One line that cannot be used, and why."""

    line: int
    reason: str


class Chunk(msgspec.Struct):
    """The accepted documents of a stretch of lines, flat: per key, every sentence in order.

    ``sentences[k]`` is the number of sentences of each document for key ``k``, or None when
    every document is one string (the usual case, kept free of per-document arrays).
    """

    texts: list[list[str]]
    sentences: list[np.ndarray | None]
    documents: int
    rejects: list[Reject]
    lines: int
    first_line: Callable[[], int]  # line number in the file of the chunk's first line (computed on demand)
    lines_of: list[int] | None = None  # line of each accepted document; set by the careful path only

    def document_lines(self) -> list[int]:
        """Line number in the file of each accepted document, for errors found after parsing."""
        if self.lines_of is not None:
            return self.lines_of
        first = self.first_line()
        return list(range(first, first + self.documents))


def count_lines(path: Path, end: int) -> int:
    """Number of ``\\n`` in the first ``end`` bytes of a plain file (line numbers of a byte range)."""
    count = 0
    with open(path, "rb") as f:
        while end > 0:
            block = f.read(min(end, 16 << 20))
            if not block:
                break
            count += block.count(b"\n")
            end -= len(block)
    return count


def _newlines(data: bytes, at_most: int) -> int:
    """How many ``\n`` ``data`` holds, counted up to ``at_most`` (a few memchr calls, not a pass over it)."""
    count = start = 0
    while count < at_most:
        start = data.find(b"\n", start) + 1
        if not start:
            break
        count += 1
    return count


def _doc_type(keys: list[str], *, only: bool) -> type:
    """A msgspec Struct with one required ``str | list[str]`` field per key.

    ``only``: no other key allowed. Then every string of a line is decoded, so msgspec has checked
    the UTF-8 of every byte of it; otherwise other keys are skipped unchecked.
    """
    fields = [(f"f{i}", Union[str, list[str]]) for i in range(len(keys))]
    return msgspec.defstruct("Doc", fields, rename={f"f{i}": k for i, k in enumerate(keys)},
                             forbid_unknown_fields=only, gc=False)  # strings only: no cycle to collect


class CorpusReader:
    """Iterates the `Chunk`s of one input file, or of the lines starting in ``[start, end)`` of it.

    ``bytes_read`` tracks progress on disk; ``had_lines`` says whether any line was seen.
    ``line_offset`` (or a function giving it, called only when a line number is first needed)
    is the number of lines before ``start``.
    """

    def __init__(self, path: Path, keys: list[str], *, start: int = 0, end: int | None = None,
                 chunk_bytes: int = CHUNK_BYTES, line_offset: int | Callable[[], int] = 0) -> None:
        self.path, self.keys, self.start, self.end = path, keys, start, end
        self.chunk_bytes = max(int(chunk_bytes), 1)
        self._line_offset = line_offset
        self._stream = open_input(path)
        self._raw = getattr(self._stream, "fileobj", None) or self._stream
        if start:
            self._stream.seek(start)
        self.bytes_read = 0
        self.had_lines = False
        self._decode_only = msgspec.json.Decoder(_doc_type(keys, only=True)).decode
        self._decode = msgspec.json.Decoder(_doc_type(keys, only=False)).decode
        self._other_keys = False  # set once lines turn out to hold keys that are not read
        self._getters = [operator.attrgetter(f"f{i}") for i in range(len(keys))]

    def close(self) -> None:
        self._stream.close()
        if self._raw is not self._stream:
            self._raw.close()

    def line_offset(self) -> int:
        if callable(self._line_offset):
            self._line_offset = self._line_offset()
        return self._line_offset

    # -- reading ----------------------------------------------------------------------------
    def _chunks(self) -> Iterator[bytes]:
        left = None if self.end is None else self.end - self.start
        size = min(self.chunk_bytes, FIRST_CHUNK_BYTES)
        try:
            while left is None or left > 0:
                size = size if left is None else min(size, left)
                chunk = self._stream.read(size)
                self.bytes_read = self._raw.tell() - self.start
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk
                size = self.chunk_bytes
        except Exception as exc:  # gzip.BadGzipFile is an OSError, lzma.LZMAError is not
            if not is_read_error(exc):
                raise
            raise DataFormatError(message=f"{self.path}: cannot read compressed data ({exc})", path=str(self.path),
                                  hint="the compressed file is truncated or corrupt") from None

    def _blocks(self) -> Iterator[tuple[bytes, int]]:
        """(data, end): ``data[:end]`` is a run of whole lines, about a chunk or `MIN_LINES` lines (the
        file's last line may lack its ``\\n``). Only lines gathered over chunk boundaries are copied."""
        pending: list[bytes] = []
        lines = 0  # the newlines in pending, counted up to MIN_LINES
        first = self.start == 0
        for chunk in self._chunks():
            if first:
                first = False
                if chunk.startswith(BOM):
                    chunk = chunk[3:]
            lines += _newlines(chunk, MIN_LINES - lines)
            if not lines or (lines < MIN_LINES and len(pending) < MAX_GATHER - 1):
                pending.append(chunk)  # a line longer than a chunk, or too few lines yet: gather, bounded
                continue
            data = b"".join((*pending, chunk)) if pending else chunk
            end = data.rfind(b"\n") + 1
            pending = [data[end:]] if end < len(data) else []
            lines = 0
            yield data, end
        if pending:
            data = b"".join(pending)
            yield data, len(data)

    def __iter__(self) -> Iterator[Chunk]:
        if is_json_array(self.path):
            yield from self._array_chunks()
            return
        number = 1
        for data, end in self._blocks():
            self.had_lines = True
            chunk = self._parse(data, end, number)
            del data  # the chunk's texts are all that stays alive while it is encoded
            number += chunk.lines
            yield chunk

    def _parse(self, data: bytes, end: int, number: int) -> Chunk:
        """Lines as zero-copy views of ``data[:end]``, then parsed."""
        view = memoryview(data)
        lines, ends = [], []
        find, start = data.find, 0
        while start < end:  # memchr per line: 2x numpy's compare-and-nonzero over the chunk
            stop = find(b"\n", start, end)
            if stop < 0:
                stop = end  # the last line of the file, without its \n
            lines.append(view[start:stop])
            ends.append(stop)
            start = stop + 1
        chunk = self._fast(lines, number, data, end, ends)
        if chunk is None:
            chunk = self._careful([line.tobytes() for line in lines], number)
        return chunk

    # -- parsing ----------------------------------------------------------------------------
    def _fast(self, lines: list[memoryview], number: int, data: bytes, end: int, ends: list[int]) -> Chunk | None:
        """Every line valid: one msgspec call per line, no per-document Python beyond the texts."""
        docs = None
        if not self._other_keys:
            try:
                decode = self._decode_only
                docs = [decode(line) for line in lines]  # UTF-8 of every byte checked by msgspec
            except _FAST_ERRORS:
                pass
        if docs is None:
            try:
                high = np.flatnonzero(np.frombuffer(data, np.uint8, count=end) & 0x80)
                if len(high):  # msgspec does not check the UTF-8 of keys it skips: check lines with non-ASCII
                    for i in np.unique(np.searchsorted(ends, high)).tolist():
                        str(lines[i], "utf-8")
                decode = self._decode
                docs = [decode(line) for line in lines]
            except _FAST_ERRORS:
                return None
            self._other_keys = True  # the lines hold keys that are not read: go here first from now on
        texts, sentences = [], []
        for get in self._getters:
            values = list(map(get, docs))
            if all(type(v) is str for v in values):
                texts.append(values)
                sentences.append(None)
            else:
                texts.append([s for v in values for s in ((v,) if type(v) is str else v)])
                sentences.append(np.fromiter((1 if type(v) is str else len(v) for v in values), np.int64,
                                             count=len(values)))
        return Chunk(texts, sentences, len(docs), [], len(lines), lambda: number + self.line_offset())

    def _careful(self, lines: list[bytes], number: int) -> Chunk:
        """Line by line: each bad line becomes a `Reject` with its reason."""
        records: list[Record] = []
        rejects: list[Reject] = []
        number += self.line_offset()
        for i, raw in enumerate(lines):
            item = self._parse_line(number + i, raw)
            (records if isinstance(item, Record) else rejects).append(item)
        return self._chunk(records, rejects, len(lines), number)

    def _chunk(self, records: list[Record], rejects: list[Reject], lines: int, number: int) -> Chunk:
        texts, sentences = [], []
        for k in range(len(self.keys)):
            texts.append([s for r in records for s in r.texts[k]])
            sentences.append(np.fromiter((len(r.texts[k]) for r in records), np.int64, count=len(records)))
        return Chunk(texts, sentences, len(records), rejects, lines, lambda: number, [r.line for r in records])

    def _array_chunks(self) -> Iterator[Chunk]:
        """A JSON array file: its elements grouped into chunks (the file is parsed whole)."""
        records: list[Record] = []
        rejects: list[Reject] = []
        size = 0
        for item in self._array():
            self.had_lines = True
            if isinstance(item, Reject):
                rejects.append(item)
                continue
            records.append(item)
            size += item.nbytes
            if size >= self.chunk_bytes:
                yield self._chunk(records, rejects, len(records) + len(rejects), records[0].line)
                records, rejects, size = [], [], 0
        if records or rejects:
            yield self._chunk(records, rejects, len(records) + len(rejects), records[0].line if records else 0)

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
            doc = self._decode(raw)
        except _FAST_ERRORS:
            pass
        else:
            values = [get(doc) for get in self._getters]
            return Record(number, [[v] if type(v) is str else v for v in values], len(raw))
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
