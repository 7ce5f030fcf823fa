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


SMALLER = ["--set", "model.hidden_size=32", "--set", "model.num_attention_heads=2", "--set", "model.num_key_value_heads=1"]


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "real run"])
def test_mismatched_model_is_an_error_listing_the_fields(trained, tmp_path, dry):
    """A YAML whose model: differs from the checkpoint's saved config is refused, naming each differing field,
    by the dry run and the real run alike (issue 35: it resumed with exit 0 and trained the checkpoint's model)."""
    d, cfg = trained
    r = runner.invoke(app, ["resume", str(cfg), *(["--dry-run"] if dry else []), *SMALLER, "--from", str(d / "ckpt"),
                            "--set", f"checkpoint.save_path={tmp_path / 'c'}", "--output-dir", str(tmp_path / "out")],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 1, r.output
    assert "differs from the checkpoint's" in r.stderr and "--model-from-checkpoint" in r.stderr
    for field in ("model.hidden_size: YAML 32, checkpoint 64", "model.num_attention_heads: YAML 2, checkpoint 4",
                  "model.num_key_value_heads: YAML 1, checkpoint 2"):
        assert r.stderr.count(field) == 1, r.stderr
    assert "trained steps" not in r.stdout and not list(tmp_path.glob("c/iteration_*"))


def test_another_family_against_the_checkpoint_is_refused(trained, tmp_path):
    """A DeepSeek-V3 YAML against this Qwen3 checkpoint: the family is among the differing fields."""
    import yaml

    from tests.helpers.tiny import tiny_raw

    d, cfg = trained
    data_path = yaml.safe_load(cfg.read_text())["train_dataset"]["dataloader"]["config"]["data_path"][-1]
    other = tmp_path / "ds3.yaml"
    other.write_text(yaml.safe_dump(tiny_raw("deepseek_v3_tiny.yaml", data_path, tmp_path / "c", steps=4)))
    r = runner.invoke(app, ["resume", str(other), "--dry-run", "--from", str(d / "ckpt")], env={"COLUMNS": "400"})
    assert r.exit_code == 1, r.output
    assert "model.model_type: YAML 'deepseek_v3', checkpoint 'qwen3'" in r.stderr, r.stderr


def test_model_from_checkpoint_trains_the_checkpoints_architecture(trained, tmp_path):
    """With the opt-in the saved architecture is trained, and the summary counts its parameters (the
    checkpoint's own tensors), not the YAML's."""
    import numpy as np
    from safetensors.numpy import load_file

    from mftk.units import count

    d, cfg = trained
    dry = runner.invoke(app, ["resume", str(cfg), "--dry-run", "--json", "--model-from-checkpoint", *SMALLER])
    assert dry.exit_code == 0, dry.output
    plan = json.loads(dry.stdout)
    assert plan["missing"] == [] and plan["mismatched"] == []
    assert "architecture is taken from the checkpoint" in dry.stderr and "model.hidden_size: YAML 32, checkpoint 64" \
        in dry.stderr
    r = runner.invoke(app, ["resume", str(cfg), "--model-from-checkpoint", *SMALLER, "--set", "training.steps=3",
                            "--from", str(d / "ckpt"),
                            "--set", f"checkpoint.save_path={tmp_path / 'c'}", "--output-dir", str(tmp_path / "out")],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    step_dir = sorted((d / "ckpt").glob("iteration_*"))[-1]
    weights = {k: v for f in step_dir.glob("*.safetensors") if "opt" not in f.name for k, v in load_file(f).items()}
    total = sum(int(np.prod(v.shape)) for k, v in weights.items() if not k.endswith("max_logits_val"))
    assert f"model {count(total)} parameters" in r.stdout, r.stdout


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "real run"])
def test_target_step_below_the_checkpoints_is_an_error(trained, tmp_path, dry):
    d, cfg = trained  # saved at step 2
    r = runner.invoke(app, ["resume", str(cfg), *(["--dry-run"] if dry else []), "--set", "training.steps=1",
                            "--from", str(d / "ckpt"),
                            "--set", f"checkpoint.save_path={tmp_path / 'c'}", "--output-dir", str(tmp_path / "out")],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 1, r.output
    assert "training.steps: 1 is below the step this resume starts from (2" in r.stderr, r.stderr
    assert "trained steps" not in r.stdout and not list(tmp_path.glob("c/iteration_*"))


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


def test_numeric_strings_in_common_json_resume_with_a_note(trained, tmp_path):
    """MF's checkpoint docs show ``"loss_scale": "1.0"``: every scenario used to be refused over it."""
    import shutil

    d, cfg = trained
    src = tmp_path / "ck"
    shutil.copytree(d / "ckpt", src)
    step_dir = sorted(src.glob("iteration_*"))[-1]
    common = json.loads((step_dir / "common.json").read_text())
    common.update(loss_scale="1.0", global_step=str(common["global_step"]))
    (step_dir / "common.json").write_text(json.dumps(common))
    for extra in ([], ["--weights-only"]):
        r = runner.invoke(app, ["resume", str(cfg), "--dry-run", "--json", "--from", str(src), *extra,
                                "--set", f"checkpoint.save_path={tmp_path / 'new'}"],
                          env={"COLUMNS": "400"})
        assert r.exit_code == 0, r.output
        plan = json.loads(r.stdout)
        assert any("'loss_scale' holds the string '1.0'" in n for n in plan["notes"]), plan["notes"]
        if not extra:
            assert plan["saved_step"] == 2 and plan["start_step"] == 2
