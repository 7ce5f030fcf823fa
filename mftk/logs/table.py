"""Step records kept as compact columns: a log of millions of steps in tens of bytes per step.

A dict per step costs ~1 KB (8.5 GB for a 2 GB, 7.2M-step log); a column of C doubles costs 8 bytes a
value, a column of small integers 4, and a column that has so far been constant or an arithmetic
progression (`total_steps`, `global_batch_size`, `rank`, `step`, `consumed_samples`) costs nothing per row
until a value breaks the pattern. Readers append blocks of rows; the rest of `parse-log` reads rows back as
dicts (`table[i]`, iteration, slices, views by index) or whole columns as NumPy arrays (`values`).

A cell is a number, a bool, None (the log printed `None`/`N/A`), absent (the line had no such field), or a
short text (a field that could not be read, kept to report it): numbers and bools live in the columns,
None and absence in a per-column state byte (allocated only once a column has a gap), texts in a side
dict keyed by row.
"""
from __future__ import annotations

from array import array
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

_ABSENT, _PRESENT, _NONE = 0, 1, 2
_INT32 = (-(1 << 31), (1 << 31) - 1)


class Column:
    """One field's values: a pattern `base + delta * i` until broken, then an `array` ('i', 'q' or 'd')."""

    def __init__(self, kind: str, rows_before: int) -> None:
        self.kind = kind  # "bool" | "int" | "float"
        self.data: array | None = None
        self.base: float | int | None = None
        self.delta: float | int = 0
        self.n = 0  # values held (present or filler), always the table's row count after an append
        self.state: bytearray | None = None  # per row: absent / present / None; None here means all present
        if rows_before:
            self._fill_absent(rows_before)

    # ------------------------------------------------------------ writing
    def extend(self, values: array, state: bytes | None = None) -> None:
        """Append values (an array 'q' or 'd'); `state` per row, or None when all are present numbers."""
        if len(values) == 0:
            return
        if state is not None or self.state is not None:
            self._state_extend(len(values), state)
        if self.kind != "float" and values.typecode == "d":
            self._to_float()
        if self.data is None and self._continues(values):
            self.n += len(values)
            return
        self._materialize()
        self._append_array(values)

    def _continues(self, values: array) -> bool:
        """Whether `values` go on with the pattern so far (a new column takes its pattern from them)."""
        a = np.frombuffer(values, dtype=np.int64 if values.typecode == "q" else np.float64)
        if self.base is None:
            if len(a) > 1:
                delta = a[1] - a[0]
                if not np.array_equal(np.diff(a), np.full(len(a) - 1, delta)):
                    return False
            else:
                delta = 0
            self.base, self.delta = a[0].item(), (delta.item() if len(a) > 1 else 0)
            return bool(np.isfinite(a[0])) if a.dtype == np.float64 else True
        expected = self.base + self.delta * np.arange(self.n, self.n + len(a), dtype=a.dtype)
        return bool(np.array_equal(a, expected))

    def _materialize(self) -> None:
        if self.data is not None:
            return
        if self.kind == "float":
            values = np.float64(self.base or 0) + np.float64(self.delta) * np.arange(self.n, dtype=np.float64)
            self.data = array("d", values.tobytes()) if self.n else array("d")
        else:
            lo, hi = (self.base or 0), (self.base or 0) + self.delta * max(self.n - 1, 0)
            code = "i" if _INT32[0] <= min(lo, hi) and max(lo, hi) <= _INT32[1] else "q"
            values = np.int64(self.base or 0) + np.int64(self.delta) * np.arange(self.n, dtype=np.int64)
            self.data = array(code, values.astype(np.int32 if code == "i" else np.int64).tobytes())

    def _append_array(self, values: array) -> None:
        data = self.data
        if data.typecode == "i" and values.typecode == "q":
            a = np.frombuffer(values, dtype=np.int64)
            if a.min() < _INT32[0] or a.max() > _INT32[1]:
                self.data = data = array("q", np.frombuffer(data, dtype=np.int32).astype(np.int64).tobytes())
            else:
                data.frombytes(a.astype(np.int32).tobytes())
                self.n += len(values)
                return
        if data.typecode == values.typecode:
            data.extend(values)
        else:
            data.frombytes(np.frombuffer(values, dtype=_np_type(values.typecode)).astype(
                _np_type(data.typecode)).tobytes())
        self.n += len(values)

    def _to_float(self) -> None:
        self.kind = "float"
        if self.data is not None and self.data.typecode != "d":
            self.data = array("d", np.frombuffer(self.data, dtype=_np_type(self.data.typecode))
                              .astype(np.float64).tobytes())

    def _fill_absent(self, count: int) -> None:
        filler = array("d" if self.kind == "float" else "q", bytes(8 * count))
        self.extend(filler, bytes(count))

    def _state_extend(self, count: int, state: bytes | None) -> None:
        if self.state is None:
            self.state = bytearray([_PRESENT]) * self.n
        self.state += state if state is not None else bytes([_PRESENT]) * count

    def set(self, i: int, value: Any) -> None:
        """Overwrite one row (rare: a skip line marks the step before it)."""
        self._materialize()
        if isinstance(value, float) and self.kind != "float":
            self._to_float()
        self.data[i] = value
        if self.state is not None:
            self.state[i] = _PRESENT

    # ------------------------------------------------------------ reading
    def get(self, i: int) -> tuple[int, Any]:
        """(state, value) of row i."""
        st = _PRESENT if self.state is None else self.state[i]
        if st != _PRESENT:
            return st, None
        v = self.base + self.delta * i if self.data is None else self.data[i]
        if self.kind == "bool":
            return st, bool(v)
        return st, (float(v) if self.kind == "float" else int(v))

    def values(self) -> np.ndarray:
        """Every row as float64, NaN where absent or None (a view where the storage allows)."""
        if self.data is None:
            out = np.float64(self.base or 0) + np.float64(self.delta) * np.arange(self.n, dtype=np.float64)
        else:
            out = np.frombuffer(self.data, dtype=_np_type(self.data.typecode))
            out = out if out.dtype == np.float64 else out.astype(np.float64)
        if self.state is not None:
            out = np.where(np.frombuffer(self.state, dtype=np.uint8) == _PRESENT, out, np.nan)
        return out

    def as_array(self) -> array:
        """The values as a new 'q' or 'd' array (fillers where absent)."""
        if self.data is None:
            dtype = np.float64 if self.kind == "float" else np.int64
            values = (np.asarray(self.base or 0, dtype=dtype)
                      + np.asarray(self.delta, dtype=dtype) * np.arange(self.n, dtype=dtype))
        else:
            values = np.frombuffer(self.data, dtype=_np_type(self.data.typecode))
            values = values.astype(np.float64 if self.kind == "float" else np.int64)
        return array("d" if self.kind == "float" else "q", values.tobytes())

    def native(self) -> np.ndarray:
        """The values in their stored type (int32/int64/float64, a view where stored as an array); only for a
        column without gaps (callers check `state`)."""
        if self.data is None:
            dtype = np.float64 if self.kind == "float" else np.int64
            return np.asarray(self.base or 0, dtype=dtype) + np.asarray(self.delta, dtype=dtype) * np.arange(
                self.n, dtype=dtype)
        return np.frombuffer(self.data, dtype=_np_type(self.data.typecode))

    def nbytes(self) -> int:
        return (0 if self.data is None else self.data.itemsize * len(self.data)) + len(self.state or b"")


def _np_type(code: str) -> Any:
    return {"i": np.int32, "q": np.int64, "d": np.float64}[code]


def _kind(value: Any) -> str:
    return "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"


class StepTable(Sequence):
    """Rows of step records in columns; `table[i]` is row i as a dict (a new one each time)."""

    def __init__(self) -> None:
        self.columns: dict[str, Column] = {}
        self.n = 0
        self.texts: dict[int, dict[str, str]] = {}  # row -> {field: text} for values that are no number

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.row(j) for j in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.row(i)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self.row(i) for i in range(self.n))

    def row(self, i: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, col in self.columns.items():
            st, v = col.get(i)
            if st != _ABSENT:
                out[key] = v
        if self.texts and i in self.texts:
            out.update(self.texts[i])
        return out

    def native(self, key: str) -> np.ndarray:
        """Column `key` in its stored type when every row holds a number (no copy for a stored array),
        else as `values` (float64, NaN where absent): integer results mean "no gaps"."""
        col = self.columns.get(key)
        if col is None or col.state is not None or col.kind == "bool":
            return self.values(key)
        return col.native()

    def values(self, key: str) -> np.ndarray:
        """Column `key` as float64 (NaN where absent/None); all NaN when no row has it."""
        col = self.columns.get(key)
        return col.values() if col is not None else np.full(self.n, np.nan)

    def present(self, key: str) -> np.ndarray:
        col = self.columns.get(key)
        if col is None:
            return np.zeros(self.n, dtype=bool)
        if col.state is None:
            return np.ones(self.n, dtype=bool)
        return np.frombuffer(col.state, dtype=np.uint8) != _ABSENT

    def constant(self, key: str) -> Any:
        """The value every row holds in `key` when the column is one constant (kept as such), else None."""
        col = self.columns.get(key)
        if col is None or col.data is not None or col.state is not None or col.delta != 0 or col.base is None:
            return None
        return col.base

    def increasing(self, key: str) -> bool:
        """Whether `key` goes strictly up from row to row (checked a block at a time)."""
        col = self.columns.get(key)
        if col is None or col.state is not None:
            return False
        if col.data is None:
            return self.n < 2 or col.delta > 0
        a = np.frombuffer(col.data, dtype=_np_type(col.data.typecode))
        block = 1 << 20
        return all(bool(np.all(np.diff(a[b:b + block + 1]) > 0)) for b in range(0, max(len(a) - 1, 1), block))

    def set_constant(self, key: str, value: int) -> None:
        """Make `key` one integer for every row (no per-row storage)."""
        col = Column("int", 0)
        col.base, col.delta, col.n = value, 0, self.n
        self.columns[key] = col

    def numeric(self, key: str) -> np.ndarray:
        """Rows where `key` holds a number (not absent, not None, not a text)."""
        col = self.columns.get(key)
        if col is None:
            return np.zeros(self.n, dtype=bool)
        if col.state is None:
            return np.ones(self.n, dtype=bool)
        return np.frombuffer(col.state, dtype=np.uint8) == _PRESENT

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in self.columns.values())

    @classmethod
    def concat(cls, tables: list[StepTable]) -> StepTable:
        """The rows of several tables, one after another (several files of one run)."""
        out = cls()
        for t in tables:
            for key, col in t.columns.items():
                target = out.columns.get(key)
                if target is None:
                    target = out.columns[key] = Column(col.kind, out.n)
                elif col.kind != target.kind and target.kind != "float":
                    if col.kind == "float":
                        target._to_float()
                    else:
                        target.kind = "int"
                target.extend(col.as_array(), None if col.state is None else bytes(col.state))
            out._pad(t.n, set(t.columns))
            out.texts.update({out.n + i: v for i, v in t.texts.items()})
            out.n += t.n
        return out

    # ------------------------------------------------------------ writing
    def append_columns(self, count: int, cols: dict[str, array]) -> None:
        """Append `count` rows whose every field in `cols` is a present number ('q' or 'd' arrays)."""
        for key, values in cols.items():
            col = self.columns.get(key)
            if col is None:
                col = self.columns[key] = Column("int" if values.typecode == "q" else "float", self.n)
            col.extend(values)
        self._pad(count, set(cols))
        self.n += count

    def append_records(self, records: Iterable[dict[str, Any]]) -> None:
        """Append rows given as dicts (numbers, bools, None; other values are kept as texts)."""
        records = list(records)
        if not records:
            return
        keys: dict[str, None] = {}
        for r in records:
            keys.update(dict.fromkeys(r))
        for key in keys:
            values, state, kind = [], bytearray(len(records)), None
            for j, r in enumerate(records):
                v = r.get(key, _MISSING)
                if v is _MISSING:
                    values.append(0)
                elif v is None:
                    values.append(0)
                    state[j] = _NONE
                elif isinstance(v, (int, float)):
                    values.append(v)
                    state[j] = _PRESENT
                    k = _kind(v)
                    kind = k if kind in (None, k) else ("float" if "float" in (k, kind) else "int")
                else:
                    values.append(0)
                    self.texts.setdefault(self.n + j, {})[key] = str(v)
            col = self.columns.get(key)
            if col is None:
                col = self.columns[key] = Column(kind or "float", self.n)
            elif kind is not None and kind != col.kind and col.kind != "float":
                if kind == "float":
                    col._to_float()
                else:
                    col.kind = "int"
            typecode = "d" if col.kind == "float" or kind == "float" else "q"
            all_present = state.count(_PRESENT) == len(records)
            col.extend(array(typecode, values), None if all_present else bytes(state))
        self._pad(len(records), set(keys))
        self.n += len(records)

    def _pad(self, count: int, written: set[str]) -> None:
        for key, col in self.columns.items():
            if key not in written:
                col._fill_absent(count)

    def set(self, i: int, key: str, value: Any) -> None:
        """Set one cell of an existing row (a skip line marks the step before it)."""
        col = self.columns.get(key)
        if col is None:
            col = self.columns[key] = Column(_kind(value), 0)
            col._fill_absent(self.n)
        col.set(i, value)

    def take(self, rows: np.ndarray) -> StepTable:
        """The given rows (indices, in that order) as a table of their own: one rank's lines of a file that
        holds several, to spill them (`mftk.logs.spill`)."""
        out = StepTable()
        out.n = len(rows)
        for key, col in self.columns.items():
            values = np.frombuffer(col.as_array(), dtype=np.float64 if col.kind == "float" else np.int64)[rows]
            state = None if col.state is None else np.frombuffer(col.state, dtype=np.uint8)[rows].tobytes()
            target = out.columns[key] = Column(col.kind, 0)
            target.extend(array("d" if col.kind == "float" else "q", values.tobytes()), state)
        if self.texts:
            held = np.nonzero(np.isin(rows, np.fromiter(self.texts, dtype=np.int64)))[0]
            out.texts = {int(j): self.texts[int(rows[j])] for j in held}
        return out

    def set_column(self, key: str, values: np.ndarray) -> None:
        """Replace a whole integer column (ranks told apart after reading)."""
        col = Column("int", 0)
        col.extend(array("q", np.asarray(values, dtype=np.int64).tobytes()))
        self.columns[key] = col


_MISSING = object()


class TableView(Sequence):
    """Some rows of a table, in a given order (one rank's steps, sorted): rows come back as dicts.
    `index` None is every row in table order (one rank that never went back: no index array, no copy)."""

    def __init__(self, table: StepTable, index: np.ndarray | None) -> None:
        self.table = table
        self._index = index

    @property
    def index(self) -> np.ndarray:
        return np.arange(self.table.n) if self._index is None else self._index

    def __len__(self) -> int:
        return self.table.n if self._index is None else len(self._index)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            rows = range(self.table.n)[i] if self._index is None else self._index[i].tolist()
            return [self.table.row(j) for j in rows]
        if self._index is None:
            return self.table[i]
        return self.table.row(int(self._index[i]))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._index is None:
            return iter(self.table)
        return (self.table.row(j) for j in self._index.tolist())

    def values(self, key: str) -> np.ndarray:
        column = self.table.values(key)
        return column if self._index is None else column[self._index]

    def native(self, key: str) -> np.ndarray:
        column = self.table.native(key)
        return column if self._index is None else column[self._index]

    def numeric(self, key: str) -> np.ndarray:
        mask = self.table.numeric(key)
        return mask if self._index is None else mask[self._index]


def as_table(records: Iterable[dict[str, Any]]) -> StepTable:
    """A table as is; records given as dicts (tests, small callers) in a new table."""
    if isinstance(records, StepTable):
        return records
    table = StepTable()
    table.append_records(records)
    return table


def as_view(series: Sequence[dict[str, Any]]) -> TableView:
    """One rank's series as a view (the columns the analysis reads), whatever it was given as."""
    if isinstance(series, TableView):
        return series
    table = as_table(series)
    return TableView(table, np.arange(table.n))
