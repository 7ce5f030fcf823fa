"""`mftk/quickstart.py`: the plan's checks and commands, and the config written from a template."""
import pytest
import yaml

from mftk.errors import InputError
from mftk.quickstart import QuickstartPlan, checkpoint_steps, config_overrides, make_plan, template_path, write_config


GOOD = {"model": "qwen3", "nproc": 1, "steps": 4, "resume_steps": 1}


@pytest.mark.parametrize("kwargs, words", [
    ({"model": "gpt2"}, "--model 'gpt2'"),
    ({"steps": 1}, "--steps 1: must be at least 2"),
    ({"nproc": 0}, "--nproc 0"),
    ({"resume_steps": 0}, "--resume-steps 0"),
])
def test_bad_options(tmp_path, kwargs, words):
    with pytest.raises(InputError) as exc:
        make_plan(tmp_path / "qs", **{**GOOD, **kwargs})
    assert words in exc.value.message
    assert not (tmp_path / "qs").exists()


def test_plan_creates_workdir_and_lists_commands(tmp_path):
    plan = make_plan(tmp_path / "qs", model="deepseek_v3", nproc=2, steps=30, resume_steps=5)
    assert (tmp_path / "qs" / "data").is_dir()
    cmds = plan.commands()
    assert cmds["train"] == ["train", "deepseek_v3_quickstart.yaml", "--output-dir", "output", "--nproc", "2"]
    assert "training.steps=35" in cmds["resume"] and cmds["resume"][-2:] == ["--nproc", "2"]
    assert cmds["inspect-ckpt"] == ["inspect-ckpt", "output/checkpoint/iteration_00000030"]
    assert cmds["validate-config"][-2:] == ["--world-size", "2"]
    assert plan.save_every == 7 and plan.seq_length == 128


@pytest.mark.parametrize("model", ["qwen3", "deepseek_v3"])
def test_config_is_the_template_with_only_the_overrides_changed(tmp_path, model):
    plan = make_plan(tmp_path, model=model, nproc=2, steps=12, resume_steps=3)
    path = write_config(plan, vocab_size=512, eod_id=0)
    written = yaml.safe_load(path.read_text())
    template = yaml.safe_load(template_path(model).read_text())
    # The expected file, by hand: the template with exactly these keys replaced.
    template["train_dataset"]["dataloader"]["config"]["data_path"] = ["1", "data/quickstart_text_document"]
    template["train_dataset"]["dataloader"]["sizes"] = [15 * 8, 0, 0]
    template["model"]["vocab_size"] = 512
    template["training"]["steps"] = 12
    template["lr_scheduler"]["type"] = "ConstantWarmUpLR"
    template["checkpoint"].update(save_path="output/checkpoint", save_interleaved_steps=3, save_max=3)
    assert written == template
    text = path.read_text()
    assert text.startswith("# Written by `mftk quickstart`")
    assert all(f"#   --set {o}\n" in text for o in config_overrides(plan, 512, 0))


def test_config_rejected_by_the_model_is_not_written(tmp_path):
    """A vocabulary the model section refuses stops stage 4 before any file appears."""
    from mftk.errors import ConfigError

    plan = make_plan(tmp_path, **GOOD)
    with pytest.raises(ConfigError):
        write_config(plan, vocab_size=0, eod_id=0)
    assert not list(tmp_path.glob("*.yaml")) and not list(tmp_path.glob(".*tmp*"))


def test_default_steps_per_model(tmp_path):
    assert make_plan(tmp_path, **{**GOOD, "steps": None}).steps == 40
    assert make_plan(tmp_path, **{**GOOD, "steps": None, "model": "deepseek_v3"}).steps == 20


def test_previous_output_is_set_aside_once(tmp_path):
    from mftk.quickstart import set_aside_previous_output

    plan = make_plan(tmp_path, **GOOD)
    assert set_aside_previous_output(plan) is None
    for run in ("first", "second"):
        (tmp_path / "output/log").mkdir(parents=True)
        (tmp_path / "output/log/info.log").write_text(run)
        assert set_aside_previous_output(plan) == tmp_path / "output.previous"
    assert not (tmp_path / "output").exists()
    assert (tmp_path / "output.previous/log/info.log").read_text() == "second"


def test_checkpoint_steps_reads_only_iteration_dirs(tmp_path):
    plan = QuickstartPlan(workdir=tmp_path, model="qwen3", nproc=1, steps=4, resume_steps=1)
    assert checkpoint_steps(plan) == []
    root = tmp_path / "output/checkpoint"
    for name in ("iteration_00000010", "iteration_00000002", "iteration_tmp", "other"):
        (root / name).mkdir(parents=True)
    (root / "iteration_00000020").write_text("a file, not a step dir")
    assert checkpoint_steps(plan) == [2, 10]
