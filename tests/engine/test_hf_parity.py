"""Logits and loss equal Hugging Face ``transformers`` with the same weights through our mapping (fp32)."""
from __future__ import annotations

import json

import numpy as np

from tests.helpers.models import torch_masked_ce as _ce
import pytest

from mftk.engine import build_model, state_dict
from mftk.ckpt.hf import deepseek_v3 as dsv3_sd
from mftk.ckpt.hf import qwen3 as qwen3_sd


pytestmark = [pytest.mark.engine, pytest.mark.torch]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
TOL = 1e-4


def _hf_from_dir(cls, hf_cfg, tensors: dict, tmp_path):
    """Write an HF-style checkpoint dir and load it with HF's own loader (exercises its name conversions)."""
    from safetensors.numpy import save_file

    hf_cfg.save_pretrained(tmp_path)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    model, info = cls.from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32,
                                      output_loading_info=True)
    # nothing may be silently random-initialised or dropped (the MTP layer L is HF's documented ignore)
    assert not info["missing_keys"], info["missing_keys"]
    assert not [k for k in info["unexpected_keys"] if not k.startswith(f"model.layers.{hf_cfg.num_hidden_layers}.")]
    return model.eval()


@pytest.mark.parametrize("tied", [False, True])
def test_qwen3_logits_and_loss_match_hf(tmp_path, rng, tied, tiny_qwen3):
    cfg = tiny_qwen3(tie_word_embeddings=tied)
    model = build_model(cfg, seed=1)
    hf_cfg = transformers.Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=tied, max_position_embeddings=64)
    hf = _hf_from_dir(transformers.Qwen3ForCausalLM, hf_cfg, qwen3_sd.mf_to_hf(state_dict(model), cfg), tmp_path)

    ids = rng.integers(1, cfg.vocab_size, (2, 12))
    labels = np.roll(ids, -1, 1)
    mask = np.ones_like(ids, np.float32)
    mask[1, :3] = 0
    ours = model.logits(ids)[0].asnumpy()
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    assert np.abs(ref).max() > 0.05  # real signal, not zeros
    assert np.abs(ours - ref).max() <= TOL
    out = model.forward({"input_ids": ids, "labels": labels, "loss_mask": mask})
    assert out.loss == pytest.approx(_ce(ref, labels, mask), abs=TOL)


def test_qwen3_mapping_round_trips(tiny_qwen3):
    cfg = tiny_qwen3()
    mf = state_dict(build_model(cfg, seed=2))
    back = qwen3_sd.hf_to_mf(qwen3_sd.mf_to_hf(mf, cfg), cfg)
    assert set(back) == set(mf)
    assert all(np.array_equal(back[k], mf[k]) for k in mf)


def _dsv3_hf_config(cfg):
    rope = {"rope_type": "yarn", "rope_theta": cfg.rope_theta, **{k: v for k, v in cfg.rope_scaling.items() if k != "type"}}
    return transformers.DeepseekV3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        moe_intermediate_size=cfg.moe_intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_attention_heads,
        n_shared_experts=cfg.n_shared_experts, n_routed_experts=cfg.n_routed_experts,
        routed_scaling_factor=cfg.routed_scaling_factor, kv_lora_rank=cfg.kv_lora_rank, q_lora_rank=cfg.q_lora_rank,
        qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim, qk_nope_head_dim=cfg.qk_nope_head_dim,
        n_group=cfg.n_group, topk_group=cfg.topk_group, num_experts_per_tok=cfg.num_experts_per_tok,
        first_k_dense_replace=cfg.first_k_dense_replace, norm_topk_prob=True, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=1024, rope_parameters=rope, rope_interleave=True, tie_word_embeddings=False)


def _hf_mtp_logits(hf, hf_cfg, tensors: dict, ids: np.ndarray, hidden) -> np.ndarray:
    """Reference MTP depth 1 assembled from HF DeepSeek-V3 modules (HF has no MTP forward)."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as M

    L, h = hf_cfg.num_hidden_layers, hf_cfg.hidden_size
    layer = M.DeepseekV3DecoderLayer(hf_cfg, layer_idx=L).eval()
    enorm, hnorm, fnorm = (M.DeepseekV3RMSNorm(h, hf_cfg.rms_norm_eps) for _ in range(3))
    eh = torch.nn.Linear(2 * h, h, bias=False)
    p = f"model.layers.{L}."
    sub = {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)}
    packed = {  # HF packs per-expert weights at load time; do the same here
        "mlp.experts.gate_up_proj": np.stack([np.concatenate([sub[f"mlp.experts.{e}.gate_proj.weight"],
                                                              sub[f"mlp.experts.{e}.up_proj.weight"]], 0)
                                              for e in range(hf_cfg.n_routed_experts)]),
        "mlp.experts.down_proj": np.stack([sub[f"mlp.experts.{e}.down_proj.weight"]
                                           for e in range(hf_cfg.n_routed_experts)])}
    layer_sd = {k: torch.tensor(v) for k, v in {**sub, **packed}.items() if k in layer.state_dict()}
    layer.load_state_dict(layer_sd, strict=True)
    enorm.weight.data, hnorm.weight.data = torch.tensor(sub["enorm.weight"]), torch.tensor(sub["hnorm.weight"])
    fnorm.weight.data, eh.weight.data = torch.tensor(sub["shared_head.norm.weight"]), torch.tensor(sub["eh_proj.weight"])
    nxt = np.roll(ids, -1, 1)
    nxt[:, -1] = 0
    s = ids.shape[1]
    with torch.no_grad():
        e = hf.model.embed_tokens(torch.tensor(nxt))
        x = eh(torch.cat([enorm(e), hnorm(hidden)], -1))
        pos = torch.arange(s)[None]
        mask = torch.triu(torch.full((s, s), torch.finfo(torch.float32).min), 1)[None, None]
        x = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=hf.model.rotary_emb(x, pos))
        return hf.lm_head(fnorm(x)).numpy()


def test_deepseek_v3_logits_loss_and_mtp_match_hf(tmp_path, rng, tiny_dsv3):
    cfg = tiny_dsv3()
    model = build_model(cfg, seed=3)
    for moe in model.moe_layers():  # a non-zero expert bias must shift selection identically
        moe.expert_bias.set_data(ms_tensor(rng.normal(0, 0.05, (cfg.n_routed_experts,))))
    hf_cfg = _dsv3_hf_config(cfg)
    tensors = dsv3_sd.mf_to_hf(state_dict(model), cfg)
    hf = _hf_from_dir(transformers.DeepseekV3ForCausalLM, hf_cfg, tensors, tmp_path)

    ids = rng.integers(1, cfg.vocab_size, (2, 10))
    labels = np.roll(ids, -1, 1)
    mask = np.ones_like(ids, np.float32)
    ours, ours_mtp = model.logits(ids)
    with torch.no_grad():
        hidden = hf.model(torch.tensor(ids)).last_hidden_state
        ref = hf.lm_head(hidden).numpy()
    assert np.abs(ours.asnumpy() - ref).max() <= TOL
    ref_mtp = _hf_mtp_logits(hf, hf_cfg, tensors, ids, hidden)
    assert np.abs(ours_mtp[0].asnumpy() - ref_mtp).max() <= TOL

    out = model.forward({"input_ids": ids, "labels": labels, "loss_mask": mask})
    assert out.loss == pytest.approx(_ce(ref, labels, mask), abs=TOL)
    mtp_labels, mtp_mask = np.roll(labels, -1, 1), mask.copy()
    mtp_mask[:, -1] = 0
    assert out.mtp_losses[0] == pytest.approx(0.3 * _ce(ref_mtp, mtp_labels, mtp_mask), abs=TOL)


def test_deepseek_v3_mapping_round_trips_and_hf_config_json(tiny_dsv3):
    cfg = tiny_dsv3()
    mf = state_dict(build_model(cfg, seed=4))
    hf = dsv3_sd.mf_to_hf(mf, cfg)
    assert "model.layers.2.mlp.experts.7.down_proj.weight" in hf  # MTP is HF layer L = 2
    assert hf["model.layers.1.mlp.experts.0.gate_proj.weight"].shape == (cfg.moe_intermediate_size, cfg.hidden_size)
    back = dsv3_sd.hf_to_mf(hf, cfg)
    assert set(back) == set(mf)
    assert all(np.array_equal(back[k], mf[k]) for k in mf if not k.endswith("tokens_per_expert"))
    json.dumps(sorted(hf))  # names are plain strings


def ms_tensor(a):
    import mindspore as ms

    return ms.Tensor(np.asarray(a, np.float32))
