"""mftk-only settings live under the top-level `mftk:` section (issue 19), so one YAML serves both tools.

The reference rejects unknown keys inside its strict sections and ignores unknown top-level sections
(mindformers-2.1.md §1.1). The field lists below are the reference's own (mindformers-pynative.md §1.3 plus
the 2.1.0 delta, mindformers-2.1.md §1.2, §1.3), written out by hand: a key mftk adds to one of these
sections makes this test fail.
"""
from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import yaml

from mftk.config import sections as S
from mftk.config.load import load_data
from mftk.errors import ConfigError
from tests.helpers.config import template_dict as tiny

ROOT = Path(__file__).resolve().parents[2]

REFERENCE_STRICT_FIELDS = {
    S.CheckpointConfig: """enable_save save_path save_max save_interleaved_steps no_save_optim async_save prefix
        remove_redundancy load_path load_balanced no_load_optim load_worker_number save_global_layout_cache
        reshard_worker_num save_trainable_only base_load_path""",
    S.TrainingConfig: """steps local_batch_size global_batch_size max_norm seed deterministic rampup_batch_size
        use_skip_step_on_nan max_consecutive_skipped_steps""",
    S.ParallelismConfig: """data_parallel_shard data_parallel_shard_strategy reshard_after_forward_policy cpu_offload
        disable_gradient_division dense_fsdp_shard_size tensor_parallel context_parallel context_parallel_method
        context_parallel_async ulysses_degree_in_cp context_parallel_mask_type pipeline_parallel
        pipeline_parallel_layers_per_stage pipeline_parallel_schedule pipeline_parallel_microbatch_size
        pipeline_parallel_interleave_num pipeline_parallel_overlap_p2p pipeline_parallel_overlap_b_f
        pipeline_parallel_enable_dxdw_split pipeline_parallel_p2p_transport sequence_parallel enable_mc2
        enable_loss_parallel expert_parallel npu_nums_per_device moe_token_dispatcher_type expert_parallel_async_d2h
        expert_parallel_use_safe_tokens""",
    S.TrainDatasetConfig: """dataloader drop_remainder num_parallel_workers prefetch_size numa_enable
        use_distribute_dataset balance_enabled""",
    S.HealthCheckpointConfig: "embedding_local_norm_threshold global_norm_skip_threshold global_norm_skip_time",
    S.TrainStateConfig: "local_norm local_loss device_norm device_loss",
    S.TensorboardConfig: "output_dir log_interval queue_size",
    S.MoeMonitorConfig: "save_tokens_per_expert_interval target_layers",
    S.MonitorConfig: "health_checkpoint train_state tensorboard moe_monitor",
    S.ContextConfig: "mode max_device_memory device_target",
    S.ProfilerConfig: """enable_profiling start_step end_step output_path profiler_rank profiler_level mstx
        profile_memory profile_cpu with_stack""",
    S.RecomputeConfig: "mode full_recompute_layer select_module exclude_op",
    S.RecomputeCommConfig: "enable select_module",
    S.SwapConfig: "enable default_prefetch layer_swap op_swap",
    S.LoraConfig: "target_modules exclude_layers lora_rank lora_alpha lora_dropout lora_a_std lora_b_std",
    S.InferenceConfig: "max_new_tokens batch_size output input_data",
}
REFERENCE_TOP_LEVEL = """checkpoint training parallelism optimizer lr_scheduler train_dataset model monitor context
    profiler recompute recompute_comm swap callbacks lora_config run_mode inference"""


@pytest.mark.parametrize("cls", list(REFERENCE_STRICT_FIELDS), ids=lambda c: c.__name__)
def test_strict_sections_hold_only_the_reference_keys(cls):
    assert set(attrs.fields_dict(cls)) == set(REFERENCE_STRICT_FIELDS[cls].split())


def test_the_only_top_level_addition_is_the_mftk_section():
    assert set(attrs.fields_dict(S.Config)) - set(REFERENCE_TOP_LEVEL.split()) == {"mftk"}


def test_mftk_section_is_read_through_the_config_model():
    data = tiny()
    data["mftk"] = {"low_priority_dispatch": False}
    loaded = load_data(data, check_files=False)
    assert loaded.config.mftk.low_priority_dispatch is False
    assert not [p for p in loaded.notes if "mftk" in p.path]
    assert load_data(tiny(), check_files=False).config.mftk.low_priority_dispatch is None  # the default: auto


def test_unknown_key_in_mftk_section_is_an_error():
    data = tiny()
    data["mftk"] = {"low_priority_dispach": True}
    with pytest.raises(ConfigError) as info:
        load_data(data, check_files=False)
    problem = next(p for p in info.value.problems if p.path == "mftk.low_priority_dispach")
    assert problem.message == "unknown key" and "low_priority_dispatch" in problem.hint


def test_old_spelling_of_low_priority_dispatch_still_works_with_a_deprecation_note():
    data = tiny()
    data["training"]["low_priority_dispatch"] = True
    loaded = load_data(data, check_files=False)
    assert loaded.config.mftk.low_priority_dispatch is True
    note = next(p for p in loaded.notes if p.path == "training.low_priority_dispatch")
    assert note.severity == "warning" and "deprecated spelling: read as `mftk.low_priority_dispatch`" in note.message
    assert loaded.raw["mftk"] == {"low_priority_dispatch": True} and "low_priority_dispatch" not in loaded.raw["training"]


def test_old_spelling_through_an_override_too():
    loaded = load_data(tiny(), overrides=["training.low_priority_dispatch=false"], check_files=False)
    assert loaded.config.mftk.low_priority_dispatch is False


def test_old_and_new_spelling_disagreeing_is_an_error():
    data = tiny()
    data["training"]["low_priority_dispatch"] = True
    data["mftk"] = {"low_priority_dispatch": False}
    with pytest.raises(ConfigError) as info:
        load_data(data, check_files=False)
    assert "also set" in next(p for p in info.value.problems if p.path == "training.low_priority_dispatch").message


def test_input_columns_is_read_as_the_reference_column_names():
    data = tiny()
    del data["train_dataset"]["dataloader"]["column_names"]
    data["train_dataset"]["input_columns"] = ["input_ids", "labels", "loss_mask"]
    loaded = load_data(data, check_files=False)
    assert loaded.config.model_columns == ("input_ids", "labels", "loss_mask")
    note = next(p for p in loaded.notes if p.path == "train_dataset.input_columns")
    assert "read as `train_dataset.dataloader.column_names`" in note.message


def test_input_columns_conflicting_with_column_names_is_an_error():
    data = tiny()  # column_names: [input_ids, labels, loss_mask, position_ids]
    data["train_dataset"]["input_columns"] = ["input_ids", "labels"]
    with pytest.raises(ConfigError) as info:
        load_data(data, check_files=False)
    assert any(p.path == "train_dataset.input_columns" and "also set" in p.message for p in info.value.problems)


def test_templates_hold_no_mftk_only_key_in_a_reference_section():
    for path in sorted((ROOT / "templates").glob("*.yaml")):
        loaded = load_data(yaml.safe_load(path.read_text()), check_files=False, world_size=1)
        assert not [p for p in loaded.notes if "deprecated spelling" in p.message], path.name
