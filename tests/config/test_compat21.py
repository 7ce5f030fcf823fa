"""MindSpore Transformers 2.1.0 PyNative YAMLs (issue 19): each shape the reference accepts, one test each.

Expected values come from the reference's documented rules (mindformers-2.1.md §1), not from mftk output.
"""
from __future__ import annotations

import pytest

from mftk.errors import ConfigError
from tests.helpers.config import template_dict as tiny
from tests.helpers.config import load_dict as load


def errors_of(data: dict, **kw) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load(data, **kw)
    return {p.path: p.message + " — " + p.hint for p in info.value.problems if p.severity == "error"}


def notes_of(loaded, severity: str) -> dict[str, str]:
    return {p.path: p.message for p in loaded.notes if p.severity == severity}


def mindrecord_loader(files) -> dict:
    data = tiny()
    data["train_dataset"]["dataloader"] = {"type": "MindDataset", "dataset_files": files,
                                           "column_names": ["input_ids", "labels"]}
    return data


# ------------------------------------------------------------------ data paths (§1.9)

def test_dataset_files_as_one_string_is_a_one_entry_list(tmp_path):
    d = tmp_path / "shards"
    (d / "sub").mkdir(parents=True)
    for name in ("b.mindrecord", "sub/a.mindrecord"):
        (d / name).write_bytes(b"")
    loaded = load(mindrecord_loader(str(d)), check_files=True)
    assert loaded.config.train_dataset.dataloader.dataset_files == [str(d)]
    note = notes_of(loaded, "note")["train_dataset.dataloader.dataset_files[0]"]
    assert "sorted path order" in note and "os.walk order, which is not sorted" in note


def test_dataset_files_directory_without_mindrecord_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    found = errors_of(mindrecord_loader(str(tmp_path / "empty")), check_files=True)
    assert "no .mindrecord file under directory" in found["train_dataset.dataloader.dataset_files[0]"]


def test_unquoted_numeric_weights_reach_the_data_code_as_the_reference_strings():
    data = tiny()
    data["train_dataset"]["dataloader"]["config"]["data_path"] = [0.3, "/a", 0.7, "/b", 1, "/c"]
    loaded = load(data)
    # the reference float()-parses each weight (§1.9): the canonical form is its text, same as quoting it
    assert loaded.config.dataset.data_path == ["0.3", "/a", "0.7", "/b", "1", "/c"]
    from mftk.derive import parse_data_path

    blend = parse_data_path(loaded.config.dataset.data_path)
    assert blend.prefixes == ("/a", "/b", "/c") and blend.weights == (0.3, 0.7, 1.0)


def test_data_path_as_a_bare_string_is_refused_with_the_reason():
    data = tiny()
    data["train_dataset"]["dataloader"]["config"]["data_path"] = "/data/wiki_text_document"
    found = errors_of(data)
    assert "character by character" in found["train_dataset.dataloader.config.data_path"]


def test_list_item_errors_name_the_index_not_a_python_object():
    data = tiny()
    data["train_dataset"]["dataloader"]["config"]["data_path"] = [True, "/a"]
    data["optimizer"]["betas"] = ["x", 0.95]
    with pytest.raises(ConfigError) as info:
        load(data)
    paths = {p.path for p in info.value.problems}
    assert "train_dataset.dataloader.config.data_path[0]" in paths and "optimizer.betas[0]" in paths
    assert not any("built-in method" in p.render() or "object at 0x" in p.render() for p in info.value.problems)


def test_accumulation_hint_says_2_1_refuses_it_too():
    data = tiny()
    data["training"]["global_batch_size"] = 6
    data["training"]["local_batch_size"] = 4
    hint = errors_of(data)["training.global_batch_size"]
    assert "2.1.0 refuses it too" in hint and "floors this silently" not in hint


# ------------------------------------------------------------------ recompute (§1.7)

def test_exclude_op_mapping_is_the_2_1_form():
    data = tiny()
    data["recompute"] = {"mode": "full", "full_recompute_layer": ["0-1"],
                         "exclude_op": {"*self_attention.linear_proj": ["0-1"], "*mlp": [1]}}
    loaded = load(data)
    assert loaded.config.recompute.exclude_op == {"*self_attention.linear_proj": ["0-1"], "*mlp": [1]}
    assert not [p for p in loaded.notes if p.path.startswith("recompute")]


def test_exclude_op_mapping_values_are_checked_against_the_layers():
    data = tiny()  # 2 layers: ids 0..1
    data["recompute"] = {"mode": "full", "full_recompute_layer": ["0-1"],
                         "exclude_op": {"*mlp": ["0-5"], " ": ["0"], "*attn": "0"}}
    found = errors_of(data)
    assert "layer 5 does not exist" in found["recompute.exclude_op.*mlp"]
    assert "non-blank" in found["recompute.exclude_op"]
    assert "non-empty list of layer ranges" in found["recompute.exclude_op.*attn"]


def test_exclude_op_old_list_form_warns_on_one_process_and_fails_on_more():
    data = tiny()
    data["recompute"] = {"mode": "full", "full_recompute_layer": ["0-1"], "exclude_op": ["matmul"]}
    warning = notes_of(load(data), "warning")["recompute.exclude_op"]
    assert "must be a dict (module path -> list of layer ranges)" in warning and "ignored on one process" in warning
    assert "must be a dict" in errors_of(data, world_size=2)["recompute.exclude_op"]


def test_integer_entries_in_full_recompute_layer():
    data = tiny()
    data["recompute"] = {"mode": "full", "full_recompute_layer": [0, "1"]}
    assert load(data).config.recompute.full_recompute_layer == ["0", "1"]  # normalised to strings, as the reference
    data["recompute"]["full_recompute_layer"] = [1, 0]
    assert "strictly ascending" in errors_of(data)["recompute.full_recompute_layer[1]"]


# ------------------------------------------------------------------ checkpoint LoRA keys (§1.2, §2.8)

def test_lora_checkpoint_keys_with_their_defaults_are_accepted():
    data = tiny()
    data["checkpoint"].update(save_trainable_only=False, base_load_path="")
    ck = load(data).config.checkpoint
    assert ck.save_trainable_only is False and ck.base_load_path == ""


def test_save_trainable_only_needs_base_load_path_and_is_refused_until_lora():
    data = tiny()
    data["checkpoint"]["save_trainable_only"] = True
    found = errors_of(data)
    assert "checkpoint.base_load_path is required when save_trainable_only is True." in found["checkpoint.base_load_path"]
    assert "LoRA support is pending" in found["checkpoint.save_trainable_only"]


def test_base_load_path_is_refused_until_lora():
    data = tiny()
    data["checkpoint"]["base_load_path"] = "/models/base"
    assert "LoRA support is pending" in errors_of(data)["checkpoint.base_load_path"]
    data["checkpoint"]["base_load_path"] = None  # the reference: a str field cannot be None
    assert "expected str, got null" in errors_of(data)["checkpoint.base_load_path"]


def test_lora_config_is_validated_as_2_1_does_then_refused():
    data = tiny()
    data["lora_config"] = {"target_modules": "(", "lora_rank": 0, "lora_alpha": 16, "lora_dropout": 1.0}
    found = errors_of(data)
    assert "not a valid regular expression" in found["lora_config.target_modules"]
    assert "must be > 0" in found["lora_config.lora_rank"]
    assert "[0, 1)" in found["lora_config.lora_dropout"]
    assert "LoRA support is pending" in found["lora_config"]


# ------------------------------------------------------------------ balance_enabled (§1.6)

def _balanced(eod_mask: bool = True) -> dict:
    data = tiny()
    data["train_dataset"]["balance_enabled"] = True
    data["train_dataset"]["dataloader"]["config"]["create_compressed_eod_mask"] = eod_mask
    return data


def test_balance_at_dp_1_is_the_reference_bypass():
    note = notes_of(load(_balanced()), "note")["train_dataset.balance_enabled"]
    assert "no effect at data parallel 1" in note


def test_balance_at_dp_above_1_is_implemented_and_refused_with_a_ramp():
    note = notes_of(load(_balanced(), world_size=2), "note")["train_dataset.balance_enabled"]
    assert "redistributed over the 2 data-parallel ranks" in note
    data = _balanced()
    data["training"]["rampup_batch_size"] = [4, 2, 32]
    assert "rampup_batch_size is not implemented" in errors_of(data, world_size=2)["train_dataset.balance_enabled"]


def test_balance_needs_the_compressed_eod_mode():
    assert "Data balancing requires the effective compressed-EOD mode." in \
        errors_of(_balanced(eod_mask=False))["train_dataset.balance_enabled"]
    data = _balanced()
    data["train_dataset"]["dataloader"]["config"]["create_seq_len_vector"] = True
    found = errors_of(data)
    assert "compressed-EOD" in found["train_dataset.balance_enabled"]
    assert "not implemented by mftk" in found["train_dataset.dataloader.config.create_seq_len_vector"]


def test_balance_with_mindrecord_is_refused_as_the_reference_does(tmp_path):
    data = mindrecord_loader([str(tmp_path / "x.mindrecord")])
    data["train_dataset"]["balance_enabled"] = True
    assert "dataloader type 'MindDataset' is not supported" in errors_of(data)["train_dataset.balance_enabled"]


# ------------------------------------------------------------------ run_mode and inference (§1.3)

def test_inference_section_in_a_train_run_is_a_note():
    data = tiny()
    data["run_mode"] = "train"
    data["inference"] = {"max_new_tokens": 20, "batch_size": 2, "output": "out.jsonl", "input_data": "Hello"}
    loaded = load(data)
    assert loaded.config.inference.max_new_tokens == 20 and loaded.config.run_mode == "train"
    assert "not used by mftk train" in notes_of(loaded, "note")["inference"]


def test_inference_values_follow_the_reference_rules():
    data = tiny()
    data["inference"] = {"max_new_tokens": 0, "batch_size": -1, "output": "out.csv", "unknown": 1}
    found = errors_of(data)
    assert "must be > 0" in found["inference.max_new_tokens"] and "must be > 0" in found["inference.batch_size"]
    assert "'.csv'" in found["inference.output"]
    assert found["inference.unknown"].startswith("unknown key")  # a strict section in the reference too


def test_run_mode_predict_is_refused_and_other_modes_use_the_reference_message():
    data = tiny()
    data["run_mode"] = "predict"
    found = errors_of(data)["run_mode"]
    assert "mftk does not run inference" in found and "requires an `inference:` section" in found
    data["run_mode"] = "finetune"
    assert "Invalid run mode: 'finetune'. Must be 'train' or 'predict'." in errors_of(data)["run_mode"]


def test_empty_inference_section_is_none_as_in_the_reference():
    data = tiny()
    data["inference"] = None
    assert load(data).config.inference is None


# ------------------------------------------------------------------ unknown top-level keys (§1.1)

def test_unknown_top_level_keys_are_accepted_and_each_named():
    data = tiny()
    data["my_notes"] = {"owner": "team-a"}
    data["experiment"] = "run-7"
    warnings = notes_of(load(data), "warning")
    assert "unknown top-level key; ignored" in warnings["my_notes"]
    assert "unknown top-level key; ignored" in warnings["experiment"]


def test_a_static_graph_key_in_a_pynative_yaml_names_its_pynative_home():
    data = tiny()
    data["seed"] = 7
    loaded = load(data)
    problem = next(p for p in loaded.notes if p.path == "seed")
    assert problem.severity == "warning" and "static-graph key" in problem.message
    assert problem.hint == "PyNative setting: training.seed"


def test_a_misspelt_section_is_still_an_error():
    data = tiny()
    data["checkpoints"] = {"save_max": 2}
    assert "did you mean 'checkpoint'?" in errors_of(data)["checkpoints"]


# ------------------------------------------------------------------ max_consecutive_skipped_steps (§1.4)

def test_max_consecutive_skipped_steps_zero_is_the_default_and_means_no_limit():
    data = tiny()
    data["training"]["use_skip_step_on_nan"] = True
    loaded = load(data)
    assert loaded.config.training.max_consecutive_skipped_steps == 0
    data["training"]["max_consecutive_skipped_steps"] = -1
    assert "must be >= 0, got -1." in errors_of(data)["training.max_consecutive_skipped_steps"]


def test_max_consecutive_without_skipping_says_mftk_stops():
    data = tiny()
    data["training"]["max_consecutive_skipped_steps"] = 3
    note = notes_of(load(data), "note")["training.max_consecutive_skipped_steps"]
    assert "stops mftk at once" in note and "applies it and continues" in note


# ------------------------------------------------------------------ static-graph configs: one line

def test_a_static_graph_config_is_named_in_one_line(tmp_path):
    from tests.config.static_yamls import write_static

    from mftk.config.load import load_config

    path = write_static(tmp_path, "deepseek3_671b")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [] and "\n" not in info.value.message
    assert "static-graph (GRAPH_MODE) config (model.model_config, parallel_config" in info.value.message
    assert f"mftk convert-config {path} -o " in info.value.message
