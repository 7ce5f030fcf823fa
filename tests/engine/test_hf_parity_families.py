"""DeepSeek-V4 and Qwen3-MoE logits and loss equal Hugging Face ``transformers`` with the same weights (fp32).

The HF side loads our export through its own ``from_pretrained`` (so its rename/pack tables are
exercised) and nothing may be missing or unexpected. Every tensor is randomised (sinks, biases,
alphas, hc_base/hc_scale, norms, expert bias, tid2eid) so no part of the model hides behind a
zero or a one.
"""
from __future__ import annotations

import numpy as np
import pytest

from mftk.engine import build_model, load_state_dict, state_dict
from mftk.ckpt.hf import deepseek_v4 as v4_sd
from mftk.ckpt.hf import qwen3_moe as q3moe_sd

from tests.helpers.models import torch_masked_ce as _ce

pytestmark = [pytest.mark.engine, pytest.mark.torch]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
TOL = 1e-4
_FROZEN = ("rms_weight", "q_rms_gamma", "tokens_per_expert")


def _randomise(model, cfg, rng) -> dict:
    sd = state_dict(model)
    for k, v in sd.items():
        if k.endswith(_FROZEN):
            continue
        if k.endswith("tid2eid"):
            e, kk = cfg.n_routed_experts, cfg.num_experts_per_tok
            sd[k] = np.stack([rng.permutation(e)[:kk] for _ in range(v.shape[0])]).astype(np.int32)
        elif k.endswith(("norm.weight", "layernorm.weight")):
            sd[k] = (1 + rng.normal(0, 0.1, v.shape)).astype(np.float32)
        elif v.ndim <= 1:
            sd[k] = rng.normal(0, 0.3, v.shape).astype(np.float32)
    load_state_dict(model, sd)
    return sd


def _from_dir(cls, hf_cfg, tensors: dict, path):
    from safetensors.numpy import save_file

    hf_cfg.save_pretrained(path)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path / "model.safetensors"))
    model, info = cls.from_pretrained(path, attn_implementation="eager", dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


# ------------------------------------------------------------------------------------------------ DeepSeek-V4
_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention"}


def dsv4_hf_config(cfg, num_layers: int | None = None):
    """transformers' config for our tiny V4, written from the config fields (not from mftk's exporter)."""
    L = cfg.num_hidden_layers if num_layers is None else num_layers
    ratios = list(cfg.compress_ratios[:L])
    hca = next((r for r in ratios if r not in _TYPES), 128)
    return transformers.DeepseekV4Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, moe_intermediate_size=cfg.moe_intermediate_size,
        num_hidden_layers=L, num_attention_heads=cfg.num_attention_heads, head_dim=cfg.v_head_dim,
        q_lora_rank=cfg.q_lora_rank, partial_rotary_factor=cfg.qk_rope_head_dim / cfg.v_head_dim,
        num_experts_per_tok=cfg.num_experts_per_tok, n_routed_experts=cfg.n_routed_experts, n_shared_experts=1,
        scoring_func=cfg.moe_router_score_function, routed_scaling_factor=cfg.routed_scaling_factor, norm_topk_prob=True,
        layer_types=[_TYPES.get(r, "heavily_compressed_attention") for r in ratios],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": hca},
        hc_mult=cfg.num_residual_streams, hc_sinkhorn_iters=cfg.mhc_sinkhorn_iterations, hc_eps=cfg.hc_eps,
        mlp_layer_types=["hash_moe" if i < cfg.num_hash_layers else "moe" for i in range(L)],
        swiglu_limit=cfg.activation_func_clamp_value, sliding_window=cfg.csa_window_size, o_groups=cfg.o_groups,
        o_lora_rank=cfg.o_lora_rank, index_n_heads=cfg.index_n_heads, index_head_dim=cfg.index_head_dim,
        index_topk=cfg.index_topk, rope_theta=cfg.rope_theta, compress_rope_theta=cfg.compress_rope_theta,
        rope_parameters={"rope_type": "yarn", "factor": cfg.rotary_scaling_factor, "beta_fast": cfg.beta_fast,
                         "beta_slow": cfg.beta_slow,
                         "original_max_position_embeddings": cfg.original_max_position_embeddings},
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=False)


def _hf_mtp_logits(hf, cfg, tensors: dict, ids: np.ndarray, hidden, tmp_path) -> np.ndarray:
    """MTP depth 1 assembled from transformers' DeepSeek-V4 modules (transformers builds no MTP): its layer
    is layer L of an (L+1)-layer model loaded from the exported ``mtp.0.*`` tensors."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M

    L = cfg.num_hidden_layers
    cfg1 = dsv4_hf_config(cfg, num_layers=L + 1)  # layer L: the MTP entry of compress_ratios, learned routing
    ext = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    ext.update({f"layers.{L}." + k[len("mtp.0."):]: v for k, v in tensors.items()
                if k.startswith("mtp.0.") and not k.startswith(("mtp.0.hc_head", "mtp.0.enorm", "mtp.0.hnorm",
                                                                "mtp.0.norm", "mtp.0.e_proj", "mtp.0.h_proj"))})
    (tmp_path / "mtp").mkdir()
    layer = _from_dir(transformers.DeepseekV4ForCausalLM, cfg1, ext, tmp_path / "mtp").model.layers[L]
    t = {k: torch.tensor(v) for k, v in tensors.items() if k.startswith("mtp.0.")}
    head = M.DeepseekV4HyperHead(cfg1)
    head.hc_fn.data, head.hc_base.data, head.hc_scale.data = t["mtp.0.hc_head_fn"], t["mtp.0.hc_head_base"], \
        t["mtp.0.hc_head_scale"]
    norms = [M.DeepseekV4RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) for _ in range(3)]
    for n, name in zip(norms, ("enorm", "hnorm", "norm")):
        n.weight.data = t[f"mtp.0.{name}.weight"]
    nxt = np.roll(ids, -1, 1)
    nxt[:, -1] = 0
    s, w = ids.shape[1], cfg.csa_window_size
    q, k = np.arange(s)[:, None], np.arange(s)[None, :]
    mask = torch.tensor(np.where((k > q) | (k <= q - w), -np.inf, 0.0), dtype=torch.float32)[None, None]
    with torch.no_grad():
        x = torch.cat([norms[0](hf.model.embed_tokens(torch.tensor(nxt))), norms[1](hidden)], -1)
        x = x @ torch.cat([t["mtp.0.e_proj.weight"], t["mtp.0.h_proj.weight"]], 1).T
        streams = x.unsqueeze(2).expand(-1, -1, cfg.num_residual_streams, -1).contiguous()
        pos = torch.arange(s)[None]
        pe = {kind: hf.model.rotary_emb(x, position_ids=pos, layer_type=kind) for kind in ("main", "compress")}
        streams = layer(streams, position_embeddings=pe, position_ids=pos, attention_mask=mask)
        return hf.lm_head(norms[2](head(streams))).numpy()


def attr_evolve(cfg, **kw):
    import attrs

    return attrs.evolve(cfg, **kw)


@pytest.mark.parametrize("window", [6, 16], ids=["local_blocks", "dense"])
def test_deepseek_v4_logits_loss_and_mtp_match_hf(tmp_path, rng, tiny_dsv4, window):
    """Logits, loss and MTP logits as transformers'; the core attention per block of queries over the keys
    before it (window 6 at S = 32) and over the whole sequence (window 16: blocks would save nothing)."""
    from mftk.engine.layers.csa import local_blocks

    cfg = tiny_dsv4(csa_window_size=window)
    assert (local_blocks(cfg.seq_length, window) is None) == (window == 16)
    model = build_model(cfg, seed=3)
    _randomise(model, cfg, rng)
    tensors = v4_sd.mf_to_hf(state_dict(model), cfg)
    hf = _from_dir(transformers.DeepseekV4ForCausalLM, dsv4_hf_config(cfg), tensors, tmp_path)

    ids = rng.integers(1, cfg.vocab_size, (2, cfg.seq_length))
    labels = np.roll(ids, -1, 1)
    mask = np.ones_like(ids, np.float32)
    mask[0, :5] = 0
    model.set_train(False)
    ours, ours_mtp = model.logits(ids)
    with torch.no_grad():
        hidden = hf.model(torch.tensor(ids)).last_hidden_state
        ref = hf.lm_head(hidden).numpy()
    assert np.abs(ref).max() > 0.05
    assert np.abs(ours.asnumpy() - ref).max() <= TOL
    ref_mtp = _hf_mtp_logits(hf, cfg, tensors, ids, hidden, tmp_path)
    assert np.abs(ours_mtp[0].asnumpy() - ref_mtp).max() <= TOL

    out = model.forward({"input_ids": ids, "labels": labels, "loss_mask": mask})
    assert out.loss == pytest.approx(_ce(ref, labels, mask), abs=TOL)
    mtp_labels, mtp_mask = np.roll(labels, -1, 1), np.roll(mask, -1, 1)
    mtp_mask[:, -1] = 0
    assert out.mtp_losses[0] == pytest.approx(0.3 * _ce(ref_mtp, mtp_labels, mtp_mask), abs=TOL)


def test_deepseek_v4_parity_exercises_the_new_parts(rng, tiny_dsv4):
    """The parity config really has a hash layer, a sparse (top-k < visible) CSA layer, an HCA layer and
    active clamps: changing any of them changes the logits."""
    cfg = tiny_dsv4()
    ids = rng.integers(1, cfg.vocab_size, (2, cfg.seq_length))
    base = build_model(cfg, seed=3)
    base.set_train(False)
    ref = base.logits(ids)[0].asnumpy()
    for change in ({"activation_func_clamp_value": None}, {"num_hash_layers": 0}, {"index_topk": 8},
                   {"compress_ratios": [0, 4, 0, 0]}):
        other = build_model(attr_evolve(cfg, **change), seed=3)
        other.set_train(False)
        assert np.abs(other.logits(ids)[0].asnumpy() - ref).max() > 1e-3, change


def test_deepseek_v4_mapping_round_trips(tiny_dsv4, rng):
    cfg = tiny_dsv4()
    model = build_model(cfg, seed=4)
    mf = _randomise(model, cfg, rng)
    hf = v4_sd.mf_to_hf(mf, cfg)
    assert hf["layers.0.ffn.gate.tid2eid"].dtype == np.int64 and "layers.0.ffn.gate.bias" not in hf
    assert hf["layers.1.ffn.experts.3.w1.weight"].shape == (cfg.moe_intermediate_size, cfg.hidden_size)
    assert hf["mtp.0.e_proj.weight"].shape == (cfg.hidden_size, cfg.hidden_size)
    back = v4_sd.hf_to_mf(hf, cfg)
    assert set(back) == set(mf)
    assert all(np.array_equal(back[k], mf[k]) for k in mf if not k.endswith("tokens_per_expert"))
    assert back["decoder.layers.0.mlp.router.tid2eid"].dtype == np.int32


def test_deepseek_v4_export_refuses_changed_frozen_buffers(tiny_dsv4):
    from mftk.errors import CheckpointError

    cfg = tiny_dsv4()
    mf = state_dict(build_model(cfg, seed=4))
    mf["decoder.layers.1.attn_hc.rms_weight"] = mf["decoder.layers.1.attn_hc.rms_weight"] * 2
    with pytest.raises(CheckpointError, match="rms_weight"):
        v4_sd.mf_to_hf(mf, cfg)


# ------------------------------------------------------------------------------------------------ Qwen3-MoE
def _qwen3_moe_hf_config(cfg):
    return transformers.Qwen3MoeConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, moe_intermediate_size=cfg.moe_intermediate_size,
        num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok, norm_topk_prob=cfg.norm_topk_prob,
        mlp_only_layers=list(cfg.mlp_only_layers or []), decoder_sparse_step=cfg.decoder_sparse_step,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=64, tie_word_embeddings=cfg.tie_word_embeddings)


@pytest.mark.parametrize("kw", [{}, {"norm_topk_prob": False, "mlp_only_layers": [], "decoder_sparse_step": 2,
                                     "tie_word_embeddings": True}], ids=["renorm-dense0", "raw-sparse2-tied"])
def test_qwen3_moe_logits_and_loss_match_hf(tmp_path, rng, tiny_qwen3_moe, kw):
    cfg = tiny_qwen3_moe(**kw)
    model = build_model(cfg, seed=5)
    _randomise(model, cfg, rng)
    hf = _from_dir(transformers.Qwen3MoeForCausalLM, _qwen3_moe_hf_config(cfg), q3moe_sd.mf_to_hf(state_dict(model), cfg),
                   tmp_path)
    ids = rng.integers(1, cfg.vocab_size, (2, 12))
    labels = np.roll(ids, -1, 1)
    mask = np.ones_like(ids, np.float32)
    mask[1, :3] = 0
    ours = model.logits(ids)[0].asnumpy()
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    assert np.abs(ref).max() > 0.05
    assert np.abs(ours - ref).max() <= TOL
    out = model.forward({"input_ids": ids, "labels": labels, "loss_mask": mask})
    assert out.loss == pytest.approx(_ce(ref, labels, mask), abs=TOL)


def test_qwen3_moe_mapping_round_trips(tiny_qwen3_moe):
    cfg = tiny_qwen3_moe()
    mf = state_dict(build_model(cfg, seed=6))
    hf = q3moe_sd.mf_to_hf(mf, cfg)
    assert "model.layers.0.mlp.gate_proj.weight" in hf and "model.layers.1.mlp.experts.7.down_proj.weight" in hf
    back = q3moe_sd.hf_to_mf(hf, cfg)
    assert set(back) == set(mf)
    assert all(np.array_equal(back[k], mf[k]) for k in mf if not k.endswith("tokens_per_expert"))
