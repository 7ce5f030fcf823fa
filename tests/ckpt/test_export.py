"""``export_hf`` with numpy-only checkpoints, and the model section → HF config.json inverse.

Reference for the weights: a random state dict written with Hugging Face names and shapes spelled
out by hand here, mapped to reference names and saved with the ckpt library; the export must give
back exactly those tensors (read with the ``safetensors`` package, not our reader).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from mftk.ckpt import safetensors_io as st
from mftk.ckpt.common import CommonInfo
from mftk.ckpt.export import export_hf
from mftk.ckpt.metadata import ShardedTensor, build_metadata
from mftk.ckpt.save import begin_save, finalize_save, save_checkpoint, write_rank_files
from mftk.config.hf import hf_config_from_model_section, hf_to_model_section
from mftk.config.model import model_config_from_dict
from mftk.ckpt.hf import deepseek_v3 as dsv3_sd
from mftk.ckpt.hf import qwen3 as qwen3_sd
from mftk.errors import CheckpointError, ConfigError, InputError
from tests.helpers.hf_configs import DEEPSEEK_V3, QWEN3_0_6B

QWEN3 = {"model_type": "qwen3", "architectures": "Qwen3ForCausalLM", "vocab_size": 48, "hidden_size": 16,
         "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_dropout": 0.0, "pad_token_id": 0,
         "seq_length": 32}
DSV3 = {"model_type": "deepseek_v3", "architectures": "DeepseekV3ForCausalLM", "vocab_size": 48, "hidden_size": 16,
        "intermediate_size": 24, "moe_intermediate_size": 8, "num_hidden_layers": 2, "first_k_dense_replace": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 12, "kv_lora_rank": 8,
        "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 8, "qk_layernorm": True, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 1,
        "moe_shared_expert_intermediate_size": 8, "moe_grouped_gemm": True, "num_nextn_predict_layers": 1,
        "mtp_loss_scaling_factor": 0.3, "position_embedding_type": "yarn", "rotary_scaling_factor": 4.0,
        "max_position_embeddings": 32, "mscale": 1.0, "mscale_all_dim": 1.0, "seq_length": 32}


def _qwen3_hf(c: dict, rng) -> dict[str, np.ndarray]:
    """HF Qwen3ForCausalLM names and shapes (transformers' modeling_qwen3), random values."""
    h, v, f, hd = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["head_dim"]
    nh, ng = c["num_attention_heads"], c["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (nh * hd, h), p + "self_attn.k_proj.weight": (ng * hd, h),
                       p + "self_attn.v_proj.weight": (ng * hd, h), p + "self_attn.o_proj.weight": (h, nh * hd),
                       p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)})
    return {k: rng.normal(0, 1, s).astype(np.float32) for k, s in shapes.items()}


def _save_mf(root, section: dict | None, mf: dict, *, step: int = 3, extra: bool = True, bf16: bool = False):
    model = {k: st.to_bf16(v) for k, v in mf.items()} if bf16 else mf
    save_checkpoint(root, step=step, common=CommonInfo.for_step(step=step, max_steps=9, global_batch_size=2,
                                                                 consumed_samples=2 * step),
                    model=model, extra=({"kind": "train", "model": section} if section is not None else {})
                    if extra else None)
    return root


@pytest.fixture
def qwen3_ckpt(tmp_path):
    hf = _qwen3_hf(QWEN3, np.random.default_rng(0))
    cfg, _ = model_config_from_dict(QWEN3)
    return _save_mf(tmp_path / "ckpt", QWEN3, qwen3_sd.hf_to_mf(hf, cfg)), hf


def test_qwen3_export_gives_back_the_hf_tensors(qwen3_ckpt, tmp_path):
    root, hf = qwen3_ckpt
    r = export_hf(root, tmp_path / "hf")
    out = tmp_path / "hf"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    back = load_file(str(out / "model.safetensors"))
    assert set(back) == set(hf)
    assert all(np.array_equal(back[k], hf[k]) and back[k].dtype == np.float32 for k in hf)
    cj = json.loads((out / "config.json").read_text())
    assert cj["architectures"] == ["Qwen3ForCausalLM"] and cj["model_type"] == "qwen3"
    assert (cj["hidden_size"], cj["num_key_value_heads"], cj["head_dim"], cj["vocab_size"]) == (16, 2, 8, 48)
    assert cj["torch_dtype"] == "float32" and cj["tie_word_embeddings"] is False
    assert r.step == 3 and r.tensors == len(hf) and r.index_file is None and r.files == ("model.safetensors",)
    assert r.parameters == sum(v.size for v in hf.values()) and r.total_bytes == 4 * r.parameters
    assert r.model_source.endswith("mftk extra state")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dir left


def test_sharded_output_has_a_complete_index(qwen3_ckpt, tmp_path):
    root, hf = qwen3_ckpt
    r = export_hf(root, tmp_path / "hf", max_shard_bytes=4000)
    out = tmp_path / "hf"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    n = len(r.files)
    assert n > 2 and r.files == tuple(f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1))
    assert set(index["weight_map"]) == set(hf) and set(index["weight_map"].values()) == set(r.files)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in hf.values())
    assert not (out / "model.safetensors").exists()
    for f in r.files:
        part = load_file(str(out / f))
        assert all(index["weight_map"][k] == f and np.array_equal(v, hf[k]) for k, v in part.items())
        assert sum(v.nbytes for v in part.values()) <= 4000 or len(part) == 1


def test_shards_of_a_two_rank_checkpoint_are_merged(tmp_path):
    hf = _qwen3_hf(QWEN3, np.random.default_rng(1))
    cfg, _ = model_config_from_dict(QWEN3)
    mf = qwen3_sd.hf_to_mf(hf, cfg)
    split = "embedding.word_embeddings.weight"  # rows split over the two ranks; the rest replicated
    specs = {k: ShardedTensor(global_shape=v.shape, axis_fragmentations=(2, 1) if k == split else (1,) * v.ndim,
                              holders={0: 0, 1: 1} if k == split else {0: 0, 1: 0}) for k, v in mf.items()}
    tmp = begin_save(tmp_path / "ckpt", 5)
    for rank in (0, 1):
        part = {k: (np.array_split(v, 2)[rank] if k == split else v) for k, v in mf.items()}
        write_rank_files(tmp, rank=rank, world=2, step=5, model=part, extra={"model": QWEN3})
    finalize_save(tmp_path / "ckpt", 5, world=2, optimizer_saved=False, metadata=build_metadata(specs, {}, world=2),
                  common=CommonInfo.for_step(step=5, max_steps=9, global_batch_size=2, consumed_samples=10))
    export_hf(tmp_path / "ckpt" / "iteration_00000005", tmp_path / "hf")
    back = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(back) == set(hf) and all(np.array_equal(back[k], hf[k]) for k in hf)


def test_bf16_checkpoint_exports_bf16(tmp_path):
    hf = _qwen3_hf(QWEN3, np.random.default_rng(2))
    cfg, _ = model_config_from_dict(QWEN3)
    _save_mf(tmp_path / "ckpt", QWEN3, qwen3_sd.hf_to_mf(hf, cfg), bf16=True)
    r = export_hf(tmp_path / "ckpt", tmp_path / "hf")
    header = st.read_header(tmp_path / "hf" / "model.safetensors")
    assert r.dtype == "bfloat16" and {t.dtype for t in header.tensors.values()} == {"BF16"}
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    back = st.read_tensors(tmp_path / "hf" / "model.safetensors")
    want = st.bf16_to_float32(st.to_bf16(hf["lm_head.weight"]).bits)  # one rounding, then exact
    assert np.array_equal(back["lm_head.weight"], want)


def test_dsv3_export_names_match_the_mapping(tmp_path):
    cfg, problems = model_config_from_dict(DSV3)
    assert cfg is not None, problems
    rng = np.random.default_rng(3)
    hf = dsv3_sd.mf_to_hf(_dsv3_mf_from_shapes(cfg, rng), cfg)
    mf = dsv3_sd.hf_to_mf(hf, cfg)
    _save_mf(tmp_path / "ckpt", DSV3, mf)
    export_hf(tmp_path / "ckpt", tmp_path / "hf")
    back = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(back) == set(hf) and all(np.array_equal(back[k], hf[k]) for k in hf)
    assert "model.layers.2.eh_proj.weight" in back  # MTP is HF layer L
    cj = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cj["rope_scaling"]["type"] == "yarn" and cj["rope_scaling"]["original_max_position_embeddings"] == 32
    assert cj["max_position_embeddings"] == 128 and cj["first_k_dense_replace"] == 1


def _dsv3_mf_from_shapes(cfg, rng) -> dict:
    """Reference-named tensors for a tiny DeepSeek-V3, shapes from models.md §3.3 (q_lora / MLA / MoE / MTP)."""
    h, v, L = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    nh, qh = cfg.num_attention_heads, cfg.q_head_dim()
    e, fm = cfg.n_routed_experts, cfg.moe_intermediate_size

    def layer(m: str, moe: bool) -> dict:
        s = {m + "input_layernorm.weight": (h,), m + "pre_mlp_layernorm.weight": (h,),
             m + "self_attention.linear_qkv.weight": (cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim, h),
             m + "self_attention.q_layernorm.weight": (cfg.q_lora_rank,),
             m + "self_attention.linear_qb.weight": (nh * qh, cfg.q_lora_rank),
             m + "self_attention.k_layernorm.weight": (cfg.kv_lora_rank,),
             m + "self_attention.linear_kvb.weight": (nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
             m + "self_attention.linear_proj.weight": (h, nh * cfg.v_head_dim)}
        if moe:
            s.update({m + "mlp.router.weight": (e, h), m + "mlp.expert_bias": (e,),
                      m + "mlp.experts.weight1": (e, h, 2 * fm), m + "mlp.experts.weight2": (e, fm, h),
                      m + "mlp.shared_experts.linear_fc1.weight": (2 * fm, h),
                      m + "mlp.shared_experts.linear_fc2.weight": (h, fm), m + "mlp.tokens_per_expert": (e,)})
        else:
            s.update({m + "mlp.linear_fc1.weight": (2 * cfg.intermediate_size, h),
                      m + "mlp.linear_fc2.weight": (h, cfg.intermediate_size)})
        return s

    shapes = {"embedding.word_embeddings.weight": (v, h), "decoder.final_layernorm.weight": (h,),
              "output_layer.weight": (v, h)}
    for i, moe in enumerate(cfg.moe_layer_pattern()):
        shapes.update(layer(f"decoder.layers.{i}.", moe))
    shapes.update({"mtp.layers.0.enorm.weight": (h,), "mtp.layers.0.hnorm.weight": (h,),
                   "mtp.layers.0.eh_proj.weight": (h, 2 * h), "mtp.layers.0.final_layernorm.weight": (h,)})
    shapes.update(layer("mtp.layers.0.transformer_layer.", True))
    out = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in shapes.items()}
    out.update({k: np.zeros(s, np.float32) for k, s in shapes.items() if k.endswith("tokens_per_expert")})
    return out


# ------------------------------------------------------------------------------------- errors
def test_no_model_section_is_refused_with_a_hint(qwen3_ckpt, tmp_path):
    root, hf = qwen3_ckpt
    cfg, _ = model_config_from_dict(QWEN3)
    old = _save_mf(tmp_path / "old", None, qwen3_sd.hf_to_mf(hf, cfg))  # extra state without "model"
    ref = _save_mf(tmp_path / "ref", None, qwen3_sd.hf_to_mf(hf, cfg), extra=False)  # no extra state at all
    for src, why in ((old, "did not record the model section"), (ref, "has no mftk extra state")):
        with pytest.raises(CheckpointError) as e:
            export_hf(src, tmp_path / "out")
        assert why in e.value.message and "--model-config" in e.value.hint
    assert not (tmp_path / "out").exists()
    yml = tmp_path / "train.yaml"
    yml.write_text(yaml.safe_dump({"training": {"steps": 3}, "model": QWEN3}))
    r = export_hf(ref, tmp_path / "out", model_config=yml)
    assert r.model_source == str(yml)
    assert np.array_equal(load_file(str(tmp_path / "out" / "model.safetensors"))["lm_head.weight"], hf["lm_head.weight"])
    yml.write_text("training: {steps: 3}\n")
    with pytest.raises(ConfigError, match="no model: section"):
        export_hf(ref, tmp_path / "out2", model_config=yml)


def test_output_must_be_new_or_empty(qwen3_ckpt, tmp_path):
    root, _ = qwen3_ckpt
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="not an empty directory"):
        export_hf(root, tmp_path / "busy")
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    export_hf(root, tmp_path / "empty")
    assert (tmp_path / "empty" / "model.safetensors").is_file()


def test_hf_dir_or_lone_file_is_not_a_source(qwen3_ckpt, tmp_path):
    root, _ = qwen3_ckpt
    export_hf(root, tmp_path / "hf")
    with pytest.raises(CheckpointError, match="already a Hugging Face"):
        export_hf(tmp_path / "hf", tmp_path / "again")
    with pytest.raises(CheckpointError, match="single file"):
        export_hf(tmp_path / "hf" / "model.safetensors", tmp_path / "again")


def test_weights_that_do_not_fit_the_section_leave_nothing_behind(tmp_path):
    hf = _qwen3_hf(QWEN3, np.random.default_rng(4))
    cfg, _ = model_config_from_dict(QWEN3)
    mf = qwen3_sd.hf_to_mf(hf, cfg)
    del mf["decoder.layers.1.mlp.linear_fc2.weight"]
    _save_mf(tmp_path / "ckpt", QWEN3, mf)
    with pytest.raises(CheckpointError) as e:
        export_hf(tmp_path / "ckpt", tmp_path / "hf")
    assert any("decoder.layers.1.mlp.linear_fc2.weight" in p for p in e.value.problems)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_settings_transformers_cannot_express_are_refused_before_reading(tmp_path):
    section = {**DSV3, "moe_router_score_function": "softmax", "moe_router_enable_expert_bias": False,
               "position_embedding_type": "rope", "mscale": 0.707}
    _save_mf(tmp_path / "ckpt", section, {"x": np.zeros(1, np.float32)})  # tensors never get read
    with pytest.raises(ConfigError) as e:
        export_hf(tmp_path / "ckpt", tmp_path / "hf")
    paths = {p.path for p in e.value.problems}
    assert {"model.moe_router_score_function", "model.mscale"} <= paths
    mla = next(p for p in e.value.problems if p.path == "model.mscale")
    # g(4, 0.707)² / √12 with plain RoPE vs HF's 1/√12
    assert f"{(0.1 * 0.707 * np.log(4) + 1) ** 2 / np.sqrt(12):.6g}" in mla.message
    assert f"{1 / np.sqrt(12):.6g}" in mla.message and "rotary_scaling_factor: 1.0" in mla.hint
    assert not (tmp_path / "hf").exists()


def test_unknown_model_type_and_broken_section(tmp_path):
    _save_mf(tmp_path / "ckpt", {**QWEN3, "hidden_size": "wide"}, {"x": np.zeros(1, np.float32)})
    with pytest.raises(ConfigError) as e:
        export_hf(tmp_path / "ckpt", tmp_path / "hf")
    assert any(p.path == "model.hidden_size" for p in e.value.problems)


# ------------------------------------------------------------------------------------- config.json inverse
_ARCH_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "rms_norm_eps", "rope_theta", "attention_bias", "tie_word_embeddings",
                "pad_token_id")
_QWEN3_FIELDS = _ARCH_FIELDS  # heads/head_dim: compared resolved (null means nh, H // nh)
_DSV3_FIELDS = _ARCH_FIELDS + (
    "moe_intermediate_size", "n_shared_experts", "n_routed_experts", "num_experts_per_tok", "routed_scaling_factor",
    "n_group", "topk_group", "norm_topk_prob", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "num_nextn_predict_layers", "qk_layernorm", "moe_router_score_function", "moe_aux_loss_coeff")


def _round_trip(section: dict):
    cfg, problems = model_config_from_dict(section)
    assert cfg is not None, problems
    hf = hf_config_from_model_section(cfg)
    json.dumps(hf)  # plain JSON
    back_section, notes = hf_to_model_section(hf, seq_length=cfg.seq_length)
    assert [n for n in notes if n.severity != "note"] == []  # every exported key is understood on the way back
    back, problems = model_config_from_dict(back_section)
    assert back is not None, problems
    return cfg, hf, back


@pytest.mark.parametrize("section", [QWEN3, {**QWEN3, "num_key_value_heads": None, "head_dim": None,
                                             "tie_word_embeddings": True, "attention_bias": True}],
                         ids=["gqa", "defaults-tied-bias"])
def test_qwen3_config_round_trip(section):
    cfg, hf, back = _round_trip(section)
    for f in _QWEN3_FIELDS:
        assert getattr(back, f) == getattr(cfg, f), f
    assert (back.num_query_groups(), back.kv_channels()) == (cfg.num_query_groups(), cfg.kv_channels())
    assert hf["num_key_value_heads"] == cfg.num_query_groups() and hf["head_dim"] == cfg.kv_channels()


@pytest.mark.parametrize("section", [DSV3, {**DSV3, "q_lora_rank": None, "num_nextn_predict_layers": 0,
                                            "moe_aux_loss_coeff": 0.01, "moe_router_load_balancing_type": "aux_loss"}],
                         ids=["flat-yarn", "no-qlora-no-mtp"])
def test_dsv3_config_round_trip(section):
    cfg, hf, back = _round_trip(section)
    for f in _DSV3_FIELDS:
        assert getattr(back, f) == getattr(cfg, f), f
    assert back.rope_params() == cfg.rope_params() and back.moe_layer_pattern() == cfg.moe_layer_pattern()
    assert back.mla_softmax_scale() == pytest.approx(cfg.mla_softmax_scale(), rel=1e-15)
    assert back.moe_shared_expert_intermediate_size_resolved() == cfg.moe_shared_expert_intermediate_size_resolved()
    assert back.moe_router_load_balancing_type == cfg.moe_router_load_balancing_type or cfg.moe_aux_loss_coeff == 0


@pytest.mark.parametrize("published", [QWEN3_0_6B, DEEPSEEK_V3], ids=["Qwen3-0.6B", "DeepSeek-V3"])
def test_published_configs_come_back(published):
    """HF → model section → HF reproduces every key of the published config.json that transformers reads."""
    cfg, _ = model_config_from_dict(hf_to_model_section(published)[0])
    again = hf_config_from_model_section(cfg, dtype="bfloat16")
    skip = {"transformers_version", "auto_map", "quantization_config", "ep_size", "pretraining_tp", "use_cache",
            "max_window_layers", "attention_dropout"}
    for key, value in published.items():
        if key not in skip:
            assert again.get(key) == value, (key, again.get(key), value)
    assert set(again) - set(published) <= {"pad_token_id", "rope_interleave", "max_window_layers", "use_cache"}


def test_engine_ignored_settings_become_notes_not_errors():
    from mftk.config.hf import hf_export_notes

    cfg, _ = model_config_from_dict({**QWEN3, "rope_scaling": {"type": "yarn", "factor": 2.0}})
    notes = hf_export_notes(cfg)
    assert [n.path for n in notes] == ["model.rope_scaling"] and notes[0].severity == "warning"
    assert hf_config_from_model_section(cfg)["rope_scaling"] is None  # what mftk's Qwen3 computes


def test_config_from_a_raw_section_and_bad_family():
    assert hf_config_from_model_section(dict(QWEN3))["num_hidden_layers"] == 2
    with pytest.raises(ConfigError):
        hf_config_from_model_section({"model_type": "llama"})


def test_export_never_loads_mindspore(qwen3_ckpt, tmp_path):
    """The name mapping is numpy-only: exporting a large checkpoint needs no MindSpore import."""
    import subprocess
    import sys

    root, _ = qwen3_ckpt
    code = ("import sys; from mftk.ckpt.export import export_hf; export_hf(sys.argv[1], sys.argv[2]); "
            "print('mindspore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(root), str(tmp_path / "hf")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
