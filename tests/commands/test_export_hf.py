"""`mftk inspect-ckpt PATH --export-hf OUT`: a trained checkpoint loads in ``transformers`` and gives mftk's logits.

The independent side is transformers itself: its loader reads our config.json and safetensors
(through AutoModelForCausalLM, so ``model_type``/``architectures`` are checked too), and its
modeling code computes the logits; mftk's side is the model rebuilt from the original checkpoint.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.export import TOL, compare_with_hf as _compare, hf_model as _hf, train_template as _train

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def qwen3_run(tmp_path_factory, corpus):
    return _train(tmp_path_factory, corpus, "qwen3_tiny.yaml")


@pytest.fixture(scope="module")
def dsv3_run(tmp_path_factory, corpus):
    return _train(tmp_path_factory, corpus, "deepseek_v3_tiny.yaml")


@pytest.mark.torch
def test_qwen3_export_loads_in_transformers_with_the_same_logits(qwen3_run):
    d, raw = qwen3_run
    out = d / "hf"
    r = runner.invoke(app, ["inspect-ckpt", str(d / "ckpt"), "--export-hf", str(out)])
    assert r.exit_code == 0, r.output
    assert "exported" in r.stdout and "model.safetensors" in r.stdout and "step 2" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    _compare(out, raw, d / "ckpt" / "iteration_00000002", raw["model"]["vocab_size"])


@pytest.mark.torch
def test_sharded_qwen3_export_loads_too(qwen3_run):
    from mftk.ckpt.export import export_hf

    d, raw = qwen3_run
    result = export_hf(d / "ckpt", d / "hf_sharded", max_shard_bytes=40_000)
    assert len(result.files) > 1 and result.index_file == "model.safetensors.index.json"
    _compare(d / "hf_sharded", raw, d / "ckpt" / "iteration_00000002", raw["model"]["vocab_size"])


@pytest.mark.torch
def test_deepseek_v3_export_loads_in_transformers_with_the_same_logits(dsv3_run):
    d, raw = dsv3_run
    out = d / "hf"
    r = runner.invoke(app, ["inspect-ckpt", str(d / "ckpt" / "iteration_00000002"), "--export-hf", str(out), "--json"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["model_type"] == "deepseek_v3" and result["step"] == 2 and result["files"] == ["model.safetensors"]
    cj = json.loads((out / "config.json").read_text())
    assert cj["architectures"] == ["DeepseekV3ForCausalLM"] and cj["num_nextn_predict_layers"] == 1
    _compare(out, raw, d / "ckpt" / "iteration_00000002", raw["model"]["vocab_size"])


def test_export_errors_exit_cleanly(qwen3_run, tmp_path):
    d, _ = qwen3_run
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    r = runner.invoke(app, ["inspect-ckpt", str(d / "ckpt"), "--export-hf", str(tmp_path / "busy")])
    assert r.exit_code == 2 and "not an empty directory" in r.stderr
    r = runner.invoke(app, ["inspect-ckpt", str(d / "ckpt"), "--export-hf", str(tmp_path / "o"), "--verify"])
    assert r.exit_code == 2 and "cannot be combined" in r.stderr
    r = runner.invoke(app, ["inspect-ckpt", str(d / "ckpt"), "--model-config", str(d / "cfg.yaml")])
    assert r.exit_code == 2 and "only applies to --export-hf" in r.stderr
    r = runner.invoke(app, ["inspect-ckpt", str(tmp_path / "nope"), "--export-hf", str(tmp_path / "o")])
    assert r.exit_code == 2 and "does not exist" in r.stderr
    assert not (tmp_path / "o").exists()


def test_checkpoint_without_model_section_needs_model_config(qwen3_run, tmp_path):
    """A reference-written checkpoint (no mftk extra state): refused with a hint, then exported with --model-config."""
    import shutil

    from tests.helpers.handmade import mf_step_dir

    mf_step_dir(tmp_path / "ref")
    r = runner.invoke(app, ["inspect-ckpt", str(tmp_path / "ref"), "--export-hf", str(tmp_path / "o")])
    assert r.exit_code == 1 and "no mftk extra state" in r.stderr and "--model-config CONFIG.yaml" in r.stderr
    d, _ = qwen3_run
    step = tmp_path / "trained" / "iteration_00000002"
    shutil.copytree(d / "ckpt" / "iteration_00000002", step)
    for f in step.glob("mftk-state-*.json"):
        f.unlink()
    r = runner.invoke(app, ["inspect-ckpt", str(step), "--export-hf", str(tmp_path / "o"),
                            "--model-config", str(d / "cfg.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model_source"] == str(d / "cfg.yaml")
    assert (tmp_path / "o" / "model.safetensors").is_file() and (tmp_path / "o" / "config.json").is_file()


@pytest.mark.torch
def test_qwen3_tied_with_qkv_bias_matches_transformers(tmp_path):
    """Tied embeddings and QKV biases (HF then also expects an o_proj bias: written as zeros)."""
    import mindspore as ms

    from mftk.ckpt.common import CommonInfo
    from mftk.ckpt.export import export_hf
    from mftk.ckpt.save import save_checkpoint
    from mftk.engine import build_model, state_dict

    section = {"model_type": "qwen3", "architectures": "Qwen3ForCausalLM", "vocab_size": 64, "hidden_size": 32,
               "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "rope_theta": 1.0e6, "hidden_dropout": 0.0, "pad_token_id": 0, "seq_length": 16,
               "tie_word_embeddings": True, "attention_bias": True, "initializer_range": 0.05}
    from mftk.config.load import build_model_section

    cfg, problems = build_model_section(section)
    assert cfg is not None, problems
    model = build_model(cfg, seed=5)
    rng = np.random.default_rng(5)
    for p in model.get_parameters():
        if p.name.endswith(".bias"):  # init sets biases to 0: make them count
            p.set_data(ms.Tensor(rng.normal(0, 0.5, p.shape).astype(np.float32)))
    assert any(p.name.endswith("linear_qkv.bias") for p in model.get_parameters())
    save_checkpoint(tmp_path / "ckpt", step=1, model=state_dict(model), extra={"model": section},
                    common=CommonInfo.for_step(step=1, max_steps=1, global_batch_size=1, consumed_samples=1))
    result = export_hf(tmp_path / "ckpt", tmp_path / "hf")
    assert any("o_proj.bias written as zeros" in n for n in result.notes)
    torch = pytest.importorskip("torch")
    ids = rng.integers(1, 64, (2, 12))
    ours = model.logits(ids)[0].asnumpy()
    hf = _hf(tmp_path / "hf")
    assert hf.config.tie_word_embeddings is True
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    assert np.abs(ref).max() > 0.05 and np.abs(ours - ref).max() <= TOL
