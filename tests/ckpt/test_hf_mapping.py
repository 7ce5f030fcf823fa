"""HF ↔ reference name/layout mappings: hand-checked layouts, numpy-only import, error reporting."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mftk.ckpt.hf.convert import interleave_rows
from mftk.ckpt.hf import deepseek_v3 as dsv3_sd
from mftk.ckpt.hf import qwen3 as qwen3_sd
from mftk.errors import CheckpointError

pytestmark = pytest.mark.engine


def test_mappings_import_without_mindspore():
    code = ("import sys; import mftk.ckpt.hf.qwen3, mftk.ckpt.hf.deepseek_v3; "
            "assert 'mindspore' not in sys.modules, 'mindspore loaded'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_qwen3_qkv_is_group_interleaved_by_hand():
    # nh=4, ng=2, hd=1, H=1: rows q0 q1 q2 q3 | k0 k1 | v0 v1 → q0 q1 k0 v0 q2 q3 k1 v1
    q, k, v = np.array([[0.], [1.], [2.], [3.]]), np.array([[10.], [11.]]), np.array([[20.], [21.]])
    mf = qwen3_sd.qkv_to_mf(q, k, v, ng=2)
    assert mf[:, 0].tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    back = qwen3_sd.qkv_to_hf(mf, nh=4, ng=2, hd=1)
    assert all(np.array_equal(a, b) for a, b in zip(back, (q, k, v)))


def test_fc1_rows_interleave_gate_and_up():
    g, u = np.array([[1.], [2.]]), np.array([[10.], [20.]])
    assert interleave_rows(g, u)[:, 0].tolist() == [1, 10, 2, 20]


class _Cfg:
    """Just the fields the DeepSeek-V3 mapping reads (no config import needed)."""

    hidden_size, num_hidden_layers, n_routed_experts, moe_intermediate_size = 2, 1, 2, 3
    q_lora_rank, qk_layernorm, num_attention_heads, qk_nope_head_dim, qk_rope_head_dim = 4, True, 1, 1, 1
    moe_router_enable_expert_bias, num_nextn_predict_layers = True, 0

    def moe_layer_pattern(self):
        return [True]

    def moe_shared_expert_intermediate_size_resolved(self):
        return 3


def _hf_dsv3(rng):
    h, fm, e = 2, 3, 2
    p = "model.layers.0."
    t = {"model.embed_tokens.weight": rng.random((5, h)), "model.norm.weight": rng.random(h),
         "lm_head.weight": rng.random((5, h))}
    for n, shp in [("input_layernorm.weight", (h,)), ("post_attention_layernorm.weight", (h,)),
                   ("self_attn.q_a_proj.weight", (4, h)), ("self_attn.q_a_layernorm.weight", (4,)),
                   ("self_attn.q_b_proj.weight", (2, 4)), ("self_attn.kv_a_proj_with_mqa.weight", (3, h)),
                   ("self_attn.kv_a_layernorm.weight", (2,)), ("self_attn.kv_b_proj.weight", (2, 2)),
                   ("self_attn.o_proj.weight", (h, 1)), ("mlp.gate.weight", (e, h)),
                   ("mlp.gate.e_score_correction_bias", (e,)), ("mlp.shared_experts.gate_proj.weight", (fm, h)),
                   ("mlp.shared_experts.up_proj.weight", (fm, h)), ("mlp.shared_experts.down_proj.weight", (h, fm))]:
        t[p + n] = rng.random(shp)
    for x in range(e):
        t[p + f"mlp.experts.{x}.gate_proj.weight"] = rng.random((fm, h))
        t[p + f"mlp.experts.{x}.up_proj.weight"] = rng.random((fm, h))
        t[p + f"mlp.experts.{x}.down_proj.weight"] = rng.random((h, fm))
    return t


def test_dsv3_expert_and_qkv_layouts_by_hand():
    rng = np.random.default_rng(0)
    hf = _hf_dsv3(rng)
    mf = dsv3_sd.hf_to_mf(hf, _Cfg())
    p, m = "model.layers.0.", "decoder.layers.0."
    w1 = mf[m + "mlp.experts.weight1"]
    assert w1.shape == (2, 2, 6)  # [E, H, 2Fm] = [gateᵀ | upᵀ]
    assert np.array_equal(w1[1, :, :3], hf[p + "mlp.experts.1.gate_proj.weight"].T)
    assert np.array_equal(w1[1, :, 3:], hf[p + "mlp.experts.1.up_proj.weight"].T)
    assert np.array_equal(mf[m + "mlp.experts.weight2"][0], hf[p + "mlp.experts.0.down_proj.weight"].T)
    qkv = mf[m + "self_attention.linear_qkv.weight"]
    assert np.array_equal(qkv, np.concatenate([hf[p + "self_attn.q_a_proj.weight"],
                                               hf[p + "self_attn.kv_a_proj_with_mqa.weight"]]))
    assert np.array_equal(mf[m + "mlp.expert_bias"], hf[p + "mlp.gate.e_score_correction_bias"])
    assert not mf[m + "mlp.tokens_per_expert"].any()
    back = dsv3_sd.mf_to_hf(mf, _Cfg())
    assert set(back) == set(hf) and all(np.array_equal(back[k], hf[k]) for k in hf)


def test_missing_and_unexpected_tensors_are_reported_together():
    rng = np.random.default_rng(0)
    hf = _hf_dsv3(rng)
    del hf["model.layers.0.mlp.experts.1.up_proj.weight"]
    hf["model.layers.0.mlp.typo.weight"] = np.zeros(1)
    with pytest.raises(CheckpointError) as err:
        dsv3_sd.hf_to_mf(hf, _Cfg())
    text = "\n".join(err.value.problems)
    assert "missing HF tensor: model.layers.0.mlp.experts.1.up_proj.weight" in text
    assert "unexpected HF tensor (would be silently dropped): model.layers.0.mlp.typo.weight" in text
