"""The mutation check of the status table (`scripts/field_effects.py`): every implemented field's proving test
fails when config loading forgets the field after validation (`mftk/config/mutant.py`).

The check itself runs each fast proving test twice per field (as it is, then under the mutant): the slow test
here runs what CI runs (`--fast`: the proving tests under ~5 s); the full script adds the multi-process ones.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mftk.config.load import load_data
from mftk.config.mutant import ENV, reset_field

ROOT = Path(__file__).resolve().parents[2]


def _template(name: str = "qwen3_tiny.yaml") -> dict:
    return yaml.safe_load((ROOT / "templates" / name).read_text())


def test_the_mutant_forgets_one_field_after_validation(monkeypatch):
    """Validated with the YAML's value (an invalid one is still an error), then the field is the default."""
    from mftk.errors import ConfigError

    raw = _template()
    raw["lr_scheduler"]["learning_rate"] = 0.5
    raw["model"]["rope_theta"] = 77.0
    monkeypatch.setenv(ENV, "lr_scheduler.learning_rate")
    config = load_data(raw, check_files=False).config
    assert config.lr_scheduler.learning_rate == 1e-5 and config.model.rope_theta == 77.0
    monkeypatch.setenv(ENV, "model.rope_theta")
    config = load_data(raw, check_files=False).config
    assert config.lr_scheduler.learning_rate == 0.5 and config.model.rope_theta != 77.0
    raw["lr_scheduler"]["learning_rate"] = -1.0
    with pytest.raises(ConfigError):
        load_data(raw, check_files=False)
    monkeypatch.delenv(ENV)
    raw["lr_scheduler"]["learning_rate"] = 0.5
    assert load_data(raw, check_files=False).config.lr_scheduler.learning_rate == 0.5


def test_reset_covers_list_items_and_absent_sections():
    raw = _template()
    raw["callbacks"] = [{"type": "MaxLogitsMonitor", "step_interval": 3}]
    config = load_data(raw, check_files=False).config
    assert reset_field(config, "callbacks.step_interval").callbacks[0].step_interval == 1
    assert reset_field(config, "lora_config.lora_rank").lora_config is None
    with pytest.raises(KeyError):
        reset_field(config, "training.no_such_field")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MFTK_FIELD_EFFECTS") != "1",
                    reason="20-40 min of mutant runs: MFTK_FIELD_EFFECTS=1 runs it (scripts/field_effects.py --fast)")
def test_no_fast_field_survives_its_mutant():
    """CI's part: every field whose proving test runs in under ~5 s (rows not marked slow). Without the
    unmutated baseline runs: the suite runs those same tests, so a failing one is red there already. About
    40 minutes on this 2-core machine under load (177 fields, two or three tiny runs each)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ENV, None)
    script = [sys.executable, str(ROOT / "scripts" / "field_effects.py"), "--fast", "--skip-baseline"]
    r = subprocess.run(script, cwd=ROOT, env=env, capture_output=True, text=True)
    tail = r.stdout[-6000:]
    assert r.returncode == 0 and "surviving or unproven: 0" in r.stdout, tail
