"""Rewrites of the raw YAML before it is structured: one canonical form for everything downstream.

Two kinds, both said out loud:

- **Moved keys.** Settings only mftk has live under the top-level ``mftk:`` section, which
  MindSpore Transformers ignores (it rejects unknown keys inside its own sections, 2.1 §1.1), so
  one YAML serves both tools. The old spellings still work, with a warning naming the new path;
  the config model has only the new one, so every reader goes through one accessor.
- **Canonical forms.** Shapes the reference accepts that mean the same thing (2.1 §1.7, §1.9):
  one string for a one-entry ``dataset_files`` list, unquoted numeric weights in ``data_path``,
  integer layer ids in ``full_recompute_layer``. They are normalised here, once, so the data
  code and the rules see one form.
"""
from __future__ import annotations

from typing import Any

from mftk.config.yamlio import LineMap
from mftk.errors import Problem

# (old dotted path, new dotted path, why the old one had to go)
MOVED: tuple[tuple[str, str, str], ...] = (
    ("training.low_priority_dispatch", "mftk.low_priority_dispatch",
     "an mftk-only setting: MindSpore Transformers rejects unknown keys inside `training:`"),
    ("train_dataset.input_columns", "train_dataset.dataloader.column_names",
     "the reference's key for the columns passed to the model (input_columns is a static-graph key that "
     "MindSpore Transformers rejects inside a PyNative `train_dataset:`)"),
)
_BLEND_KEYS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")
_DATA = "train_dataset.dataloader.config"


def normalize_raw(raw: dict, lines: LineMap) -> list[Problem]:
    """Rewrite ``raw`` in place (moved keys, canonical forms); return the notes, warnings and errors."""
    problems: list[Problem] = []
    for old, new, why in MOVED:
        _move(raw, old, new, why, lines, problems)
    _canonical_forms(raw, problems)
    return problems


def _lookup(raw: Any, path: str) -> tuple[dict | None, str]:
    """(the mapping holding the last key of ``path``, that key); (None, key) when a level is missing."""
    *parents, key = path.split(".")
    node = raw
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), key


def _move(raw: dict, old: str, new: str, why: str, lines: LineMap, problems: list[Problem]) -> None:
    holder, key = _lookup(raw, old)
    if holder is None or key not in holder:
        return
    target, new_key = _lookup(raw, new)
    if target is None:  # create the missing levels; a level that is not a mapping is reported by the converter
        node = raw
        for p in new.split(".")[:-1]:
            if node.get(p) is None:
                node[p] = {}
            if not isinstance(node[p], dict):
                return
            node = node[p]
        target = node
    value = holder.pop(key)
    if new_key in target and target[new_key] != value:
        problems.append(Problem(path=old, value=value, message=f"deprecated spelling of `{new}`, which is also set, "
                                f"to {target[new_key]!r}", hint=f"keep only `{new}`"))
        return
    target[new_key] = value
    if new not in lines and old in lines:
        lines[new] = lines[old]
    problems.append(Problem(path=old, severity="warning", value=value, message=f"deprecated spelling: read as "
                            f"`{new}` ({why})", hint=f"move it to `{new}`"))


def _canonical_forms(raw: dict, problems: list[Problem]) -> None:
    loader, _ = _lookup(raw, "train_dataset.dataloader.type")
    if loader is not None and isinstance(loader.get("dataset_files"), str):
        loader["dataset_files"] = [loader["dataset_files"]]  # MindDataset accepts str or list[str] (§1.9)
    data, _ = _lookup(raw, f"{_DATA}.seq_length")
    for key in _BLEND_KEYS if data is not None else ():
        value = data.get(key)
        if isinstance(value, str):
            data[key] = [value]
            problems.append(Problem(path=f"{_DATA}.{key}", value=value, message="a single string, not a list "
                                    "(MindSpore Transformers would read it character by character)",
                                    hint=f"write a list: {key}: [{value!r}]"))
        elif isinstance(value, list):
            data[key] = [_number_text(v) for v in value]
    recompute = raw.get("recompute")
    if isinstance(recompute, dict) and isinstance(recompute.get("full_recompute_layer"), list):
        recompute["full_recompute_layer"] = [_number_text(v) for v in recompute["full_recompute_layer"]]


def _number_text(value: Any) -> Any:
    """An unquoted number as the string the reference's own parser reads (``0.3`` → ``'0.3'``); else unchanged."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value
