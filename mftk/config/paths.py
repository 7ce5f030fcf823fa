"""Relative data paths in a YAML: the working directory first (as the reference reads them), then the YAML's own
directory, so a template that ships with its data (``templates/data/...``) works from any directory.

Only paths that do not exist relative to the working directory but do exist next to the YAML are rewritten,
each with a note naming both; everything else is left as written, so a YAML keeps the reference's meaning.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from mftk.errors import Problem

_LOADER = "train_dataset.dataloader"
_PREFIX_KEYS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")


def _prefix_exists(p: Path) -> bool:
    return Path(f"{p}.bin").is_file() or Path(f"{p}.idx").is_file()


def resolve_data_paths(raw: dict, base_dir: str | os.PathLike | None) -> list[Problem]:
    """Rewrite (in ``raw``) relative data paths found only next to the YAML; one note per rewrite."""
    if base_dir is None:
        return []
    base = Path(base_dir)
    if base.resolve() == Path.cwd().resolve():
        return []
    loader = raw.get("train_dataset", {}).get("dataloader") if isinstance(raw.get("train_dataset"), dict) else None
    if not isinstance(loader, dict):
        return []
    notes: list[Problem] = []
    cfg = loader.get("config")
    if isinstance(cfg, dict):
        for key in _PREFIX_KEYS:
            if isinstance(cfg.get(key), list):
                _rewrite(cfg[key], f"{_LOADER}.config.{key}", base, _prefix_exists, notes)
    if isinstance(loader.get("dataset_files"), list):
        _rewrite(loader["dataset_files"], f"{_LOADER}.dataset_files", base, Path.exists, notes)
    return notes


def _rewrite(items: list, path: str, base: Path, exists: Callable[[Path], bool], notes: list[Problem]) -> None:
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip() or os.path.isabs(item.strip()) or _numeric(item):
            continue
        here, there = Path(item.strip()), base / item.strip()
        if exists(here) or not exists(there):
            continue
        rel = os.path.relpath(there)
        items[i] = rel if not rel.startswith("..") else str(there.resolve())
        notes.append(Problem(path=f"{path}[{i}]", value=item, severity="note",
                             message=f"{item!r} is not in the working directory; using {items[i]!r}, next to the "
                                     "config file"))


def _numeric(text: Any) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True
