"""HF config.json ↔ model: for DeepSeek-V4 and Qwen3-MoE: transformers reads our export as the same model
(its own config class parses it), the import gives back the section, and what HF cannot express is refused."""
from __future__ import annotations

import json

import attrs
import pytest

from mftk.config.hf import hf_config_from_model_section, hf_to_model_section
from mftk.config.model import DeepseekV4ModelConfig, Qwen3MoeModelConfig, model_config_from_dict
from mftk.errors import ConfigError

V4 = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, q_lora_rank=24,
          qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, o_groups=2, o_lora_rank=8,
          compress_ratios=[0, 4, 128, 4, 0], csa_window_size=6, index_n_heads=4, index_head_dim=8, index_topk=2,
          num_residual_streams=3, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
          num_hash_layers=2, mtp_loss_scaling_factor=0.3, rotary_scaling_factor=4.0, original_max_position_embeddings=32,
          activation_func_clamp_value=7.0, apply_dsa_kernel_fusion=False)
SAME_V4 = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank", "qk_nope_head_dim",
           "qk_rope_head_dim", "v_head_dim", "o_groups", "o_lora_rank", "compress_ratios", "csa_window_size",
           "index_n_heads", "index_head_dim", "index_topk", "num_residual_streams", "moe_intermediate_size",
           "n_routed_experts", "num_experts_per_tok", "num_hash_layers", "rotary_scaling_factor",
           "original_max_position_embeddings", "activation_func_clamp_value", "compress_rope_theta", "rope_theta",
           "mtp_loss_scaling_factor", "moe_router_score_function", "position_embedding_type")


def test_deepseek_v4_config_round_trips_through_transformers():
    transformers = pytest.importorskip("transformers")
    cfg = DeepseekV4ModelConfig(**V4)
    cj = hf_config_from_model_section(cfg)
    hf = transformers.DeepseekV4Config(**{k: v for k, v in cj.items() if k not in ("architectures", "model_type")})
    assert hf.layer_types == ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                              "compressed_sparse_attention"]
    assert hf.mlp_layer_types == ["hash_moe", "hash_moe", "moe", "moe"] and hf.qk_rope_head_dim == 8
    assert hf.rope_parameters["compress"]["rope_type"] == "yarn" and hf.rope_parameters["compress"]["factor"] == 4.0
    section, notes = hf_to_model_section(json.loads(hf.to_json_string()), seq_length=64)  # as config.json
    back, problems = model_config_from_dict(section)
    assert back is not None and not [p for p in problems if p.severity == "error"], problems
    assert {k: getattr(back, k) for k in SAME_V4} == {k: getattr(cfg, k) for k in SAME_V4}
    # every V4 key is translated; only transformers' generic `dtype` has no mftk field
    assert {p.path for p in notes if p.severity == "warning"} <= {"model.dtype"}, [p.render() for p in notes]


@pytest.mark.parametrize("change,key", [({"norm_topk_prob": False}, "norm_topk_prob"),
                                        ({"activation_func_clamp_value": None}, "activation_func_clamp_value"),
                                        ({"compress_ratios": [0, 4, 128, 64, 0]}, "compress_ratios"),
                                        ({"moe_shared_expert_intermediate_size": 8}, "moe_shared_expert_intermediate_size"),
                                        ({"csa_dense_mode": True}, "csa_dense_mode")])
def test_deepseek_v4_export_refuses_what_transformers_cannot_express(change, key):
    with pytest.raises(ConfigError) as e:
        hf_config_from_model_section(attrs.evolve(DeepseekV4ModelConfig(**V4), **change))
    assert [p.path for p in e.value.problems] == [f"model.{key}"]


def test_qwen3_moe_config_round_trips_and_refuses_a_scaling_factor():
    transformers = pytest.importorskip("transformers")
    cfg = Qwen3MoeModelConfig(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=16,
                              num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0],
                              decoder_sparse_step=1, rope_theta=1e6)
    cj = hf_config_from_model_section(cfg)
    hf = transformers.Qwen3MoeConfig(**{k: v for k, v in cj.items() if k not in ("architectures", "model_type")})
    section, _ = hf_to_model_section(json.loads(hf.to_json_string()), seq_length=64)
    back, _ = model_config_from_dict(section)
    keys = ("num_experts", "num_experts_per_tok", "norm_topk_prob", "mlp_only_layers", "moe_intermediate_size",
            "head_dim", "rope_theta", "num_key_value_heads")
    assert {k: getattr(back, k) for k in keys} == {k: getattr(cfg, k) for k in keys}
    with pytest.raises(ConfigError, match="cannot be expressed"):
        hf_config_from_model_section(attrs.evolve(cfg, routed_scaling_factor=1.5))
