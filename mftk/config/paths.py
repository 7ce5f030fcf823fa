"""Paths in a YAML and on the command line: one rule for ``~`` and environment variables, and where relative data
paths are found.

Expansion (`mftk.files.expand_path`, the one rule): every path setting (a field declared with ``path=True`` in `config.sections`) and every
path a command takes expands ``~``, ``~user``, ``$VAR`` and ``${VAR}`` as a shell would, so ``save_path: ~/ck`` is
the home folder's ``ck`` and not a folder named ``~`` in the working directory (MindSpore Transformers 2.1.0 reads
YAML paths as written, so there ``~/ck`` creates ``./~/ck`` while reading as the home folder: an ``rm -rf`` trap).
A path naming a variable that is not set, or a user that does not exist, is refused naming the setting: expanding
it to an empty string or keeping it literally would both write somewhere the user did not mean.

Relative data paths: the working directory first (as the reference reads them), then the YAML's own
directory, so a template that ships with its data (``templates/data/...``) works from any directory.
Only paths that do not exist relative to the working directory but do exist next to the YAML are rewritten,
each with a note naming both; everything else is left as written, so a YAML keeps the reference's meaning.
"""
from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any, Callable

import attrs

from mftk.errors import Problem
from mftk.files import EXPANSION_HINT, UnexpandablePath, expand_path

def expand_config_paths(raw: dict) -> list[Problem]:
    """Expand (in ``raw``) every path setting of the YAML; a note for each one changed, an error for each that
    cannot be expanded. Numbers in a blend list (its weights) are left alone."""
    from mftk.config import sections as S

    problems: list[Problem] = []
    _expand_section(raw, S.Config, "", problems)
    return problems


def _expand_section(data: Any, cls: type, path: str, problems: list[Problem]) -> None:
    if not isinstance(data, dict):
        return
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):
        if f.name not in data:
            continue
        child = f"{path}.{f.name}" if path else f.name
        inner = _unwrap(hints[f.name])
        if attrs.has(inner):
            _expand_section(data[f.name], inner, child, problems)
        elif f.metadata.get("path"):
            value = data[f.name]
            if isinstance(value, str):
                data[f.name] = _expand_one(value, child, problems)
            elif isinstance(value, list):
                data[f.name] = [_expand_one(v, f"{child}[{i}]", problems) if isinstance(v, str) else v
                                for i, v in enumerate(value)]


def _unwrap(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp


def _expand_one(value: str, path: str, problems: list[Problem]) -> str:
    try:
        expanded = expand_path(value)
    except UnexpandablePath as exc:
        problems.append(Problem(path=path, value=value, message=str(exc), hint=EXPANSION_HINT))
        return value
    if expanded != value:
        problems.append(Problem(path=path, value=value, severity="note",
                                message=f"{value!r}: ~ and environment variables expanded, as a shell would"))
    return expanded

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
