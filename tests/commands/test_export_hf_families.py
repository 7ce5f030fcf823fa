"""`mftk inspect-ckpt --export-hf` for DeepSeek-V4 and Qwen3-MoE: the export loads in ``transformers``
(AutoModelForCausalLM reads our config.json) and gives the logits of mftk's model from the checkpoint."""
from __future__ import annotations

import json

import pytest

from tests.helpers.cli import runner
from tests.helpers.export import compare_with_hf as _compare, train_template as _train
from commands.app import app

pytestmark = [pytest.mark.engine, pytest.mark.torch]


@pytest.mark.parametrize("template,arch", [("deepseek_v4_tiny.yaml", "DeepseekV4ForCausalLM"),
                                           ("qwen3_moe_tiny.yaml", "Qwen3MoeForCausalLM")])
def test_export_loads_in_transformers_with_the_same_logits(tmp_path_factory, corpus, template, arch):
    d, raw = _train(tmp_path_factory, corpus, template)
    out = d / "hf"
    r = runner.invoke(app, ["inspect-ckpt", str(d / "ckpt"), "--export-hf", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model_type"] == raw["model"]["model_type"]
    cj = json.loads((out / "config.json").read_text())
    assert cj["architectures"] == [arch]
    _compare(out, raw, d / "ckpt" / "iteration_00000002", raw["model"]["vocab_size"])
