"""`mftk convert-config` on every static-graph config the mindformers 2.1.0 wheel ships (Qwen3, Qwen3-MoE,
DeepSeek-V3), the older static forms (`hidden_act: 'swiglu'`, no `model_type`), and one error per YAML path.

The wheel is a test oracle installed with ``pip install --no-deps mindformers==2.1.0`` (its own requirements
pin mindspore 2.11, so it cannot be a test extra next to mindspore 2.10): the wheel tests skip without it.
The static YAMLs without the wheel are written here from the 2.1 static schema (mindformers-2.1.md §7).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from commands.app import app
from mftk.config.convert import check_conversion, convert_file, convert_static
from mftk.config.load import load_data
from mftk.errors import ConfigError
from tests.config.static_yamls import STATIC
from tests.helpers.cli import runner
from tests.helpers.mf21 import wheel_train_configs

ROOT = Path(__file__).resolve().parents[2]


WHEEL = wheel_train_configs()
needs_wheel = pytest.mark.skipif(not WHEEL, reason="mindformers 2.1.0 not installed (pip install --no-deps "
                                                   "mindformers==2.1.0)")


def errors_of(data: dict, world_size: int = 1) -> list:
    """Every error validate-config gives ``data`` (files not checked)."""
    try:
        notes = load_data(copy.deepcopy(data), source="t.yaml", world_size=world_size, check_files=False).notes
    except ConfigError as exc:
        notes = exc.problems
    return [p for p in notes if p.severity == "error"]


@needs_wheel
def test_the_wheel_ships_the_three_families():
    names = {p.name for p in WHEEL}
    assert {"pretrain_qwen3_32b_4k.yaml", "pretrain_qwen3_30b_a3b_4k.yaml", "pretrain_deepseek3_671b.yaml"} <= names


@needs_wheel
@pytest.mark.parametrize("path", WHEEL, ids=lambda p: p.stem)
def test_every_shipped_static_config_converts(path, tmp_path):
    out = tmp_path / "out.yaml"
    r = runner.invoke(app, ["convert-config", str(path), "-o", str(out)], env={"COLUMNS": "400"})
    conv = convert_file(path)
    errors = [p for p in check_conversion(conv) if p.severity == "error"]
    model = conv.config["model"]
    assert model["model_type"] in ("qwen3", "qwen3_moe", "deepseek_v3")
    assert model.get("hidden_act", "silu") in ("silu", "fusedswiglu")
    if path.name.startswith("pretrain_"):
        assert errors == [], [p.render() for p in errors]
        assert r.exit_code == 0 and f"validates at --world-size {conv.world_size}" in r.stdout, r.output
    else:  # finetune: the Hugging Face datasets loader is the one thing left, named with the reason
        assert [p.path for p in errors] == ["train_dataset.dataloader.type"], [p.render() for p in errors]
        assert "HFDataLoader is not supported" in errors[0].message and "datasets" in errors[0].message
        assert r.exit_code == 1 and "does not validate yet" in r.stderr, r.output
        assert r.stderr.count("train_dataset.dataloader.type") == 1
    assert yaml.safe_load(out.read_text()) == conv.config


@needs_wheel
def test_the_shipped_qwen3_32b_swiglu_becomes_silu():
    path = next(p for p in WHEEL if p.name == "pretrain_qwen3_32b_4k.yaml")
    assert yaml.safe_load(path.read_text())["model"]["model_config"]["hidden_act"] == "swiglu"
    conv = convert_file(path)
    assert conv.config["model"]["hidden_act"] == "silu"
    assert any(src == "model.model_config.hidden_act" and "'silu'" in to for src, to in conv.mapped)


@needs_wheel
def test_finetune_model_type_comes_from_trainer_model_name():
    for path in WHEEL:
        raw = yaml.safe_load(path.read_text())
        if "model_type" not in raw["model"]["model_config"]:
            want = {"qwen3": "qwen3", "deepseekv3": "deepseek_v3"}[raw["trainer"]["model_name"].lower()]
            assert convert_file(path).config["model"]["model_type"] == want, path.name


def _static(name: str = "qwen3_32b") -> dict:
    return yaml.safe_load(STATIC[name])


def test_static_swiglu_is_silu_and_with_bias_fusion_fusedswiglu():
    raw = _static()
    raw["model"]["model_config"]["hidden_act"] = "swiglu"
    conv = convert_static(raw)
    assert conv.config["model"]["hidden_act"] == "silu"
    assert errors_of(conv.config, conv.world_size) == []
    raw["model"]["model_config"]["bias_swiglu_fusion"] = True
    assert convert_static(raw).config["model"]["hidden_act"] == "fusedswiglu"


@pytest.mark.parametrize("where, value, want", [
    ("model_config.type", "DeepseekV3Config", "deepseek_v3"),
    ("model_config.type", "Qwen3MoeConfig", "qwen3_moe"),
    ("trainer.model_name", "deepseekV3", "deepseek_v3"),
    ("trainer.model_name", "Qwen3", "qwen3"),
    ("trainer.model_name", "qwen3_moe", "qwen3_moe"),
    ("pretrained_model_dir", "/path/to/DeepSeek-V3/", "deepseek_v3"),
    ("pretrained_model_dir", "/data/Qwen3-32B", "qwen3"),
])
def test_model_type_is_inferred_from_older_static_keys(where, value, want):
    name = {"deepseek_v3": "deepseek3_671b", "qwen3": "qwen3_32b", "qwen3_moe": "qwen3_moe_30b_a3b"}[want]
    raw = _static(name)
    del raw["model"]["model_config"]["model_type"]
    raw.pop("trainer", None)
    if where == "model_config.type":
        raw["model"]["model_config"]["type"] = value
    elif where == "trainer.model_name":
        raw["trainer"] = {"type": "CausalLanguageModelingTrainer", "model_name": value}
    else:
        raw["pretrained_model_dir"] = value
    conv = convert_static(raw)
    assert conv.config["model"]["model_type"] == want
    assert "type" not in conv.config["model"]  # the graph-era class is not a PyNative model key
    assert errors_of(conv.config, conv.world_size) == []


def test_a_qwen3_name_with_experts_is_qwen3_moe():
    raw = _static("qwen3_moe_30b_a3b")
    del raw["model"]["model_config"]["model_type"]
    raw["trainer"]["model_name"] = "qwen3"
    assert convert_static(raw).config["model"]["model_type"] == "qwen3_moe"


def test_no_model_type_anywhere_exits_1_naming_it_once(tmp_path):
    raw = _static()
    del raw["model"]["model_config"]["model_type"]
    raw.pop("trainer", None)
    src = tmp_path / "static.yaml"
    src.write_text(yaml.safe_dump(raw))
    r = runner.invoke(app, ["convert-config", str(src), "-o", str(tmp_path / "o.yaml")], env={"COLUMNS": "400"})
    assert r.exit_code == 1 and (tmp_path / "o.yaml").exists(), r.output
    assert r.stderr.count("model.model_type") == 1 and "does not validate yet" in r.stderr
    j = runner.invoke(app, ["convert-config", str(src), "-o", str(tmp_path / "o.yaml"), "--force", "--json"])
    data = json.loads(j.stdout)
    assert j.exit_code == 1 and data["valid"] is False
    assert [p["path"] for p in data["problems"] if p["severity"] == "error"] == ["model.model_type"]


# ---------------------------------------------------------------------------- one error per YAML path
# (every shipped, converted and hostile YAML: tests/config/test_one_problem_per_path.py)

def test_normalization_and_fused_norm_are_refused_once_by_their_owner():
    for key, value in (("normalization", "LayerNorm"), ("fused_norm", False)):
        data = yaml.safe_load((ROOT / "templates" / "qwen3_tiny.yaml").read_text())
        data["model"][key] = value
        errors = errors_of(data)
        assert [p.path for p in errors] == [f"model.{key}"]
