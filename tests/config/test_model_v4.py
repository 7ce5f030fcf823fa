"""DeepSeek-V4, Qwen3-MoE and Muon config sections: the four shipped DeepSeek-V4 YAMLs validate, every rule
reports its YAML path with the arithmetic, and the runnable-layout check refuses what is not implemented."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from mftk.config.load import load_data
from mftk.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = sorted((ROOT / "tests/config/fixtures/deepseek4").glob("*.yaml"))


def _raw(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


def _all(data: dict, world_size: int = 1) -> list:
    try:
        return load_data(copy.deepcopy(data), world_size=world_size, check_files=False).notes
    except ConfigError as exc:  # errors raise: collect them from the exception
        return exc.problems


def problems(data: dict, world_size: int = 1) -> dict[str, tuple[str, str]]:
    """path → (severity, message) of the problems that are not errors."""
    return {p.path: (p.severity, p.message) for p in _all(data, world_size) if p.severity != "error"}


def errors(data: dict, world_size: int = 1) -> dict[str, str]:
    return {p.path: p.message for p in _all(data, world_size) if p.severity == "error"}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_shipped_deepseek_v4_yamls_validate(path):
    """Every key validates as shipped (data_parallel_shard -1, expert_parallel 8, Muon) at world size 8, the
    smallest their expert_parallel allows (EP is carved out of dp_shard), and 8 is the most their
    global_batch_size 8 allows (dp ≤ 8); train runs V4 under EP × FSDP with Muon
    (tests/commands/test_train_v4_expert_parallel.py)."""
    data = yaml.safe_load(path.read_text())
    assert data["parallelism"]["expert_parallel"] == 8 and data["optimizer"]["type"] == "Muon"
    assert errors(data, world_size=8) == {}
    assert set(errors(data, world_size=4)) == {"parallelism.expert_parallel"}  # the refusal is real: 8 ∤ 4
    found = problems(data, world_size=8)
    assert found["optimizer.qk_clip_enabled"][0] == "note"  # no effect for V4, as in the reference
    loaded = load_data(copy.deepcopy(data), world_size=8, check_files=False)
    m = loaded.config.model
    assert m.mtp_loss_scaling_factor == 0.3 and m.topk_group == 0 and m.num_residual_streams == 4
    assert len(m.compress_ratios) == m.num_hidden_layers + 1 and m.compress_ratios[-1] == 0
    assert loaded.config.optimizer.type == "Muon"


def _tiny_v4() -> dict:
    return _raw("templates/deepseek_v4_tiny.yaml")


@pytest.mark.parametrize("change,path,fragment", [
    ({"compress_ratios": None}, "model.compress_ratios", "required"),
    ({"compress_ratios": [0, 4, 16]}, "model.compress_ratios", "3 + 1 = 4"),
    ({"compress_ratios": [0, 2, 16, 0]}, "model.compress_ratios", "got [2]"),
    ({"v_head_dim": 8}, "model.qk_rope_head_dim", "must be < 8"),
    ({"mhc_sinkhorn_iterations": -1}, "model.mhc_sinkhorn_iterations", "must be >= 0"),
    ({"o_groups": 3}, "model.o_groups", "128 % 3 = 2"),
    ({"qk_layernorm": False}, "model.qk_layernorm", "must be true"),
    ({"num_hash_layers": 4}, "model.num_hash_layers", "[0, num_hidden_layers = 3]"),
    ({"apply_dsa_kernel_fusion": True}, "model.apply_dsa_kernel_fusion", "csa_window_size 128"),
    ({"rope_scaling": {"type": "yarn", "factor": 4}}, "model.rope_scaling", "not read for DeepSeek-V4"),
    ({"index_head_dim": 4}, "model.index_head_dim", "must be >= 8"),
    ({"num_nextn_predict_layers": 2, "compress_ratios": [0, 4, 16, 0, 0]}, "model.num_nextn_predict_layers", "0 or 1"),
    ({"experimental_attention_variant": "dsa"}, "model.experimental_attention_variant", "dsv4_hybrid"),
    ({"experimental_attention_variant": "mla", "v_head_dim": 40}, "model.v_head_dim",
     "qk_nope_head_dim + qk_rope_head_dim = 24 + 8 = 32"),
    ({"experimental_attention_variant": "mla", "kv_lora_rank": 0}, "model.kv_lora_rank", "must be > 0"),
    ({"activation_func_clamp_value": -1.0}, "model.activation_func_clamp_value", "must be > 0"),
])
def test_deepseek_v4_rules(change, path, fragment):
    data = _tiny_v4()
    data["model"].update(change)
    found = errors(data)
    assert path in found and fragment in found[path], found


def test_deepseek_v4_legacy_mla_variant_is_accepted_with_its_meaning():
    """``mla`` (mindformers 2.1.0 gpt_layer_specs.py: no variant → plain MLASelfAttention): accepted with a note
    naming the hybrid-attention keys it leaves unread; a value head narrower than the query head is accepted
    (zero-padded by the reference), and compress_ratios is not checked (no compressed layers)."""
    data = _tiny_v4()
    data["model"].update({"experimental_attention_variant": "mla", "kv_lora_rank": 16, "v_head_dim": 16,
                          "compress_ratios": None})
    assert errors(data) == {}
    severity, message = problems(data)["model.experimental_attention_variant"]
    assert severity == "note" and "DeepSeek-V3's MLA attention" in message and "o_groups" in message


def test_deepseek_v4_aliases_and_notes():
    data = _tiny_v4()
    data["model"]["sliding_window"] = 64  # the HF name of csa_window_size, with another value
    assert "different values" in errors(data)["model.sliding_window"]
    data = _tiny_v4()
    found = problems(data)
    assert found["model.compress_ratios"][0] == "note" and "mftk extension" in found["model.compress_ratios"][1]
    data["model"]["compress_ratios"] = [0, 4, 128, 0]
    assert "model.compress_ratios" not in problems(data)


@pytest.mark.parametrize("change,path,fragment", [
    ({"ns_coefficients": [[[1.0, 2.0, 3.0], 0]]}, "optimizer.ns_coefficients", "step count must be > 0"),
    ({"ns_coefficients": [1.0, 2.0]}, "optimizer.ns_coefficients", "exactly three"),
    ({"ns_steps": 0, "ns_coefficients": [1.0, 2.0, 3.0]}, "optimizer.ns_coefficients", "ns_steps must be > 0"),
    ({"qk_clip_threshold": 0.0, "qk_clip_enabled": True}, "optimizer.qk_clip_threshold", "must be > 0"),
    ({"comm_strategy": "alltoall"}, "optimizer.comm_strategy", "not one of"),
    ({"swap": True}, "optimizer.swap", "Muon does not support"),
    ({"ns_batch_memory_gb": 0}, "optimizer.ns_batch_memory_gb", "must be > 0"),
    ({"momentum": 1.0}, "optimizer.momentum", "[0, 1)"),
    ({"adamw_betas": [0.9]}, "optimizer.adamw_betas", "two values"),
])
def test_muon_rules(change, path, fragment):
    data = _tiny_v4()
    data["optimizer"].update(change)
    found = errors(data)
    assert path in found and fragment in found[path], found


def test_muon_keys_in_an_adamw_section_and_qk_clip_on_qwen3_warn():
    data = _raw("templates/qwen3_tiny.yaml")
    data["optimizer"]["momentum"] = 0.9
    assert problems(data)["optimizer.momentum"] == ("warning", "only read by Muon; optimizer.type is AdamW")
    data["optimizer"] = {"type": "Muon", "qk_clip_enabled": True}
    severity, message = problems(data)["optimizer.qk_clip_enabled"]
    assert severity == "warning" and "no effect for qwen3" in message


@pytest.mark.parametrize("change,path,fragment", [
    ({"mlp_only_layers": [5]}, "model.mlp_only_layers", "outside 0..2"),
    ({"use_sliding_window": True}, "model.use_sliding_window", "not implemented"),
    ({"num_experts_per_tok": 9}, "model.num_experts_per_tok", "exceeds num_experts 8"),
    ({"num_key_value_heads": 3}, "model.num_key_value_heads", "4 % 3 = 1"),
])
def test_qwen3_moe_rules(change, path, fragment):
    data = _raw("templates/qwen3_moe_tiny.yaml")
    data["model"].update(change)
    found = errors(data)
    assert path in found and fragment in found[path], found


def test_qwen3_moe_pattern_and_hf_names():
    from mftk.config.model import Qwen3MoeModelConfig, model_config_from_dict

    cfg, notes = model_config_from_dict({"model_type": "qwen3_moe", "num_hidden_layers": 6, "decoder_sparse_step": 2,
                                         "mlp_only_layers": [3], "num_local_experts": 16, "router_aux_loss_coef": 0.01})
    assert isinstance(cfg, Qwen3MoeModelConfig) and cfg.num_experts == 16 and cfg.n_routed_experts == 16
    assert cfg.moe_layer_pattern() == [False, True, False, False, False, True]
    assert {p.path: p.severity for p in notes}["model.router_aux_loss_coef"] == "note"


@pytest.mark.parametrize("template,parallel,fragment", [
    ("deepseek_v4_tiny.yaml", {"context_parallel": 2, "context_parallel_method": "ulysses"},
     "head all-to-all does not apply"),
])
def test_unimplemented_layouts_are_refused(template, parallel, fragment):
    """What the engine has no plan for is refused when the config is loaded at the world size (what
    validate-config, plan-parallel and train all apply: `config.runnable`), at the key's YAML path."""
    data = _raw(f"templates/{template}")
    if parallel.pop("_muon", False):
        data["optimizer"] = {"type": "Muon", "qk_clip_enabled": False}
    data["parallelism"].update(parallel)
    world = max(2, parallel.get("pipeline_parallel", 1))
    with pytest.raises(ConfigError) as e:
        load_data(data, world_size=world, check_files=False)
    hits = [p for p in e.value.problems if fragment in p.message]
    assert hits and all(p.path.startswith("parallelism.") for p in hits), [p.message for p in e.value.problems]


def test_muon_qk_clip_with_fsdp_is_refused_but_plain_dp_runs():
    from mftk.config.runnable import runnable_layout

    data = _raw("templates/deepseek_v3_tiny.yaml")
    data["optimizer"] = {"type": "Muon"}  # qk_clip_enabled defaults to true: active on MLA
    assert "QK-clip with FSDP" in errors(data, world_size=2)["optimizer.qk_clip_enabled"]
    data["parallelism"]["data_parallel_shard"] = 1
    assert runnable_layout(load_data(data, world_size=2, check_files=False), 2).dp == 2


def test_deepseek_v4_pipeline_layouts_are_runnable():
    """Pipeline stages pass the hyper-connection streams (tests/commands/test_train_v4_pipeline.py)."""
    data = _tiny_v4()
    data["parallelism"].update({"pipeline_parallel": 2, "data_parallel_shard": 1,
                                "pipeline_parallel_layers_per_stage": ["0-1", "2"]})
    assert errors(data, world_size=2) == {}
