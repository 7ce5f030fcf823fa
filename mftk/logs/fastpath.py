"""Reading a chunk of PyNative step lines a column at a time: one regex over the whole chunk.

A training log repeats one step-line shape millions of times (the PyNative LossCallback's
`{ step:[n/N], key: value, ... }`, mftk.logs.format). Once the line-by-line reader has read one such
line, `shape_of` compiles a regex for exactly that shape (same keys, same order, each value's kind);
`FastShape.read` then applies it to a whole chunk with `findall` and turns each field's matches into a
typed `array` with `map(int|float, ...)` — the work stays in C, with no dict and no Python call per line.

It answers only when it read every step line of the chunk (as many matches as `{ step:[` heads) and
the steps only go up; anything else (another shape, a `None` or `N/A` value, a resume) returns None and
the caller reads that chunk line by line, so both paths give the same records.
"""
from __future__ import annotations

import re
from array import array

import attrs
import numpy as np

HEAD = "{ step:["
# Lines that say something about the step before them (MF's skip line, an exception, a stop message): a chunk
# holding one is read line by line, which keeps them.
EVENT_MARKERS = ("is_skip:", "Error", "Exception", "stop training", "Interrupt")
_HEAD_FIELDS = [("step", int), ("total_steps", int)]
_HEAD_RE = r"\{ step:\[ *(\d+)/ *(\d+)\]"
_HEAD = re.compile(_HEAD_RE)
# Value spellings of the step line (format_step_line): `%6dms`, `%6.2fT`, `%d`, `%10.6f`, `%10.6e`, `NaN`. The
# regex captures any run of non-separators; `int`/`float` then reject what is not a number of that kind.
_KINDS = (
    (re.compile(r"-?\d+ms"), int, r" *([^,\sm]+)ms"),
    (re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?T"), float, r" *([^,\sT]+)T"),
    (re.compile(r"-?\d+"), int, r" *([^,\s]+)"),
    (re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|inf|Infinity)"), float,
     r" *([^,\s]+)"),
)


class FastShape:
    """One step-line shape: its regex and each captured field's name and type."""

    head = HEAD

    def __init__(self, pattern: str, fields: list[tuple[str, type]], ordered: bool = True) -> None:
        self.pattern = pattern
        self.regex = re.compile(pattern, re.M)
        self.fields = fields
        self.ordered = ordered  # False: steps may repeat and go back (ranks interleaved, told apart later)

    def read(self, text: str, last_step: int | None) -> tuple[int, dict[str, array], int | None] | None:
        """(rows, columns, last step) of every step line in `text`, or None when a line needs the slow path."""
        rows = self.regex.findall(text)
        if len(rows) != text.count(HEAD):
            return None
        if not rows:
            return 0, {}, last_step
        try:
            table = np.array(rows, dtype=np.float64)  # every cell at once; a non-number raises ValueError
        except ValueError:
            return None
        out: dict[str, array] = {}
        for j, (name, kind) in enumerate(_HEAD_FIELDS + self.fields):
            col = np.ascontiguousarray(table[:, j])
            if kind is int:
                if not (np.all(np.abs(col) < 2.0 ** 53) and np.array_equal(col, np.round(col))):
                    return None  # NaN or a fraction where the first line had an integer: read line by line
                out[name] = array("q", col.astype(np.int64).tobytes())
            else:
                out[name] = array("d", col.tobytes())
        a = np.frombuffer(out["step"], dtype=np.int64)
        if self.ordered and ((last_step is not None and a[0] <= last_step)
                             or (len(a) > 1 and bool(np.any(np.diff(a) <= 0)))):
            return None  # a resume or another log: the line reader looks at the timestamps
        return len(rows), out, int(a[-1])


@attrs.frozen
class ChunkRead:
    """What the column path read from one chunk of text: what the reader adds to its table and summary."""

    count: int  # step lines read
    cols: dict[str, array]
    first_step: int | None
    last_step: int | None
    lines: int  # lines in the chunk
    last_line: str  # the last step line ("" when none)


def read_chunk(text: str, fast: FastShape) -> ChunkRead | None:
    """`text` read a column at a time, or None when a line in it needs the line-by-line reader (an event
    line, another shape, steps going back). Whether the steps go on from the previous chunk's is the
    caller's check (`first_step`)."""
    if any(marker in text for marker in EVENT_MARKERS):
        return None
    got = fast.read(text, None)
    if got is None:
        return None
    count, cols, last_step = got
    lines = text.count("\n") + (0 if not text or text.endswith("\n") else 1)
    if not count:
        return ChunkRead(0, cols, None, last_step, lines, "")
    head = text.rfind(HEAD)
    last_line = text[text.rfind("\n", 0, head) + 1:text.find("\n", head) % (len(text) + 1)]
    return ChunkRead(count, cols, cols["step"][0], last_step, lines, last_line)


def has_long_line(body: bytes, limit: int) -> bool:
    """Whether a line of `body` is longer than `limit` bytes (then the line reader reads it: it skips and
    counts such lines)."""
    if len(body) <= limit:
        return False
    ends = np.flatnonzero(np.frombuffer(body, dtype=np.uint8) == 10)
    starts = np.concatenate(([0], ends + 1))
    ends = np.concatenate((ends, [len(body)]))
    return bool(np.max(ends - starts) > limit)


def shape_of(line: str) -> FastShape | None:
    """The shape of one PyNative step line, or None when a value is not a plain number (`None`, `N/A`)."""
    start = line.find(HEAD)
    m = _HEAD.match(line, start) if start >= 0 else None
    if m is None:
        return None
    body = line[m.end():].rstrip()
    if not body.endswith("}"):
        return None
    pattern, fields = [_HEAD_RE], []
    for part in body[:-1].rstrip().split(", ")[1:] if body.startswith(",") else [None]:
        if part is None:
            return None
        name, sep, value = part.partition(":")
        kind = next(((conv, rx) for test, conv, rx in _KINDS if test.fullmatch(value.strip())), None)
        if not sep or kind is None or not name.strip():
            return None
        fields.append((name.strip().replace(" ", "_"), kind[0]))
        pattern.append(", " + re.escape(name) + ":" + kind[1])
    pattern.append(r" *\}[ \t]*$")
    return FastShape("".join(pattern), fields)
