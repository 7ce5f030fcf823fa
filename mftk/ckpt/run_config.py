"""The resolved config a run stored with each checkpoint (``mftk-config.json``), read back.

Resume and export take the architecture from it rather than from whatever YAML is at hand (nanoGPT's
and litgpt's habit); checkpoints of older mftk versions kept only the ``model:`` section, in the
extra state, which is read as a fallback. A reference checkpoint has neither.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mftk.ckpt.extra_state import read_extra_state
from mftk.ckpt.layout import RESOLVED_CONFIG
from mftk.errors import CheckpointError
from mftk.files import SMALL_JSON_LIMIT, read_json


def read_run_config(step_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The resolved config saved with ``step_dir``, or None when it has none."""
    path = Path(step_dir) / RESOLVED_CONFIG
    try:
        data = read_json(path, limit=SMALL_JSON_LIMIT, error=CheckpointError, what=RESOLVED_CONFIG,
                         hint="remove the file to fall back to the current YAML's model section")
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise CheckpointError(message=f"{path}: expected a JSON object", path=str(path))
    return data


def saved_model_section(step_dir: str | os.PathLike, world: int) -> tuple[dict | None, str]:
    """(the ``model:`` section the checkpoint was trained with, where it came from); None when unknown."""
    config = read_run_config(step_dir)
    if config is not None and isinstance(config.get("model"), dict):
        return config["model"], f"{Path(step_dir).name}/{RESOLVED_CONFIG}"
    extra = read_extra_state(step_dir, 0, world)
    section = extra.get("model") if isinstance(extra, dict) else None
    if isinstance(section, dict):
        return section, f"{Path(step_dir).name}/mftk extra state"
    return None, ("has no mftk extra state (written by MindSpore Transformers or another tool)" if extra is None
                  else "was saved by an mftk version that did not record the model section")
