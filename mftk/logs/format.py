"""The MindSpore Transformers per-step log line, written and read by one module.

The trainer writes its step line with `format_step_line` and `parse-log` reads it back with
`parse_step_line`; a round-trip test pins the two together, so mftk logs stay readable by the
same tools (and the same `re.search(r"loss:\\s+(\\d+\\.\\d+)")` system tests) as the reference's.
The shape follows MindSpore Transformers' PyNative LossCallback (reference §2.9):

    { step:[%5d/%5d], consumed_samples: %d, global_batch_size: %d, loss: %10.6f,
      per_step_time: %6dms[, load_balancing_loss: %10.6f][, indexer_loss: %10.6f]
      [, mtp_1_loss: %10.6f, ...][, lr: %10.6e], grad_norm: %10.6f|NaN[, throughput: %6.2fT] }

This module also holds the logger prefix formats (so the trainer's lines look like the
reference's) and mftk's own JSON-lines metrics record, which keeps full precision.
"""
from __future__ import annotations

from mftk.progress import BaseSink

import json
import logging
import math
import re
from typing import Any, Callable, Mapping

# Non-last pipeline stages have no loss; the reference prints this instead of a number.
NON_LAST_STAGE_LOSS = "N/A (non-last PP stage, refer to last stage for real loss)"

# The reference's logger formats (tools/logger.py). `filepath` is a custom record attribute.
STDOUT_FORMAT = "%(asctime)s - mindformers[%(filepath)s:%(lineno)d] - %(levelname)s - %(message)s"
FILE_FORMAT = "[%(levelname)s] %(asctime)s [%(filepath)s:%(lineno)d] %(funcName)s: %(message)s"
LOSS_CALLBACK_FILEPATH = "mindformers/pynative/callback/loss_callback.py"
LOSS_CALLBACK_LINENO = 337

# Optional extra losses, in the order the reference prints them (mtp_k_loss sorted by k).
_MTP_KEY = re.compile(r"^mtp_(\d+)_loss$")


def mf_formatter(kind: str = "stdout", *, filepath: str = LOSS_CALLBACK_FILEPATH) -> logging.Formatter:
    """A `logging.Formatter` producing the reference's prefix (`kind` is "stdout" or "file").

    `asctime` keeps Python's default `YYYY-MM-DD HH:MM:SS,mmm`, as the reference does.
    Records without a `filepath` attribute get `filepath` (pass one via `extra=` to override).
    """
    fmt = {"stdout": STDOUT_FORMAT, "file": FILE_FORMAT}[kind]
    return logging.Formatter(fmt, defaults={"filepath": filepath})


def _f6(value: float) -> str:
    return "%10.6f" % value


def format_step_line(metrics: Mapping[str, Any], *, total_steps: int) -> str:
    """Render one training step exactly like MindSpore Transformers' PyNative LossCallback.

    `metrics` keys: step, consumed_samples, global_batch_size, loss (None on a non-last
    pipeline stage), per_step_time (ms), and optionally load_balancing_loss, indexer_loss,
    mtp_<k>_loss, lr, grad_norm (None prints `NaN`), throughput (model TFLOP/s per device).
    The main `loss:` stays the first `...loss:` field so `loss:\\s+(\\d+\\.\\d+)` finds it.
    """
    loss = metrics.get("loss")
    last_stage = loss is not None
    parts = [
        "step:[%5d/%5d]" % (int(metrics["step"]), int(total_steps)),
        "consumed_samples: %s" % (_int_or_none(metrics.get("consumed_samples")) if last_stage else "None"),
        "global_batch_size: %s" % (_int_or_none(metrics.get("global_batch_size")) if last_stage else "None"),
        "loss: %s" % (_f6(float(loss)) if last_stage else NON_LAST_STAGE_LOSS),
        "per_step_time: %6dms" % int(metrics["per_step_time"]),
    ]
    if last_stage:
        for key in ("load_balancing_loss", "indexer_loss"):
            if metrics.get(key) is not None:
                parts.append(f"{key}: {_f6(float(metrics[key]))}")
        mtp = sorted((int(m.group(1)), k) for k in metrics if (m := _MTP_KEY.match(k)) and metrics[k] is not None)
        parts.extend(f"{k}: {_f6(float(metrics[k]))}" for _, k in mtp)
        if metrics.get("lr") is not None:
            parts.append("lr: %10.6e" % float(metrics["lr"]))
    grad_norm = metrics.get("grad_norm") if last_stage else None
    parts.append("grad_norm: %s" % ("NaN" if grad_norm is None else _f6(float(grad_norm))))
    if last_stage and metrics.get("throughput") is not None:
        parts.append("throughput: %6.2fT" % float(metrics["throughput"]))
    return "{ " + ", ".join(parts) + " }"


def _int_or_none(value: Any) -> str:
    return "None" if value is None else "%d" % int(value)


# ---------------------------------------------------------------- reading the step line

_STEP_HEAD = re.compile(r"\{ step:\[\s*(\d+)/\s*(\d+)\],")


def parse_number(text: str) -> float | int | None:
    """A logged value as a number: `13570ms`->13570, `1.36T`->1.36, `NaN`->nan, `None`->None.

    Raises ValueError when the text is not a number in any spelling the logs use.
    The common spellings take the first branch without an exception: this runs ~10x per line.
    """
    s = text.strip()
    if s.endswith("ms"):
        s = s[:-2].rstrip()
    elif s.endswith("T"):
        s = s[:-1].rstrip()
    if s.isdigit():
        return int(s)
    try:
        return float(s)  # accepts nan, NaN, inf, 1.0E-05
    except ValueError:
        pass
    if s.startswith("[") and s.endswith("]"):
        return _bracketed(s[1:-1].strip(), text)
    if s == "None" or s.startswith("N/A"):
        return None
    if s in ("True", "False"):
        return 1 if s == "True" else 0
    raise ValueError(f"not a number: {text.strip()!r}")


class UnreadValue(ValueError):
    """A field whose text holds no single number: `global_norm: [1 31049]` (a printed array of two),
    `lr: Not Set LR.`. The line is still read; the field is left out and reported."""


def _bracketed(inner: str, text: str) -> float | int | None:
    """Static graph prints NumPy arrays: `lr:[2.4499998e-06]`, `global_norm: [1.508834]`, `is_skip: [ True]`
    (MindSpore Transformers' `print_output_info`, mindformers/core/callback/callback.py, r0.6 .. 2.1.0);
    its non-sink mode prints `loss:[step loss/running mean]`, whose first number is the step's loss.
    An array of several elements (`[1 31049]`) has no one value: reading its first would be a guess."""
    if "/" in inner:
        return parse_number(inner.split("/", 1)[0])
    if len(inner.split()) != 1:
        raise UnreadValue(f"not one number: {text.strip()!r}")
    return parse_number(inner)


def parse_step_line(line: str) -> dict[str, Any] | None:
    """Parse a PyNative step line anywhere in `line` (behind any logger prefix).

    Returns None when the line holds no `{ step:[` head; raises ValueError when it has
    the head but a field cannot be read (the caller counts it as malformed).
    """
    start = line.find("{ step:[")
    if start < 0:
        return None
    m = _STEP_HEAD.match(line, start)
    if m is None:
        raise ValueError("step counter is not `[n/N]`")
    record: dict[str, Any] = {"step": int(m.group(1)), "total_steps": int(m.group(2))}
    body = line[m.end():].rstrip()
    if body.endswith("}"):
        body = body[:-1]
    read_fields(body, record)
    if "loss" not in record:
        raise ValueError("no `loss:` field")
    if record["loss"] is None and "N/A" in body:
        record["last_stage"] = False
        record["grad_norm"] = None  # a placeholder `NaN` on non-last stages, not a real NaN
    return record


_REQUIRED = ("loss", "step")  # a line whose loss cannot be read is malformed; other fields are left out


def read_fields(body: str, record: dict[str, Any]) -> None:
    """Read `key: value` parts joined by `, ` (a part without `:` continues the previous value).

    A field other than the loss whose value is no number is left out and named in `record["unread"]`."""
    key = None
    for part in body.split(", "):
        name, sep, value = part.partition(":")
        if not sep:
            if key is None:
                raise ValueError(f"unexpected text {part.strip()!r}")
            continue  # e.g. the comma inside the non-last-stage loss text
        key = name.strip().replace(" ", "_")
        try:
            record[key] = parse_number(value)
        except ValueError:
            if key in _REQUIRED:
                raise
            record[key] = None  # left out, and said: `unread` names it (an anomaly of its own)
            note = f"{key}: {value.strip()[:60]}"
            record["unread"] = f"{record['unread']}; {note}" if record.get("unread") else note


# ---------------------------------------------------------------- mftk's JSON-lines metrics

def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def format_metrics_record(metrics: Mapping[str, Any], **extra: Any) -> str:
    """One line of mftk's metrics file: a JSON object with full-precision numbers.

    Non-finite floats are written as the strings "NaN"/"Infinity"/"-Infinity" so every line
    stays strict JSON (`json.dumps` would otherwise emit the bare, invalid `NaN`).
    """
    record = {"step": int(metrics["step"])}
    record.update({k: _json_safe(v) for k, v in metrics.items() if k != "step"})
    record.update({k: _json_safe(v) for k, v in extra.items()})
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def parse_metrics_record(line: str) -> dict[str, Any] | None:
    """Read one mftk metrics line; None when it is not a JSON step record.

    MindSpore Transformers' monitor lines (`{"step": S, "micro_step": k, ...}`) are not step
    records and also give None.
    """
    s = line.strip()
    if not (s.startswith("{") and s.endswith("}") and '"step"' in s):
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "micro_step" in obj or not isinstance(obj.get("step"), int):
        return None
    return {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in obj.items()}


class StepLineSink(BaseSink):
    """A `StepSink` that writes each step as the MF line through `emit` (e.g. `logger.info`)."""

    def __init__(self, emit: Callable[[str], None], *, total_steps: int) -> None:
        self._emit = emit
        self._total = total_steps

    def on_step(self, metrics: dict[str, Any]) -> None:
        self._emit(format_step_line(metrics, total_steps=self._total))


class MetricsFileSink:
    """A `StepSink` appending mftk JSON-lines records to `path` (flushed every step)."""

    def __init__(self, path: str, **extra: Any) -> None:
        self._file = open(path, "a", encoding="utf-8")
        self._extra = extra
        self.path = path
        self.failure: str | None = None  # the first failed write (full disk...): the trainer saves and stops

    def on_step(self, metrics: dict[str, Any]) -> None:
        try:
            self._file.write(format_metrics_record(metrics, **self._extra) + "\n")
            self._file.flush()
        except OSError as exc:
            self.failure = self.failure or f"cannot write {self.path}: {exc.strerror or exc}"

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        pass

    def on_checkpoint(self, step: int, path: str) -> None:
        pass

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:  # the unwritten tail of a failed write, reported when it failed
            if self.failure is None:
                raise
