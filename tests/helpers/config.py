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


def small_qwen3(**kw: Any) -> Any:
    """A 4-layer GQA `Qwen3ModelConfig` (4 heads, 2 KV heads, seq 16) for layout-rule tests; ``kw`` overrides."""
    from mftk.config.model import Qwen3ModelConfig

    base = dict(vocab_size=64, hidden_size=16, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=4, intermediate_size=32, seq_length=16, hidden_dropout=0.0)
    return Qwen3ModelConfig(**{**base, **kw})
