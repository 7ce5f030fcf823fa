"""The mutation check of the status table (`scripts/field_effects.py`): every implemented field's proving test
fails when config loading forgets the field after validation (`mftk/config/mutant.py`).

The script runs each proving test as it is, then under each field's mutant. The slow test here runs what CI
runs (`--ci`: the fastest proving tests, 5 min of measured runs, in one pytest session); the full script adds
the others and the multi-process ones.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mftk.config.load import load_data
from mftk.config.mutant import ENV, reset_field
from mftk.config.status import proving_tests

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


def _script():
    """scripts/field_effects.py as a module (not a package: loaded from its file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("field_effects", ROOT / "scripts" / "field_effects.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ci_takes_the_fastest_fast_fields_up_to_its_budget():
    """Fastest first until the sum would pass the budget; an unmeasured (new) field first, at the median."""
    fe = _script()
    measured = {"a": 1.0, "b": 4.0, "c": 2.0, "d": 9.0}
    assert fe.ci_fields(["a", "b", "c", "d"], measured, budget_s=7.0) == (["a", "b", "c"], ["d"])
    assert fe.ci_fields(["a", "b", "c", "d"], measured, budget_s=6.9) == (["a", "c"], ["b", "d"])
    assert fe.ci_fields(["a", "new", "d"], measured, budget_s=6.0) == (["a", "new"], ["d"])  # median 4.0


def test_the_measured_seconds_name_current_fast_fields():
    """A renamed or removed field leaves no stale entry behind (`--save-seconds` rewrites the file)."""
    fe = _script()
    fast = {f for f, _, slow in proving_tests() if not slow}
    assert set(fe._measured()) <= fast


def test_msrun_workers_get_the_mutant(monkeypatch):
    """The slow rows' multi-process tests run under the mutant: msrun and its workers are started with the
    launcher's environment (`engine.launch._worker_env`; msrun's own Popen passes no env of its own), and
    each worker loads its config through `load.load_data`."""
    from mftk.engine.launch import LaunchSpec, _worker_env

    monkeypatch.setenv(ENV, "parallelism.tensor_parallel")
    assert _worker_env(LaunchSpec(nproc=2), None)[ENV] == "parallelism.tensor_parallel"


@pytest.mark.slow
def test_no_ci_field_survives_its_mutant(tmp_path):
    """CI's part: the fast fields `--ci` picks (fastest first, 5 min of measured runs; `--ci --list` names
    them), each proving test run under its field's mutant in one pytest session. Without the unmutated
    baseline runs: the suite runs those same tests, so a failing one is red there already. The rest (the
    slower fast rows, the multi-process rows) run with `python scripts/field_effects.py`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ENV, None)
    out = tmp_path / "effects.json"
    script = [sys.executable, str(ROOT / "scripts" / "field_effects.py"), "--ci", "--skip-baseline", "--json", str(out)]
    r = subprocess.run(script, cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    survivors = {f: how for f, how in results.items() if not how.startswith("killed")}
    assert results and not survivors, f"fields whose proving test passes with the field forgotten: {survivors}"
    assert r.returncode == 0, r.stdout[-3000:]
