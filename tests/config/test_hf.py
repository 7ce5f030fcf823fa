"""HF config.json → model section, on the published Qwen3-0.6B and DeepSeek-V3 config.json values."""
import pytest

from mftk.config.hf import hf_to_model_section, model_section_from_hf
from mftk.config.model import (DeepseekV3ModelConfig, Qwen3ModelConfig, model_config_from_dict,
                               model_problems)
from mftk.errors import ConfigError
from mftk.plan.flops import param_counts
from tests.helpers.hf_configs import DEEPSEEK_V3, QWEN3_0_6B


def test_qwen3_section_values_and_validity():
    sec = model_section_from_hf(QWEN3_0_6B, seq_length=2048)
    assert list(sec)[:2] == ["model_type", "architectures"]
    assert sec["architectures"] == "Qwen3ForCausalLM"  # list → string
    assert sec["hidden_size"] == 1024 and sec["num_key_value_heads"] == 8 and sec["head_dim"] == 128
    assert sec["rope_theta"] == 1000000 and sec["tie_word_embeddings"] is True
    assert sec["hidden_dropout"] == 0.0 and sec["seq_length"] == 2048
    for dropped in ("torch_dtype", "use_cache", "sliding_window", "max_window_layers", "transformers_version"):
        assert dropped not in sec
    cfg, problems = model_config_from_dict(sec)
    assert isinstance(cfg, Qwen3ModelConfig) and problems == []
    assert model_problems(cfg) == []
    assert param_counts(cfg)[0] == 596_049_920  # models.md §3.2


def test_deepseek_section_adds_required_keys():
    sec, notes = hf_to_model_section(DEEPSEEK_V3)
    assert sec["moe_grouped_gemm"] is True and sec["qk_layernorm"] is True
    assert sec["mtp_loss_scaling_factor"] == 0.3
    assert sec["moe_aux_loss_coeff"] == 0.001 and sec["moe_router_load_balancing_type"] == "seq_aux_loss"
    assert sec["moe_router_score_function"] == "sigmoid"
    assert sec["position_embedding_type"] == "yarn" and sec["rope_scaling"]["factor"] == 40
    for dropped in ("quantization_config", "auto_map", "ep_size", "scoring_func", "topk_method", "pretraining_tp"):
        assert dropped not in sec
        assert any(p.path == f"model.{dropped}" for p in notes), dropped
    cfg, problems = model_config_from_dict(sec)
    assert isinstance(cfg, DeepseekV3ModelConfig) and problems == []
    assert model_problems(cfg) == []
    rp = cfg.rope_params()
    assert rp.original_max_position_embeddings == 4096  # HF-exact YaRN (models.md §1.7)
    assert rp.factor == 40 and rp.rotary_mscale == 1.0
    # softmax scale (0.1·ln40 + 1)² / √192, models.md §1.6
    assert cfg.mla_softmax_scale() == pytest.approx(0.135234, abs=1e-6)


def test_no_mtp_no_factor():
    sec = model_section_from_hf({**DEEPSEEK_V3, "num_nextn_predict_layers": 0})
    assert "mtp_loss_scaling_factor" not in sec


def test_unknown_hf_key_is_reported_not_silently_kept():
    sec, notes = hf_to_model_section({**QWEN3_0_6B, "rope_flavour": "x"})
    assert "rope_flavour" not in sec
    assert [p.severity for p in notes if p.path == "model.rope_flavour"] == ["warning"]


@pytest.mark.parametrize("bad", [{"model_type": "llama"}, {}, {"model_type": ["qwen3"]}])
def test_unsupported_model_type(bad):
    with pytest.raises(ConfigError) as e:
        model_section_from_hf(bad)
    assert "model_type" in e.value.message


def test_yaml_round_trip(tmp_path):
    import json

    import yaml

    from mftk.config.hf import model_section_yaml, read_hf_config
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    sec = model_section_from_hf(read_hf_config(tmp_path))  # a directory works too
    text = model_section_yaml(sec)
    assert text.startswith("model:\n  model_type: deepseek_v3\n  architectures: DeepseekV3ForCausalLM\n"
                           "  seq_length: 4096\n  vocab_size: 129280\n")
    assert yaml.safe_load(text)["model"] == sec  # floats such as 1e-06 survive YAML 1.1


def test_read_hf_config_errors(tmp_path):
    from mftk.config.hf import read_hf_config
    from mftk.errors import DataFormatError, InputError
    with pytest.raises(InputError):
        read_hf_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "qwen3",\n oops}')
    with pytest.raises(DataFormatError) as e:
        read_hf_config(bad)
    assert e.value.line == 2
    bad.write_text("[1, 2]")
    with pytest.raises(DataFormatError):
        read_hf_config(bad)
