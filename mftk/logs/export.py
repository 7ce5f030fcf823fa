"""CSV / JSON / JSON-lines exports of parsed steps, written atomically (temp file, then rename).

Field names are the log's own (`loss`, `per_step_time`, `grad_norm`, ...). JSON has no NaN, so a
non-finite value is written as null and the anomaly list says which step and field it was;
CSV writes `NaN`/`inf` (what spreadsheet tools and pandas read back), JSON lines use mftk's
metrics record format so `parse-log` can read an export again.
"""
from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Iterable

import attrs


from mftk.logs.format import format_metrics_record

# Columns first in this order (as the MF line prints them), then any others alphabetically.
_ORDER = ("step", "rank", "epoch", "consumed_samples", "global_batch_size", "loss", "per_step_time",
          "load_balancing_loss", "indexer_loss")
_LATE = ("lr", "grad_norm", "throughput", "loss_scale", "overflow_cond", "total_steps", "last_stage")


def columns(records: Iterable[dict[str, Any]], metrics: list[str] | None = None) -> list[str]:
    """Ordered union of keys; with `metrics`, only step, rank and those."""
    seen: dict[str, None] = {}
    for r in records:
        for k in r:
            seen.setdefault(k, None)
    keys = [k for k in _ORDER if k in seen]
    keys += sorted(k for k in seen if k.startswith("mtp_") and k not in keys)
    keys += sorted(k for k in seen if k not in keys and k not in _LATE)
    keys += [k for k in _LATE if k in seen]
    if metrics:
        keys = [k for k in keys if k in ("step", "rank") or k in metrics]
    return keys


def json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_csv(records: list[dict[str, Any]], metrics: list[str] | None = None) -> str:
    buf = io.StringIO()
    write_csv(buf, records, columns(records, metrics))
    return buf.getvalue()


def write_csv(f: Any, records: Iterable[dict[str, Any]], keys: list[str]) -> None:
    """CSV of `records` with columns `keys` to the open text file `f`, a row at a time."""
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(keys)
    for r in records:
        writer.writerow(["" if r.get(k) is None else _csv_cell(r[k]) for k in keys])


def _csv_cell(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, bool):
        return int(value)
    return value


def to_jsonl(records: list[dict[str, Any]], metrics: list[str] | None = None) -> str:
    buf = io.StringIO()
    write_jsonl(buf, records, columns(records, metrics))
    return buf.getvalue()


def write_jsonl(f: Any, records: Iterable[dict[str, Any]], keys: list[str]) -> None:
    """JSON lines (mftk's metrics records) of `records`' fields `keys` to the open text file `f`."""
    for r in records:
        f.write(format_metrics_record({k: r[k] for k in keys if k in r}) + "\n")


def steps_json(records: Iterable[dict[str, Any]], metrics: list[str] | None = None,
               keys: list[str] | None = None) -> Iterable[dict[str, Any]]:
    """The records as JSON objects of the fields `keys` (default: `columns` of the records, which must then
    be a list); given `keys`, a generator (a spilled run's steps, written as they come: `write_json`)."""
    if keys is None:
        keys = columns(records, metrics)
        return [{k: json_value(r[k]) for k in keys if k in r} for r in records]
    return ({k: json_value(r[k]) for k in keys if k in r} for r in records)


def attrs_json(obj: Any) -> Any:
    """An attrs result as plain JSON data (non-finite floats as null)."""
    data = attrs.asdict(obj)
    return {k: json_value(v) for k, v in data.items()}


def to_json(payload: dict[str, Any], indent: int = 1) -> str:
    return json.dumps(payload, indent=indent, allow_nan=False) + "\n"


_STEPS = "\x00steps\x00"  # stands for a lazily written list in `write_json`


def write_json(f: Any, payload: Any, indent: int = 1) -> None:
    """`to_json(payload)` written to the open text file `f`, where any value that is not a list, dict or
    plain value (a generator of step objects) is written item by item: the same text, not held at once."""
    lazy: list[Any] = []

    def mark(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        if isinstance(value, (str, int, float, bool)) or value is None:
            return value
        lazy.append(value)
        return _STEPS
    text = to_json(mark(payload), indent)
    placeholder = json.dumps(_STEPS)
    pos = 0
    for items in lazy:
        at = text.index(placeholder, pos)
        f.write(text[pos:at])
        line = text[text.rfind("\n", 0, at) + 1:at]  # the placeholder's line: `<indent>"steps": `
        _write_list(f, items, len(line) - len(line.lstrip(" ")), indent)
        pos = at + len(placeholder)
    f.write(text[pos:])


def _write_list(f: Any, items: Iterable[Any], depth: int, indent: int) -> None:
    """A JSON list as `json.dumps(..., indent=indent)` writes it inside an object whose line is indented
    `depth`."""
    pad = " " * (depth + indent)
    first = True
    for item in items:
        f.write(("[\n" if first else ",\n") + pad
                + json.dumps(item, indent=indent, allow_nan=False).replace("\n", "\n" + pad))
        first = False
    f.write("[]" if first else "\n" + " " * depth + "]")
