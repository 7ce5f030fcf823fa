"""``common.json``: exactly the reference's 7 keys in its order (§3.3), read strictly.

MindSpore Transformers loads it with ``CommonInfo(**data)``, so one extra key makes it crash:
anything mftk needs beyond these keys lives in the ``mftk-state-*.json`` files instead.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs

from mftk.errors import CheckpointError

KEYS = ("epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size", "consumed_samples", "ckpt_status")


@attrs.frozen
class CommonInfo:
    """Field order is the file's key order."""

    epoch_num: int
    step_num: int
    global_step: int | None
    loss_scale: float
    global_batch_size: int | None
    consumed_samples: int | None
    ckpt_status: Any = None

    @classmethod
    def for_step(cls, *, step: int, max_steps: int, global_batch_size: int, consumed_samples: int,
                 epoch: int = 0) -> "CommonInfo":
        """What the PyNative trainer writes: epoch 0 is stored as 1, step 0 as null, step_num = training.steps."""
        return cls(epoch_num=int(epoch) if epoch else 1, step_num=int(max_steps),
                   global_step=int(step) if step else None, loss_scale=1.0,
                   global_batch_size=int(global_batch_size), consumed_samples=int(consumed_samples))

    @property
    def step(self) -> int:
        return self.global_step or 0

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), ensure_ascii=False, indent=4)


def parse_common(text: str, path: str = "common.json") -> CommonInfo:
    """Parse and check types; unknown or missing keys are errors (the reference crashes on them)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(message=f"{path}: not valid JSON ({exc})", path=path,
                              hint="the file is damaged; use an earlier iteration_* dir") from None
    if not isinstance(data, dict):
        raise CheckpointError(message=f"{path}: expected a JSON object", path=path)
    problems = [f"unknown key {k!r} (MindSpore Transformers would refuse the checkpoint)" for k in data if k not in KEYS]
    problems += [f"missing key {k!r}" for k in KEYS if k not in data]
    problems += _type_problems(data)
    if problems:
        raise CheckpointError(message=f"{path}: {len(problems)} problem(s)", path=path, problems=problems)
    return CommonInfo(**{k: data[k] for k in KEYS})


def _type_problems(data: dict[str, Any]) -> list[str]:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    rules = {"epoch_num": (is_int, False), "step_num": (is_int, False), "global_step": (is_int, True),
             "loss_scale": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), False),
             "global_batch_size": (is_int, True), "consumed_samples": (is_int, True)}
    out = []
    for key, (ok, nullable) in rules.items():
        if key in data and not (ok(data[key]) or (nullable and data[key] is None)):
            out.append(f"{key}: {data[key]!r} is not a {'non-negative integer' if ok is is_int else 'number'}"
                       + (" or null" if nullable else ""))
    return out


def read_common(step_dir: str | os.PathLike) -> CommonInfo:
    path = Path(step_dir) / "common.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(message=f"no common.json in {step_dir}", path=str(path),
                              hint="every MindSpore Transformers checkpoint dir has one; is this the right dir?") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(message=f"cannot read {path}: {exc}", path=str(path)) from None
    return parse_common(text, str(path))
