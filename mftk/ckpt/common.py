"""``common.json``: the reference's 7 keys in its order (§3.3); older and newer files read leniently.

mftk writes exactly those keys. Reading follows MindSpore Transformers 2.1.0 (2.1 §2.2): a key
an older release did not write is null (the reference's default for every field) and named in a
note; a key beyond the seven (2.1.0 drops ``data_plan_state``, written by its earlier balanced
loader) is kept on :class:`CommonInfo` and written back by :meth:`CommonInfo.to_json`, so a
resumed run passes it on instead of silently losing it. A number written as a string (the
``"loss_scale": "1.0"`` of MF's checkpoint docs, docs/mindformers/docs/source_en/feature/checkpoint_saving_and_loading.md
of the mindformers repository; MF reads the file without a type check) is read as that number and
named in a note; a string that is not plainly one number of the key's kind, and every other wrong
type, is still an error naming the file and the key.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import attrs

from mftk.errors import CheckpointError
from mftk.files import SMALL_JSON_LIMIT, parse_json, read_text

KEYS = ("epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size", "consumed_samples", "ckpt_status")
_INT_TEXT = re.compile(r"[0-9]+")  # plain decimal digits: "10", not "10.0", "1e3", " 10", "+10"
_NUMBER_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")  # "1.0", "65536", "1e3"
# Extra keys MindSpore Transformers 2.1.0 itself accepts (and drops); any other one makes it raise TypeError.
REFERENCE_DROPPED = ("data_plan_state",)


@attrs.frozen
class CommonInfo:
    """Field order is the file's key order; ``extra`` and ``missing`` describe what the file held."""

    epoch_num: int | None
    step_num: int | None
    global_step: int | None
    loss_scale: float | None
    global_batch_size: int | None
    consumed_samples: int | None
    ckpt_status: Any = None
    extra: dict[str, Any] = attrs.field(factory=dict)  # keys beyond KEYS, in file order; written back
    missing: tuple[str, ...] = ()  # KEYS the file did not have (read as null)
    from_text: tuple[tuple[str, str], ...] = ()  # (key, the string the file held) read as a number

    @classmethod
    def for_step(cls, *, step: int, max_steps: int, global_batch_size: int, consumed_samples: int,
                 epoch: int = 0, extra: dict[str, Any] | None = None) -> "CommonInfo":
        """What the PyNative trainer writes: epoch 0 is stored as 1, step 0 as null, step_num = training.steps.

        ``extra``: keys read from the checkpoint this run resumed from (``CommonInfo.extra``), passed through."""
        return cls(epoch_num=int(epoch) if epoch else 1, step_num=int(max_steps),
                   global_step=int(step) if step else None, loss_scale=1.0,
                   global_batch_size=int(global_batch_size), consumed_samples=int(consumed_samples),
                   extra=dict(extra or {}))

    @property
    def step(self) -> int:
        return self.global_step or 0

    def to_dict(self) -> dict[str, Any]:
        """The file's content: the 7 keys in order, then the kept extra keys."""
        return {**{k: getattr(self, k) for k in KEYS}, **self.extra}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=4)

    def notes(self) -> list[str]:
        """What reading this file assumed or kept, one line each (empty for a file mftk wrote)."""
        out = [f"common.json has no {k!r} (an older release): read as null, the reference's default"
               for k in self.missing]
        out += [f"common.json key {k!r} holds the string {text!r}: read as the number {getattr(self, k)!r} "
                "(MindSpore Transformers reads it without a type check; the next checkpoint writes a number)"
                for k, text in self.from_text]
        for k in self.extra:
            why = ("MindSpore Transformers 2.1.0 drops it" if k in REFERENCE_DROPPED
                   else "MindSpore Transformers 2.1.0 refuses a checkpoint with this key")
            out.append(f"common.json key {k!r} is not one of the reference's 7: kept and written to the next "
                       f"checkpoint ({why})")
        return out


def parse_common(text: str, path: str = "common.json") -> CommonInfo:
    """Parse and check types; missing keys read as null and extra keys are kept (both noted)."""
    data = parse_json(text, where=path, error=CheckpointError, hint="the file is damaged; use an earlier iteration_* dir")
    if not isinstance(data, dict):
        raise CheckpointError(message=f"{path}: expected a JSON object", path=path)
    data, from_text = _numbers_from_text(data)
    problems = _type_problems(data)
    if problems:
        raise CheckpointError(message=f"{path}: {len(problems)} problem(s)", path=path, problems=problems,
                              hint="each key holds a number (or null); a damaged file: use an earlier iteration_* dir")
    return CommonInfo(**{k: data.get(k) for k in KEYS}, extra={k: v for k, v in data.items() if k not in KEYS},
                      missing=tuple(k for k in KEYS if k not in data), from_text=from_text)


def _numbers_from_text(data: dict[str, Any]) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """Numeric strings of the numeric keys as numbers; anything else is left for `_type_problems` to refuse.

    An integer key takes plain digits only ("10"); ``loss_scale`` takes one finite decimal number ("1.0",
    "1e3"). "10.5" for a step, "nan", "", "1,000" or " 10" are ambiguous and stay errors."""
    out, read = dict(data), []
    for key in KEYS[:-1]:
        text = data.get(key)
        if not isinstance(text, str):
            continue
        if key == "loss_scale":
            if _NUMBER_TEXT.fullmatch(text) and math.isfinite(float(text)):
                out[key] = float(text)
        elif _INT_TEXT.fullmatch(text):
            out[key] = int(text)
        if out[key] is not text:
            read.append((key, text))
    return out, tuple(read)


def _type_problems(data: dict[str, Any]) -> list[str]:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    def is_number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    out = []
    for key in KEYS[:-1]:  # every field may be null (the reference's default); ckpt_status is free-form
        ok = is_number if key == "loss_scale" else is_int
        if data.get(key) is not None and not ok(data[key]):
            out.append(f"{key}: {data[key]!r} is not a {'non-negative integer' if ok is is_int else 'number'} or null"
                       + (" (a string that is not plainly one)" if isinstance(data[key], str) else ""))
    return out


def read_common(step_dir: str | os.PathLike) -> CommonInfo:
    path = Path(step_dir) / "common.json"
    try:
        text = read_text(path, limit=SMALL_JSON_LIMIT, error=CheckpointError, what="common.json")
    except FileNotFoundError:
        raise CheckpointError(message=f"no common.json in {step_dir}", path=str(path),
                              hint="every MindSpore Transformers checkpoint dir has one; is this the right dir?") from None
    return parse_common(text, str(path))
