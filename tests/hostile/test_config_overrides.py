"""Bad input, round three (issue 35, "Config and overrides"): a mistyped override, a mapping override, a
schedule longer than the run, a non-positive degree in plan-parallel, and an ambiguous size."""
from __future__ import annotations

import json

import pytest

from mftk.config.load import load_data
from tests.helpers.config import template_dict
from tests.helpers.hostile import ROOT, assert_clean_failure, flat, mftk

TEMPLATE = str(ROOT / "templates" / "qwen3_tiny.yaml")


@pytest.mark.parametrize("command", ["validate-config", "plan-parallel", "train", "resume"])
def test_an_override_that_names_no_setting_is_a_usage_error(command, tmp_path):
    extra = ["--world-size", "2"] if command == "plan-parallel" else \
        ["--output-dir", str(tmp_path / "o")] if command in ("train", "resume") else []
    r = mftk(command, TEMPLATE, *extra, "--set", "modle.hidden_size=128")
    assert_clean_failure(r, 2, "--set modle.hidden_size=128: 'modle' names no setting", "did you mean 'model'?")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("item,key,hint", [("model.hidden_sizee=128", "model.hidden_sizee", "hidden_size"),
                                           ("training.stepz=3", "training.stepz", "did you mean 'steps'?")])
def test_a_misspelt_key_inside_a_section(item, key, hint):
    r = mftk("validate-config", TEMPLATE, "--no-check-files", "--set", item)
    assert_clean_failure(r, 2, f"--set {item}: '{key}' names no setting", hint)


def test_a_mapping_override_merges_into_the_section():
    data = template_dict()
    before = data["training"]
    assert before["global_batch_size"] == 8 and before["seed"] == 42 and before["max_norm"] == 1.0  # the template's
    cfg = load_data(data, overrides=["training={steps: 5}"], check_files=False).config
    assert cfg.training.steps == 5
    assert (cfg.training.global_batch_size, cfg.training.seed, cfg.training.max_norm) == (8, 42, 1.0)


def test_a_nested_mapping_override_merges_at_every_level():
    data = template_dict()
    data["train_dataset"]["dataloader"]["config"]["seed"] = 99
    cfg = load_data(data, overrides=["train_dataset={dataloader: {shuffle: true}}"], check_files=False).config
    assert cfg.train_dataset.dataloader.shuffle is True
    assert cfg.train_dataset.dataloader.config.seed == 99


def test_a_warmup_longer_than_the_run_is_a_warning_naming_both_numbers():
    r = mftk("validate-config", TEMPLATE, "--no-check-files", "--set", "lr_scheduler.warmup_steps=100",
             "--set", "training.steps=10")
    assert r.returncode == 0, r.stderr
    assert "the warm-up (100 steps) does not complete within training.steps (10)" in flat(r.stderr)


@pytest.mark.parametrize("sets,path,numbers", [
    ({"type": "WarmUpStableDecayLR", "warmup_steps": 2, "decay_start_steps": 40}, "decay_start_steps",
     "the decay starts at step 40, not before training.steps (30)"),
    ({"type": "ConstantWithCoolDownLR", "warmup_steps": 2, "keep_steps": 10, "decay_steps": 25, "lr_end2": 1e-5},
     "decay_steps", "the cool-down ends at step 37 (warm-up 2 + keep_steps 10 + decay_steps 25), after "
                    "training.steps (30)"),
    ({"type": "PolynomialWithWarmUpLR", "warmup_steps": 3, "decay_steps": 28}, "decay_steps",
     "the decay ends at step 31 (warm-up 3 + decay_steps 28), after training.steps (30)"),
])
def test_a_decay_longer_than_the_run_is_a_warning(sets, path, numbers):
    data = template_dict()
    data["lr_scheduler"].update(sets)
    notes = load_data(data, check_files=False).notes
    found = [p for p in notes if p.path == f"lr_scheduler.{path}"]
    assert found and found[0].severity == "warning" and numbers in found[0].message, [p.render() for p in notes]


def test_a_schedule_that_fits_says_nothing():
    notes = load_data(template_dict(), check_files=False).notes  # warm-up 3 of 30 steps
    assert not [p for p in notes if p.path.startswith("lr_scheduler.") and p.severity == "warning"]


@pytest.mark.parametrize("key,value", [("tensor_parallel", 0), ("pipeline_parallel", -1), ("context_parallel", 0),
                                       ("expert_parallel", 0), ("data_parallel_shard", -3)])
def test_plan_parallel_refuses_a_non_positive_degree_without_check(key, value):
    r = mftk("plan-parallel", TEMPLATE, "--world-size", "2", "--set", f"parallelism.{key}={value}")
    assert_clean_failure(r, 1, f"parallelism.{key}: must be", f"got {value}")


def test_plan_parallel_notes_the_yaml_layout_it_does_not_use():
    r = mftk("plan-parallel", TEMPLATE, "--world-size", "2", "--set", "parallelism.tensor_parallel=2")
    assert r.returncode == 0, r.stderr
    assert "the YAML's layout (tensor_parallel 2) is not used" in flat(r.stderr + r.stdout)
    plain = mftk("plan-parallel", TEMPLATE, "--world-size", "2")
    assert "is not used" not in flat(plain.stderr + plain.stdout)


@pytest.mark.parametrize("size", ["80G", "80GB", "80GiB"])
def test_a_size_means_what_the_output_prints(size):
    r = mftk("plan-parallel", TEMPLATE, "--world-size", "2", "--device-memory", size, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["device_memory_bytes"] == 80 * 1024 ** 3  # 80 GiB, as "80 GiB/device" reads
    text = mftk("plan-parallel", TEMPLATE, "--world-size", "2", "--device-memory", size)
    assert "80 GiB/device" in text.stdout


def test_an_unreadable_size_is_a_usage_error():
    r = mftk("plan-parallel", TEMPLATE, "--world-size", "2", "--device-memory", "80 gigs")
    assert_clean_failure(r, 2, "cannot read device memory '80 gigs'", "G, GB and GiB all mean GiB")
