"""`mftk resume` through the CLI: continue from the save root, dry run, weights-only, bad sources."""
from __future__ import annotations

import json

import pytest
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.tiny import train_tiny_via_cli

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    return d, train_tiny_via_cli(d)


def test_dry_run_shows_plan_and_loads_nothing(trained):
    d, cfg = trained
    r = runner.invoke(app, ["resume", str(cfg), "--dry-run", "--json", "--set", "training.global_batch_size=2",
                            "--set", "training.steps=4", "--output-dir", str(d / "dry")])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["scenario"] == 3 and plan["saved_step"] == 2 and plan["start_step"] == 1
    assert plan["consumed_samples"] == 2 and plan["missing"] == [] and plan["unexpected"] == []
    assert not (d / "dry").exists()


def test_resume_continues_to_target(trained, tmp_path):
    d, cfg = trained
    r = runner.invoke(app, ["resume", str(cfg), "--set", "training.steps=3", "--set",
                            f"checkpoint.save_path={tmp_path / 'c'}", "--from", str(d / "ckpt"),
                            "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    steps = [l for l in r.stdout.splitlines() if "{ step:[" in l]
    assert len(steps) == 1 and "step:[    3/    3]" in steps[0] and "consumed_samples: 3" in steps[0]


def test_weights_only_starts_at_zero(trained, tmp_path):
    d, cfg = trained
    r = runner.invoke(app, ["resume", str(cfg), "--weights-only", "--from", str(d / "ckpt"), "--set",
                            f"checkpoint.save_path={tmp_path / 'c'}", "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "step:[    1/    2]" in r.stdout


def test_missing_source_is_an_error(trained, tmp_path):
    d, cfg = trained
    r = runner.invoke(app, ["resume", str(cfg), "--from", str(tmp_path / "typo")])
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_mismatched_model_takes_the_checkpoints_architecture(trained):
    """The checkpoint stores the resolved config: a YAML whose model: does not fit resumes with the saved
    architecture, and the differing keys are named (issue: checkpoints store the resolved config)."""
    d, cfg = trained
    r = runner.invoke(app, ["resume", str(cfg), "--dry-run", "--json", "--set", "model.hidden_size=32",
                            "--set", "model.num_attention_heads=2", "--set", "model.num_key_value_heads=1"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["missing"] == [] and plan["mismatched"] == []
    assert "architecture is taken from the checkpoint" in r.stderr and "model.hidden_size: YAML 32, checkpoint 64" in r.stderr


def test_mismatched_model_without_a_saved_config_is_refused(trained, tmp_path):
    import shutil

    d, cfg = trained
    ref = tmp_path / "ref"
    shutil.copytree(d / "ckpt", ref)
    for f in ref.glob("iteration_*/mftk-config.json"):  # as MindSpore Transformers writes it: no mftk config
        f.unlink()
    r = runner.invoke(app, ["resume", str(cfg), "--dry-run", "--from", str(ref), "--set", "model.hidden_size=32",
                            "--set", "model.num_attention_heads=2", "--set", "model.num_key_value_heads=1",
                            "--set", f"checkpoint.save_path={tmp_path / 'new'}"])
    assert r.exit_code == 1, r.output
    assert "does not fit" in r.stderr
