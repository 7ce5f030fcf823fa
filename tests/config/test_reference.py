"""docs/config-reference.md is generated from the config model and must not be stale."""
from __future__ import annotations

from pathlib import Path

import attrs

from mftk.config import sections as S
from mftk.config.reference import START, END, config_reference_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_page_is_current():
    text = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    block = text.split(START, 1)[1].split(END, 1)[0]
    expected = config_reference_markdown().split(START, 1)[1].split(END, 1)[0]
    assert block == expected, "run: python scripts/gen_config_reference.py"


def test_every_field_is_documented_with_help():
    md = config_reference_markdown()
    missing = []
    for cls in [S.CheckpointConfig, S.TrainingConfig, S.ParallelismConfig, S.OptimizerConfig,
                S.LrSchedulerConfig, S.DatasetConfig, S.DataloaderConfig, S.TrainDatasetConfig]:
        for f in attrs.fields(cls):
            if not f.metadata.get("help"):
                missing.append(f"{cls.__name__}.{f.name}")
            assert f"| `{f.name}` |" in md
    assert missing == []
