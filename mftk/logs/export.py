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
    keys = columns(records, metrics)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(keys)
    for r in records:
        writer.writerow(["" if r.get(k) is None else _csv_cell(r[k]) for k in keys])
    return buf.getvalue()


def _csv_cell(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, bool):
        return int(value)
    return value


def to_jsonl(records: list[dict[str, Any]], metrics: list[str] | None = None) -> str:
    keys = columns(records, metrics)
    return "".join(format_metrics_record({k: r[k] for k in keys if k in r}) + "\n" for r in records)


def steps_json(records: list[dict[str, Any]], metrics: list[str] | None = None) -> list[dict[str, Any]]:
    keys = columns(records, metrics)
    return [{k: json_value(r[k]) for k in keys if k in r} for r in records]


def attrs_json(obj: Any) -> Any:
    """An attrs result as plain JSON data (non-finite floats as null)."""
    data = attrs.asdict(obj)
    return {k: json_value(v) for k, v in data.items()}


def to_json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, indent=1, allow_nan=False) + "\n"
