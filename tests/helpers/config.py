"""Typed config sections built from plain dicts, as the config model would build them from YAML."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mftk.config.load import load_data

ROOT = Path(__file__).resolve().parents[2]


def dataloader(raw: dict[str, Any]) -> Any:
    """A ``train_dataset.dataloader`` dict → the typed `DataloaderConfig` the data layer receives."""
    from mftk.config.converter import structure
    from mftk.config.sections import DataloaderConfig

    section, problems = structure(raw, DataloaderConfig, "train_dataset.dataloader")
    assert not problems, [p.render() for p in problems]
    return section


def template_dict(name: str = "qwen3_tiny") -> dict:
    """A shipped template as a plain dict (a fresh copy)."""
    return yaml.safe_load((ROOT / "templates" / f"{name}.yaml").read_text())


def load_dict(data: dict, **kw):
    kw.setdefault("check_files", False)
    return load_data(data, **kw)
