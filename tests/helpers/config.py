"""Typed config sections built from plain dicts, as the config model would build them from YAML."""
from __future__ import annotations

from typing import Any


def dataloader(raw: dict[str, Any]) -> Any:
    """A ``train_dataset.dataloader`` dict → the typed `DataloaderConfig` the data layer receives."""
    from mftk.config.converter import structure
    from mftk.config.sections import DataloaderConfig

    section, problems = structure(raw, DataloaderConfig, "train_dataset.dataloader")
    assert not problems, [p.render() for p in problems]
    return section
