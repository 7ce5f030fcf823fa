"""Settings the engine does not implement are refused before a run, not silently computed otherwise."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mftk.config.load import load_data
from mftk.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, **model):
    data = yaml.safe_load((ROOT / "templates" / name).read_text())
    data["model"].update(model)
    return load_data(data, check_files=False)


@pytest.mark.parametrize("name,key,value", [
    ("deepseek_v4_tiny.yaml", "hidden_act", "gelu"),
    ("deepseek_v3_tiny.yaml", "gated_linear_unit", False),
    ("qwen3_tiny.yaml", "add_bias_linear", True),
    ("qwen3_tiny.yaml", "apply_residual_connection_post_layernorm", True),
    ("qwen3_tiny.yaml", "rotary_interleaved", True),
    ("qwen3_tiny.yaml", "rope_scaling", {"type": "yarn", "factor": 4.0}),
    ("deepseek_v3_tiny.yaml", "moe_router_force_expert_balance", True),
    ("deepseek_v3_tiny.yaml", "activation_func_clamp_value", 7.0),
    ("deepseek_v3_tiny.yaml", "rotary_percent", 0.5),
])
def test_unimplemented_setting_is_an_error_naming_the_key(name, key, value):
    with pytest.raises(ConfigError) as info:
        _load(name, **{key: value})
    paths = {p.path for p in info.value.problems if p.severity == "error"}
    assert f"model.{key}" in paths or (key == "rope_scaling" and "model.rope_scaling" in paths)


def test_bf16_request_is_a_note_and_the_templates_are_clean():
    loaded = _load("qwen3_tiny.yaml", compute_dtype="bfloat16")
    assert any(p.path == "model.compute_dtype" and p.severity == "note" for p in loaded.notes)
    for name in ("qwen3_tiny.yaml", "deepseek_v3_tiny.yaml"):
        assert not [p for p in _load(name).notes if p.path.startswith("model.") and p.severity != "note"]


def test_support_table_does_not_import_mindspore():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, mftk.config.support; print('mindspore' in sys.modules)"],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "False"
