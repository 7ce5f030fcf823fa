"""DeepSeek-V4's legacy ``experimental_attention_variant: mla`` (issue 36), with the meaning MindSpore Transformers
2.1.0 gives it: its PyNative layer builder reads ``mla`` as no variant, so every decoder layer and the MTP layer
(built from the last decoder layer's spec) get the plain ``MLASelfAttention`` — DeepSeek-V3's — inside V4's
hyper-connection layers with V4's MoE, and the GPTModel builds the one MLA RoPE table (YaRN from ``rotary_base``,
``rotary_scaling_factor``, ``max_position_embeddings``, the betas and mscales)
(mindformers/pynative/base_models/gpt/gpt_layer_specs.py ``get_gpt_layer_local_spec``, ``get_gpt_mtp_block_spec``;
pynative/base_models/gpt/gpt_model.py). The reference checked against is mftk's DeepSeek-V3 MLA layer (held to
Hugging Face's ``DeepseekV3ForCausalLM`` by tests/engine/test_hf_parity.py) built from a DeepSeek-V3 config with the
same fields, and a softmax scale worked by hand."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from mindspore import Tensor

from mftk.config.model import DeepseekV3ModelConfig
from mftk.engine.layers.attention import causal_mask
from mftk.engine.layers.csa import DeepseekV4Attention
from mftk.engine.layers.mla import MLASelfAttention
from mftk.engine.spec import build_spec
from tests.helpers.config import load_dict
from tests.helpers.tiny import ROOT

pytestmark = pytest.mark.engine
MLA = {"experimental_attention_variant": "mla", "kv_lora_rank": 16, "v_head_dim": 16,  # value head < 24 + 8
       "max_position_embeddings": 64, "rotary_scaling_factor": 4.0, "mscale": 0.7, "mscale_all_dim": 0.5}
SHARED = ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
          "v_head_dim", "rms_norm_eps", "rope_theta", "position_embedding_type", "rotary_scaling_factor",
          "max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "qk_layernorm")


def _v4_mla_raw() -> dict:
    raw = yaml.safe_load((ROOT / "templates" / "deepseek_v4_tiny.yaml").read_text())
    raw["model"].update(MLA)
    return raw


def _v4_mla_config():
    return load_dict(_v4_mla_raw()).config.model


def test_every_layer_has_deepseek_v3_mla_attention_with_its_scale():
    cfg = _v4_mla_config()
    spec = build_spec(cfg)
    for layer in spec.layers + spec.mtp_layers:
        assert layer.attention.module is MLASelfAttention
    nope, rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    g = 0.1 * 0.7 * math.log(4.0) + 1.0  # YaRN's g(factor 4, mscale 0.7), by hand
    assert spec.layers[0].attention.params["softmax_scale"] == pytest.approx(g * g / math.sqrt(nope + rope), rel=1e-12)


def test_v4_mla_layer_equals_the_deepseek_v3_mla_layer(rng):
    """The same weights give the same attention output as DeepSeek-V3's layer from a V3 config with the same
    fields (widths, RoPE/YaRN, softmax scale), the value head narrower than the query head included."""
    v4 = _v4_mla_config()
    v3 = DeepseekV3ModelConfig(**{k: getattr(v4, k) for k in SHARED})
    s4, s3 = build_spec(v4), build_spec(v3)
    a4, a3 = s4.layers[0].attention.build(), s3.layers[0].attention.build()
    p4, p3 = dict(a4.parameters_and_names()), dict(a3.parameters_and_names())
    assert {k: v.shape for k, v in p4.items()} == {k: v.shape for k, v in p3.items()}
    for name, p in p3.items():
        w = Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32))
        p.set_data(w)
        p4[name].set_data(w)
    S = 12
    x = Tensor(rng.normal(0, 1, (2, S, v4.hidden_size)).astype(np.float32))
    out4 = a4(x, s4.rope()(S), causal_mask(S)).asnumpy()
    out3 = a3(x, s3.rope()(S), causal_mask(S)).asnumpy()
    np.testing.assert_array_equal(out4, out3)
    assert out4.shape == (2, S, v4.hidden_size)


def test_v4_mla_model_builds_no_hybrid_attention():
    from mftk.engine.models.gpt import GPTModel

    model = GPTModel(build_spec(_v4_mla_config()))
    cells = [c for _, c in model.cells_and_names()]
    assert not any(isinstance(c, DeepseekV4Attention) for c in cells)
    assert sum(isinstance(c, MLASelfAttention) for c in cells) == 3 + 1  # 3 decoder layers and the MTP layer
    names = [p.name for p in model.get_parameters()]
    assert any(n.endswith("self_attention.linear_kvb.weight") for n in names)
    assert any("hc" in n or "hyper" in n or "attn_hc" in n for n in names)  # still V4's hyper-connection layers


@pytest.mark.slow
def test_tiny_v4_with_mla_trains(tmp_path: Path):
    """Two steps with Muon (the template's optimizer): finite losses, the MTP and load-balancing terms of V4's
    layers, and no indexer loss (no compressed layers)."""
    from tests.helpers.msrun import metrics, single
    from tests.helpers.tiny import tiny_raw, write_corpus

    corpus = write_corpus(tmp_path / "corpus" / "tiny_text_document")
    raw = tiny_raw("deepseek_v4_tiny.yaml", corpus, tmp_path / "ckpt", steps=2, gbs=2)
    raw["model"].update(MLA)
    raw["checkpoint"]["enable_save"] = False
    res = single(raw, tmp_path / "out")
    m = metrics(tmp_path / "out")
    assert [r["step"] for r in m] == [1, 2] and np.isfinite(res.losses).all()
    assert all(np.isfinite(r["mtp_1_loss"]) and np.isfinite(r["load_balancing_loss"]) for r in m)
    assert all(r.get("indexer_loss") is None for r in m)
    assert "Muon:" in (tmp_path / "out" / "log" / "rank_0" / "info.log").read_text()


def test_v4_mla_has_no_published_checkpoint_layout():
    """DeepSeek's published V4 layout holds the hybrid attention only: converting an ``mla`` model says so."""
    from mftk.ckpt.hf.deepseek_v4 import hf_to_mf, mf_to_hf
    from mftk.errors import CheckpointError

    cfg = _v4_mla_config()
    for convert in (hf_to_mf, mf_to_hf):
        with pytest.raises(CheckpointError, match="no published checkpoint layout"):
            convert({}, cfg)


def test_v4_mla_takes_muons_qk_clip():
    """The reference clips every MLA attention that tracks its max logits (gpt_model.py ``apply_qk_clip_scaling``),
    so QK-clip is active for the ``mla`` variant (and still not for dsv4_hybrid): the attention tracks its logits
    and the optimizer rescales its ``linear_qb``/``linear_kvb`` head rows (`muon.QKClip`, tested on DeepSeek-V3)."""
    from mftk.config.optimizer_muon import muon_problems, qk_clip_active
    from mftk.engine.builders import build_model, build_optimizer

    raw = _v4_mla_raw()
    raw["optimizer"]["qk_clip_enabled"] = True
    config = load_dict(raw).config
    assert qk_clip_active(config)
    assert not [p for p in muon_problems(config) if p.path == "optimizer.qk_clip_enabled"]
    model = build_model(config)
    opt = build_optimizer(config, model)
    assert opt.qk_clip is not None and opt.qk_clip.max_logits()  # every layer's running max, by attention prefix
    hybrid = yaml.safe_load((ROOT / "templates" / "deepseek_v4_tiny.yaml").read_text())
    hybrid["optimizer"]["qk_clip_enabled"] = True
    assert not qk_clip_active(load_dict(hybrid).config)
