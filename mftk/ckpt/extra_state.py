"""mftk's per-rank extra state (RNG states, data position, resolved config...) as JSON.

The reference keeps none of this (§3.2: no RNG state, no dataloader state) and refuses unknown
keys in ``common.json``, so it lives in ``mftk-state-{rank:07d}-{world:07d}.json``, a file the
reference ignores (it only opens ``*.safetensors``). Numpy arrays are stored as base64 of their
little-endian bytes, so an RNG state round-trips bit for bit.
"""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from mftk.ckpt.layout import state_file_name
from mftk.errors import CheckpointError
from mftk.files import SMALL_JSON_LIMIT, read_json

FORMAT = "mftk-extra-state"
VERSION = 1
_ARRAY_KEY = "__ndarray__"


def encode(obj: Any) -> Any:
    """JSON-able form: arrays become tagged base64, numpy scalars plain numbers, tuples lists."""
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        le = a.astype(a.dtype.newbyteorder("<"), copy=False)
        return {_ARRAY_KEY: {"dtype": le.dtype.str, "shape": list(a.shape),
                             "base64": base64.b64encode(le.tobytes()).decode("ascii")}}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("extra state dict keys must be strings")
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in the extra state (use numpy arrays and plain types)")


def decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_ARRAY_KEY}:
            spec = obj[_ARRAY_KEY]
            raw = base64.b64decode(spec["base64"], validate=True)
            return np.frombuffer(raw, dtype=np.dtype(spec["dtype"])).reshape(spec["shape"]).copy()
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def dumps(state: dict[str, Any], *, step: int, rank: int, world: int) -> str:
    return json.dumps({"format": FORMAT, "version": VERSION, "step": step, "rank": rank, "world": world,
                       "state": encode(state)}, indent=1)


def read_extra_state(step_dir: str | os.PathLike, rank: int, world: int) -> dict[str, Any] | None:
    """This rank's extra state, or None when the checkpoint has none (e.g. written by the reference)."""
    path = Path(step_dir) / state_file_name(rank, world)
    hint = "resume with --weights-only, or from an earlier iteration_* dir"
    try:
        obj = read_json(path, limit=SMALL_JSON_LIMIT, error=CheckpointError, what="extra state file", hint=hint)
    except FileNotFoundError:
        return None
    try:
        if obj.get("format") != FORMAT or obj.get("version") != VERSION:
            raise ValueError(f"format {obj.get('format')!r} version {obj.get('version')!r}")
        return decode(obj["state"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(message=f"{path}: unreadable extra state ({exc})", path=str(path),
                              hint="resume with --weights-only, or from an earlier iteration_* dir") from None
