"""Every shipped template loads and validates; the tiny ones point at data that exists in the repo."""
from __future__ import annotations

from pathlib import Path

import pytest

from mftk.config.load import load_config

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = sorted((ROOT / "templates").glob("*.yaml"))


def test_templates_exist():
    assert {p.name for p in TEMPLATES} >= {"qwen3_tiny.yaml", "deepseek_v3_tiny.yaml", "qwen3_0.6b.yaml",
                                           "deepseek_v3_1b.yaml", "deepseek_v4_tiny.yaml", "deepseek_v4_flash.yaml",
                                           "qwen3_moe_tiny.yaml"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_validates(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # data paths are relative to the repository root
    tiny = "tiny" in path.name
    loaded = load_config(path, check_files=tiny)
    assert [p for p in loaded.notes if p.severity == "error"] == []
    if tiny:
        assert loaded.config.model.vocab_size >= 4096          # the example tokenizer's vocabulary
        assert loaded.config.dataset.eod == 0                   # its <|endoftext|> id
        for world in (1, 2, 4):                                 # one file for 1, 2 and 4 workers
            load_config(path, world_size=world, check_files=False)
