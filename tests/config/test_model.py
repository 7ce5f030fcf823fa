"""The typed model section: defaults, key normalisation, derived values and model-internal rules."""
import math

import attrs
import pytest

from mftk.config.model import (model_configs, DeepseekV3ModelConfig, Qwen3ModelConfig, model_config_from_dict,
                               model_problems, normalize_model_dict)

from tests.helpers.sizes import PYNATIVE_DS3, tiny_dsv3, tiny_qwen3


def by_path(problems):
    return {p.path: p for p in problems}


# ----- the classes -----

def test_registry():
    from mftk.config.model import DeepseekV4ModelConfig, Qwen3MoeModelConfig

    assert model_configs() == {"qwen3": Qwen3ModelConfig, "deepseek_v3": DeepseekV3ModelConfig,
                             "deepseek_mtp": DeepseekV3ModelConfig, "deepseek_v4": DeepseekV4ModelConfig,
                             "qwen3_moe": Qwen3MoeModelConfig}


@pytest.mark.parametrize("cls", [Qwen3ModelConfig, DeepseekV3ModelConfig])
def test_every_field_has_help_and_a_plain_type(cls):
    allowed = {int, float, bool, str, int | None, float | None, str | None, dict | None, int | list[int]}
    for a in attrs.fields(cls):
        assert a.metadata.get("help"), a.name
        assert a.type in allowed, (a.name, a.type)


def test_dsv3_defaults_are_the_reference_effective_defaults():
    c = DeepseekV3ModelConfig()  # models.md §1.3: signature defaults + MF-injected defaults
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.moe_intermediate_size) == (129280, 7168, 18432, 2048)
    assert (c.num_hidden_layers, c.num_nextn_predict_layers, c.num_attention_heads) == (61, 1, 128)
    assert (c.n_routed_experts, c.num_experts_per_tok, c.n_group, c.topk_group) == (256, 8, 8, 4)
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (
        1536, 512, 128, 64, 128)
    assert c.moe_router_score_function == "sigmoid" and c.moe_router_enable_expert_bias
    assert c.hidden_dropout == 0.0 and c.first_k_dense_replace == 3 and c.routed_scaling_factor == 2.5
    assert c.moe_router_load_balancing_type == "sub_seq_aux_loss" and c.moe_grouped_gemm is False
    assert c.mtp_loss_scaling_factor is None and c.pad_token_id == 0


def test_qwen3_defaults_are_the_reference_effective_defaults():
    c = Qwen3ModelConfig()  # models.md §1.4
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (151936, 4096, 22016, 32)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (32, 32, 128)
    assert c.hidden_dropout == 0.1 and c.pad_token_id == 151643 and c.tie_word_embeddings is False
    assert c.rope_theta == 10000.0 and c.max_position_embeddings == 32768
    assert c.qk_layernorm() is True  # always on in the pynative Qwen3


def test_defaults_have_no_model_problems_except_what_the_reference_rejects():
    assert model_problems(Qwen3ModelConfig()) == []
    errors = {p.path for p in model_problems(DeepseekV3ModelConfig()) if p.severity == "error"}
    # a YAML relying on DSv3 defaults fails in the reference for exactly these two reasons (models.md §1.2)
    assert errors == {"model.moe_grouped_gemm", "model.mtp_loss_scaling_factor"}


def test_pynative_ds3_yaml_model_section_loads_with_one_unmapped_warning():
    raw = {**PYNATIVE_DS3, "architectures": "DeepseekV3ForCausalLM", "add_bias_linear": False,
           "use_flash_attention": True, "multi_latent_attention": True, "mla_qkv_concat": True,
           "attention_dropout": 0.0, "hidden_dropout": 0.0, "params_dtype": "float32",
           "compute_dtype": "bfloat16", "layernorm_compute_dtype": "float32", "rotary_dtype": "float32",
           "softmax_compute_dtype": "float32", "initializer_range": 0.01, "rope_theta": 10000,
           "router_dense_type": "float32", "gated_linear_unit": True, "scoring_func": "sigmoid",
           "norm_topk_prob": True, "routed_scaling_factor": 2.5, "moe_router_enable_expert_bias": True,
           "moe_router_bias_update_rate": 0.001, "rms_norm_eps": 1e-6}
    cfg, problems = model_config_from_dict(raw)
    warnings = by_path(p for p in problems if p.severity == "warning")
    assert set(warnings) == {"model.router_dense_type", "model.mla_qkv_concat", "model.softmax_compute_dtype"}
    assert "unknown" in warnings["model.router_dense_type"].message
    assert "no effect in PyNative" in warnings["model.mla_qkv_concat"].message
    assert by_path(problems)["model.scoring_func"].severity == "note"
    assert [p for p in model_problems(cfg) if p.severity != "note"] == []
    assert cfg.moe_layer_pattern() == [False] + [True] * 11  # first_k_dense_replace = 1
    assert cfg.moe_shared_expert_intermediate_size_resolved() == 1024
    assert cfg.kv_channels() == 224  # 1792 / 8 (unused by MLA)


# ----- normalize_model_dict -----

def test_aliases_are_rewritten_with_a_note():
    out, ps = normalize_model_dict({"model_type": "deepseek_v3", "num_layers": 4, "num_moe_experts": 16,
                                    "mtp_loss_factor": 0.1, "moe_router_topk": 2, "qk_pos_emb_head_dim": 32,
                                    "init_method_std": 0.01})
    assert out == {"model_type": "deepseek_v3", "num_hidden_layers": 4, "n_routed_experts": 16,
                   "mtp_loss_scaling_factor": 0.1, "num_experts_per_tok": 2, "qk_rope_head_dim": 32,
                   "initializer_range": 0.01}
    assert by_path(ps)["model.num_moe_experts"].severity == "note"
    assert "n_routed_experts" in by_path(ps)["model.num_moe_experts"].message


def test_qwen3_kv_channels_alias():
    out, _ = normalize_model_dict({"model_type": "qwen3", "kv_channels": 64, "num_query_groups": 2})
    assert out == {"model_type": "qwen3", "head_dim": 64, "num_key_value_heads": 2}


def test_alias_conflict_is_an_error_same_value_is_fine():
    _, ps = normalize_model_dict({"model_type": "qwen3", "num_hidden_layers": 4, "num_layers": 6})
    p = by_path(ps)["model.num_layers"]
    assert p.severity == "error" and "4" in p.message and "6" in p.message
    out, ps = normalize_model_dict({"model_type": "qwen3", "num_hidden_layers": 4, "num_layers": 4})
    assert out["num_hidden_layers"] == 4 and all(p.severity != "error" for p in ps)


def test_deleted_inert_and_unknown_keys():
    out, ps = normalize_model_dict({"model_type": "qwen3", "use_cache": True, "sliding_window": None,
                                    "torch_dtype": "bfloat16", "block_size": 32, "recompute_granularity": "full",
                                    "tensor_model_parallel_size": 2, "model_parallel": 2, "num_attention_head": 8})
    assert out == {"model_type": "qwen3"}
    ps = by_path(ps)
    assert ps["model.use_cache"].severity == ps["model.torch_dtype"].severity == "note"
    for k in ("block_size", "recompute_granularity", "tensor_model_parallel_size", "model_parallel"):
        assert ps[f"model.{k}"].severity == "warning" and "no effect" in ps[f"model.{k}"].message
    assert "parallelism:" in ps["model.model_parallel"].message
    unknown = ps["model.num_attention_head"]
    assert unknown.severity == "warning" and "num_attention_heads" in unknown.hint


def test_dsv3_only_keys_in_qwen3_are_warned():
    out, ps = normalize_model_dict({"model_type": "qwen3", "n_routed_experts": 8, "num_moe_experts": 8,
                                    "q_lora_rank": 16})
    assert out == {"model_type": "qwen3"}
    assert {p.severity for p in ps} == {"warning"} and len(ps) == 3


def test_unsupported_features_error_only_when_on():
    _, ps = normalize_model_dict({"model_type": "deepseek_v3", "enable_hyper_connections": False, "dsa_topk": 0})
    assert ps == []
    _, ps = normalize_model_dict({"model_type": "deepseek_v3", "enable_hyper_connections": True})
    assert ps[0].severity == "error"


def test_friendly_coercions():
    out, ps = normalize_model_dict({"model_type": "deepseek_v3", "rms_norm_eps": "1e-6",
                                    "mtp_loss_scaling_factor": "3e-1", "hidden_dropout": 0,
                                    "pad_token_id": None, "num_nextn_predict_layers": None,
                                    "architectures": ["DeepseekV3ForCausalLM"], "hidden_act": "swiglu",
                                    "bias_swiglu_fusion": True})
    assert out["rms_norm_eps"] == 1e-6 and isinstance(out["rms_norm_eps"], float)
    assert out["mtp_loss_scaling_factor"] == 0.3
    assert out["hidden_dropout"] == 0.0 and isinstance(out["hidden_dropout"], float)
    assert out["pad_token_id"] == 0 and out["num_nextn_predict_layers"] == 0
    assert out["architectures"] == "DeepseekV3ForCausalLM" and out["hidden_act"] == "fusedswiglu"
    ps = by_path(ps)
    assert ps["model.rms_norm_eps"].severity == "note" and "1e-06" in ps["model.rms_norm_eps"].message
    assert ps["model.hidden_dropout"].severity == "warning"
    assert ps["model.architectures"].severity == "warning"
    # a non-numeric string is left for the converter to reject
    out, _ = normalize_model_dict({"model_type": "qwen3", "rms_norm_eps": "small"})
    assert out["rms_norm_eps"] == "small"


@pytest.mark.parametrize("raw,msg", [({}, "required"), ({"model_type": "qwen"}, "unknown model_type"),
                                     ({"model_type": 3}, "unknown model_type")])
def test_bad_model_type(raw, msg):
    out, ps = normalize_model_dict(raw)
    assert out == {} and ps[0].path == "model.model_type" and ps[0].severity == "error" and msg in ps[0].message
    assert model_config_from_dict(raw)[0] is None


def test_did_you_mean_model_type():
    _, ps = normalize_model_dict({"model_type": "qwen33"})
    assert "qwen3" in ps[0].hint


def test_not_a_mapping():
    out, ps = normalize_model_dict(["model_type"])
    assert out == {} and ps[0].path == "model"


# ----- derived values -----

def test_moe_layer_pattern_forms():
    assert tiny_dsv3(num_hidden_layers=4, first_k_dense_replace=2).moe_layer_pattern() == [False, False, True, True]
    assert tiny_dsv3(num_hidden_layers=4, first_k_dense_replace=None, moe_layer_freq=2).moe_layer_pattern() == \
        [True, False, True, False]
    assert tiny_dsv3(num_hidden_layers=3, first_k_dense_replace=None, moe_layer_freq=[0, 1, 0]).moe_layer_pattern() \
        == [False, True, False]
    assert tiny_dsv3(num_hidden_layers=3, first_k_dense_replace=None).moe_layer_pattern() == [True] * 3
    assert tiny_qwen3().moe_layer_pattern() == [False, False]


def test_shared_expert_size_resolution():
    assert tiny_dsv3(n_shared_experts=2).moe_shared_expert_intermediate_size_resolved() == 4  # Fm × 2
    assert tiny_dsv3(moe_shared_expert_intermediate_size=7).moe_shared_expert_intermediate_size_resolved() == 7
    assert tiny_dsv3(n_shared_experts=0, moe_shared_expert_intermediate_size=7) \
        .moe_shared_expert_intermediate_size_resolved() == 0


def test_qwen3_derived_defaults():
    c = tiny_qwen3(head_dim=None, num_key_value_heads=None)
    assert c.kv_channels() == 2 and c.num_query_groups() == 2 and c.ffn_hidden_size() == 5


def test_rope_params_flat_yarn_keys():
    rp = DeepseekV3ModelConfig(**PYNATIVE_DS3).rope_params()
    assert (rp.position_embedding_type, rp.factor, rp.original_max_position_embeddings) == ("yarn", 40.0, 163840)
    assert rp.rotary_mscale == 1.0


def test_rope_params_from_rope_scaling_dict():
    c = tiny_dsv3(rope_scaling={"type": "yarn", "factor": 4, "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16},
                  seq_length=64)
    rp = c.rope_params()
    assert rp.position_embedding_type == "yarn" and rp.factor == 4.0 and rp.beta_fast == 16.0
    assert rp.original_max_position_embeddings == 64  # no original_... key: seq_length (models.md §1.7)
    g = lambda m: 0.1 * m * math.log(4) + 1  # noqa: E731
    assert rp.rotary_mscale == pytest.approx(g(1.0) / g(0.5))
    rp = tiny_dsv3(rope_scaling={"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 32}).rope_params()
    assert rp.original_max_position_embeddings == 32 and rp.mscale == 0.707


def test_mla_softmax_scale_with_plain_rope():
    # models.md §2.4: MLA defaults with 'rope' still get g(40, 0.707)² / √192 = 0.11472
    assert DeepseekV3ModelConfig().mla_softmax_scale() == pytest.approx(0.11472, abs=1e-5)


# ----- model_problems -----

def errors(cfg):
    return by_path(p for p in model_problems(cfg) if p.severity == "error")


def test_tiny_configs_are_clean():
    assert model_problems(tiny_qwen3(head_dim=2)) == []
    assert model_problems(tiny_dsv3()) == []


@pytest.mark.parametrize("kw,path,text", [
    (dict(n_routed_experts=6, n_group=4, topk_group=2, num_experts_per_tok=2), "model.n_group", "6 % 4 = 2"),
    (dict(n_routed_experts=4, n_group=4, topk_group=1, num_experts_per_tok=2), "model.n_group", "4 / 4 = 1"),
    (dict(n_group=2, topk_group=3, num_experts_per_tok=3), "model.topk_group", "topk_group 3 > n_group 2"),
    (dict(n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3), "model.topk_group", "3 % 2 = 1"),
    (dict(n_group=2, topk_group=None), "model.topk_group", "required"),
    (dict(num_experts_per_tok=5), "model.num_experts_per_tok", "exceeds"),
    (dict(moe_router_score_function="softmax"), "model.moe_router_enable_expert_bias", "sigmoid"),
    (dict(moe_router_score_function="tanh"), "model.moe_router_score_function", "softmax"),
    (dict(moe_router_score_function="softmax", moe_router_enable_expert_bias=False, num_experts_per_tok=1,
          topk_group=1), "model.num_experts_per_tok", "top-1 softmax"),
    (dict(num_nextn_predict_layers=2), "model.num_nextn_predict_layers", "0 or 1"),
    (dict(mtp_loss_scaling_factor=None), "model.mtp_loss_scaling_factor", "required"),
    (dict(moe_aux_loss_coeff=0.01), "model.moe_router_load_balancing_type", "coeff = 0.01 > 0"),
    (dict(add_bias_linear=True), "model.add_bias_linear", "MoE"),
    (dict(moe_grouped_gemm=False), "model.moe_grouped_gemm", "grouped"),
    (dict(first_k_dense_replace=1, moe_layer_freq=2), "model.first_k_dense_replace", "moe_layer_freq = 2 > 1"),
    (dict(first_k_dense_replace=3), "model.first_k_dense_replace", "num_hidden_layers = 2"),
    (dict(first_k_dense_replace=None, moe_layer_freq=[0, 1, 1]), "model.moe_layer_freq", "len = 3"),
    (dict(first_k_dense_replace=None, moe_layer_freq=[0, 2]), "model.moe_layer_freq", "0 (dense) or 1"),
    (dict(qk_rope_head_dim=3), "model.qk_rope_head_dim", "even"),
    (dict(kv_lora_rank=0), "model.kv_lora_rank", "> 0"),
    (dict(q_lora_rank=-1), "model.q_lora_rank", "> 0"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), "model.rope_scaling", "linear"),
    (dict(rope_scaling={"factor": 2.0}), "model.rope_scaling", "type"),
    (dict(rope_scaling={"type": "yarn", "factor": "big"}), "model.rope_scaling.factor", "number"),
    (dict(multi_latent_attention=False), "model.multi_latent_attention", "MLA"),
    (dict(architectures="Qwen3ForCausalLM"), "model.architectures", "DeepseekV3ForCausalLM"),
])
def test_dsv3_rules(kw, path, text):
    errs = errors(tiny_dsv3(**kw))
    assert path in errs, errs
    assert text in errs[path].message + errs[path].hint
    assert errs[path].hint  # every rule says how to fix it (or names the allowed values)


def test_aux_loss_valid_types_pass():
    for t in ("aux_loss", "seq_aux_loss", "global_aux_loss"):
        assert errors(tiny_dsv3(moe_aux_loss_coeff=0.01, moe_router_load_balancing_type=t)) == {}


def test_dsv3_warnings():
    ws = by_path(p for p in model_problems(tiny_dsv3(qk_layernorm=False, tie_word_embeddings=True,
                                                     n_shared_experts=0, moe_shared_expert_intermediate_size=4))
                 if p.severity == "warning")
    assert set(ws) == {"model.qk_layernorm", "model.tie_word_embeddings", "model.moe_shared_expert_intermediate_size"}


@pytest.mark.parametrize("kw,path,text", [
    (dict(num_key_value_heads=3, num_attention_heads=4), "model.num_key_value_heads", "4 % 3 = 1"),
    (dict(head_dim=0), "model.head_dim", "> 0"),
    (dict(head_dim=3), "model.head_dim", "even"),
    (dict(hidden_act="swiglu"), "model.hidden_act", "silu"),
    (dict(hidden_act="relu"), "model.hidden_act", "fusedswiglu"),
    (dict(hidden_dropout=1.0), "model.hidden_dropout", "[0, 1)"),
    (dict(attention_dropout=-0.1), "model.attention_dropout", "[0, 1)"),
    (dict(compute_dtype="bf32"), "model.compute_dtype", "bfloat16"),
    (dict(fused_norm=False), "model.fused_norm", "fused"),
    (dict(normalization="LayerNorm"), "model.normalization", "RMSNorm"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0}), "model.rope_scaling", "remove"),
    (dict(position_embedding_type="yarn"), "model.position_embedding_type", "rope"),
    (dict(vocab_size=0), "model.vocab_size", "> 0"),
    (dict(seq_length=-1), "model.seq_length", "> 0"),
    (dict(calculate_per_token_loss=True), "model.calculate_per_token_loss", "false"),
    (dict(architectures="DeepseekV3ForCausalLM"), "model.architectures", "Qwen3ForCausalLM"),
])
def test_qwen3_rules(kw, path, text):
    errs = errors(tiny_qwen3(**kw))
    assert path in errs, errs
    assert text in errs[path].message + errs[path].hint


def test_all_problems_reported_at_once():
    errs = errors(tiny_dsv3(hidden_act="swiglu", num_nextn_predict_layers=3, n_group=3, hidden_dropout=2.0))
    assert {"model.hidden_act", "model.num_nextn_predict_layers", "model.n_group", "model.hidden_dropout"} <= set(errs)


def test_yaml_key_for_maps_back_to_the_alias():
    from mftk.config.model import yaml_key_for
    raw = {"model_type": "deepseek_v3", "num_layers": 2, "hidden_size": 8}
    assert yaml_key_for(raw, "num_hidden_layers") == "num_layers"
    assert yaml_key_for(raw, "hidden_size") == "hidden_size"
    assert yaml_key_for(raw, "vocab_size") == "vocab_size"
    assert yaml_key_for({"model_type": "x"}, "vocab_size") == "vocab_size"


def test_qwen3_qk_layernorm_key():
    out, ps = normalize_model_dict({"model_type": "qwen3", "qk_layernorm": True})
    assert out == {"model_type": "qwen3"} and ps[0].severity == "note"
    _, ps = normalize_model_dict({"model_type": "qwen3", "qk_layernorm": False})
    assert ps[0].severity == "warning" and "always" in ps[0].message


def test_deepseek_mtp_model_type_uses_dsv3():
    cfg, ps = model_config_from_dict({"model_type": "deepseek_mtp", "mtp_loss_scaling_factor": 0.1})
    assert isinstance(cfg, DeepseekV3ModelConfig) and cfg.model_type == "deepseek_mtp" and ps == []
