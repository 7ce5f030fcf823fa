"""`mftk.engine.run.train` on the new families and optimizer: DeepSeek-V4 with Muon (checkpoint names,
bit-exact resume, weights-only start from a published-layout directory), Qwen3-MoE with AdamW, Muon on
Qwen3 (every family) and on DeepSeek-V3 with QK-clip."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.tiny import load, tiny_raw

pytestmark = pytest.mark.engine


def run(raw, tmp_path, name, *overrides, **kw):
    from mftk.engine.run import train

    return train(load(raw, *overrides), output_dir=tmp_path / name, **kw)


def _files(step_dir):
    from safetensors.numpy import load_file

    return (load_file(step_dir / "checkpoint-model-0000000-0000001.safetensors"),
            load_file(step_dir / "checkpoint-opt-0000000-0000001.safetensors"))


@pytest.fixture(scope="module")
def v4_run(tmp_path_factory, corpus):
    """Tiny DeepSeek-V4 with Muon: 4 steps, 2 micro-batches each, checkpoints at 2 and 4."""
    d = tmp_path_factory.mktemp("v4")
    raw = tiny_raw("deepseek_v4_tiny.yaml", corpus, d / "ckpt", steps=4)
    from mftk.engine.run import train

    return raw, train(load(raw), output_dir=d / "out"), d


def test_deepseek_v4_trains_with_muon_and_saves_the_reference_names(v4_run):
    raw, result, d = v4_run
    assert result.final_step == 4 and all(np.isfinite(result.losses))
    text = open(result.log_file).read()
    assert "Muon:" in text and "mtp_1_loss:" in text and "load_balancing_loss:" in text and "indexer_loss:" in text
    model, opt = _files(d / "ckpt" / "iteration_00000004")
    assert model["decoder.layers.0.mlp.router.tid2eid"].dtype == np.int32
    assert "decoder.layers.1.self_attention.core_attention.indexer.linear_wq_b.weight" in model
    assert "muon_m.decoder.layers.1.mlp.experts.weight1" in opt and "muon_m.decoder.layers.0.attn_hc.mapping_proj.weight" in opt
    assert "adam_m.embedding.word_embeddings.weight" in opt and "adam_v.decoder.layers.0.attn_hc.alpha_pre" in opt
    assert not any(k.startswith("adam_m.decoder.layers.1.mlp.experts") for k in opt)
    assert opt["global_step"].tolist() == [4]
    before = _files(d / "ckpt" / "iteration_00000002")[0]
    idx = "decoder.layers.1.self_attention.core_attention.indexer.linear_weights_proj.weight"
    assert not np.array_equal(before[idx], model[idx])  # the indexer loss trains the indexer


def test_deepseek_v4_muon_resume_is_bit_exact(v4_run, tmp_path):
    raw, full, d = v4_run
    resumed = run(dict(raw, checkpoint=dict(raw["checkpoint"], save_path=str(tmp_path / "ckpt2"))), tmp_path, "r",
                  resume_from=d / "ckpt" / "iteration_00000002")
    assert resumed.start_step == 2 and resumed.resume.scenario == 1
    assert resumed.losses == full.losses[2:] and resumed.grad_norms == full.grad_norms[2:]
    a, ao = _files(d / "ckpt" / "iteration_00000004")
    b, bo = _files(tmp_path / "ckpt2" / "iteration_00000004")
    assert all(np.array_equal(a[k], b[k]) for k in a) and all(np.array_equal(ao[k], bo[k]) for k in ao)


def test_deepseek_v4_weights_only_from_published_layout(v4_run, tmp_path):
    """An HF-style directory in DeepSeek's published names (what --export-hf writes) starts a run at step 0."""
    import attrs
    from safetensors.numpy import save_file

    from mftk.ckpt.hf.deepseek_v4 import mf_to_hf

    raw, _, d = v4_run
    model, _ = _files(d / "ckpt" / "iteration_00000004")
    cfg = load(raw).config.model
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file(mf_to_hf(model, cfg), str(hf / "model.safetensors"))
    (hf / "config.json").write_text("{}")
    r = run(dict(raw, checkpoint=dict(raw["checkpoint"], save_path=str(tmp_path / "c"))), tmp_path, "w",
            "training.steps=1", resume_from=hf, weights_only=True)
    assert r.start_step == 0 and r.final_step == 1 and r.resume.kind == "hf"
    assert attrs.has(type(cfg))


def test_qwen3_moe_trains(corpus, tmp_path):
    r = run(tiny_raw("qwen3_moe_tiny.yaml", corpus, tmp_path / "c", steps=3, gbs=1), tmp_path, "q")
    assert r.final_step == 3 and all(np.isfinite(r.losses)) and "load_balancing_loss:" in open(r.log_file).read()
    model, opt = _files(tmp_path / "c" / "iteration_00000003")
    assert "decoder.layers.0.mlp.linear_fc1.weight" in model and "decoder.layers.1.mlp.experts.weight1" in model
    assert "adam_m.decoder.layers.1.mlp.experts.weight1" in opt


def test_muon_trains_qwen3(corpus, tmp_path):
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=3, gbs=1)
    raw["optimizer"] = {"type": "Muon", "weight_decay": 0.01, "qk_clip_enabled": False}
    r = run(raw, tmp_path, "m")
    assert r.final_step == 3 and all(np.isfinite(r.losses))
    _, opt = _files(tmp_path / "c" / "iteration_00000003")
    assert "muon_m.decoder.layers.0.self_attention.linear_qkv.weight" in opt


def test_muon_qk_clip_tracks_and_clips_deepseek_v3(corpus, tmp_path, monkeypatch):
    """QK-clip on an MLA model switches max-logit tracking on (and its monitor) and rescales the masters."""
    import mftk.engine.muon as muon

    calls = []
    orig = muon.QKClip.apply
    monkeypatch.setattr(muon.QKClip, "apply", lambda self, view: calls.append(self.max_logits()) or orig(self, view))
    raw = tiny_raw("deepseek_v3_tiny.yaml", corpus, tmp_path / "c", steps=2, gbs=1)
    raw["optimizer"] = {"type": "Muon", "weight_decay": 0.01, "qk_clip_threshold": 1.0e-8}
    r = run(raw, tmp_path, "d")
    assert r.final_step == 2 and len(calls) == 2
    assert sorted(calls[0]) == ["decoder.layers.0.self_attention.", "decoder.layers.1.self_attention.",
                                "mtp.layers.0.transformer_layer.self_attention."]
    assert all(float(v.max()) > 1e-8 for v in calls[0].values())  # τ this small clips every layer
    assert "max_attention_logit/" in open(r.log_file).read()
