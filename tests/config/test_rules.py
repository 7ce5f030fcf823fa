"""Cross-field rules: each one fires with its arithmetic shown, and stays quiet when satisfied."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mftk.config.load import load_data
from mftk.derive import parse_layer_range
from mftk.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def tiny(name: str = "qwen3_tiny") -> dict:
    return yaml.safe_load((ROOT / "templates" / f"{name}.yaml").read_text())


def errors(data: dict, world_size: int = 1, check_files: bool = False) -> dict[str, str]:
    try:
        load_data(data, world_size=world_size, check_files=check_files)
    except ConfigError as exc:
        return {p.path: p.message for p in exc.problems if p.severity == "error"}
    return {}


def test_templates_are_valid_for_one_two_and_four_workers():
    for name in ("qwen3_tiny", "deepseek_v3_tiny"):
        for world in (1, 2, 4):
            assert errors(tiny(name), world_size=world) == {}, (name, world)


@pytest.mark.parametrize("field", ["local_batch_size", "global_batch_size"])
@pytest.mark.parametrize("value", [0, -2])
def test_non_positive_batch_sizes(field, value):
    data = tiny()
    data["training"][field] = value
    assert "must be positive" in errors(data)[f"training.{field}"]


def test_non_dividing_batch_shows_arithmetic():
    data = tiny()
    data["training"]["global_batch_size"] = 6
    msg = errors(data, world_size=4)["training.global_batch_size"]
    assert "6 / (4·1)" in msg and "not a whole number" in msg


def test_tp_without_sp():
    data = tiny()
    data["parallelism"]["tensor_parallel"] = 2
    assert "requires sequence_parallel" in errors(data, world_size=2)["parallelism.sequence_parallel"]
    data["parallelism"]["sequence_parallel"] = True
    assert errors(data, world_size=2) == {}


def test_degrees_larger_than_world_and_product_mismatch():
    data = tiny()
    data["parallelism"].update(tensor_parallel=2, sequence_parallel=True)
    assert "tp·pp·cp must be ≤ world size" in errors(data, world_size=1)["parallelism"]
    # world 3 with tp 2: dp = 1 and 1·1·1·2·1 = 2 ≠ 3
    msg = errors(data, world_size=3)["parallelism"]
    assert "= 2 ≠ world size 3" in msg


def test_heads_and_kv_heads_divisible_by_tp():
    data = tiny()
    data["parallelism"].update(tensor_parallel=4, sequence_parallel=True)
    data["model"]["num_key_value_heads"] = 2
    msg = errors(data, world_size=4)["parallelism.tensor_parallel"]
    assert "num_key_value_heads % tp = 2 % 4 = 2" in msg


def test_layers_divisible_by_pp_and_explicit_stage_list():
    data = tiny()
    data["model"]["num_hidden_layers"] = 3
    data["parallelism"]["pipeline_parallel"] = 2
    assert "3 % (2·1) = 1" in errors(data, world_size=2)["parallelism.pipeline_parallel_layers_per_stage"]
    data["parallelism"]["pipeline_parallel_layers_per_stage"] = ["0-1", "2"]
    assert errors(data, world_size=2) == {}
    data["parallelism"]["pipeline_parallel_layers_per_stage"] = ["0", "2"]
    assert "exactly once" in errors(data, world_size=2)["parallelism.pipeline_parallel_layers_per_stage"]
    data["parallelism"]["pipeline_parallel_layers_per_stage"] = ["0-1", "x"]
    assert "parallelism.pipeline_parallel_layers_per_stage[1]" in errors(data, world_size=2)


def test_experts_and_ep():
    data = tiny("deepseek_v3_tiny")
    data["parallelism"]["expert_parallel"] = 3
    found = errors(data, world_size=2)
    assert "8 % 3 = 2" in found["parallelism.expert_parallel"] or "must divide" in found["parallelism.expert_parallel"]
    data["parallelism"]["expert_parallel"] = 4
    assert "dp_shard·cp·tp = 2·1·1 = 2" in errors(data, world_size=2)["parallelism.expert_parallel"]
    data["parallelism"]["expert_parallel"] = 2
    assert errors(data, world_size=2) == {}


def test_seq_length_divisible_by_cp_load_balanced():
    data = tiny()
    for section in (data["model"], data["train_dataset"]["dataloader"]["config"]):
        section["seq_length"] = 130
    data["parallelism"]["context_parallel"] = 2
    assert "130 % 4 = 2" in errors(data, world_size=2)["parallelism.context_parallel"]


def test_model_and_data_seq_length_must_match():
    data = tiny()
    data["train_dataset"]["dataloader"]["config"]["seq_length"] = 64
    assert "64 ≠ model.seq_length 128" in errors(data)["train_dataset.dataloader.config.seq_length"]


def test_data_path_rules(tmp_path):
    data = tiny()
    cfg = data["train_dataset"]["dataloader"]["config"]
    cfg["data_path"] = ["0.5", "a", "0.5"]
    assert "even length" in errors(data)["train_dataset.dataloader.config.data_path"]
    cfg["data_path"] = ["0", "a", "0", "b"]
    assert "must be a number > 0" in errors(data)["train_dataset.dataloader.config.data_path[0]"]
    cfg["data_path"] = ["-1", "a", "2", "b"]
    assert "must be a number > 0" in errors(data)["train_dataset.dataloader.config.data_path[0]"]
    cfg["data_path"] = ["1", str(tmp_path / "missing")]
    assert ".bin" in errors(data, check_files=True)["train_dataset.dataloader.config.data_path"]
    (tmp_path / "present.bin").write_bytes(b"")
    (tmp_path / "present.idx").write_bytes(b"")
    cfg["data_path"] = [str(tmp_path / "present")]
    assert errors(data, check_files=True) == {}
    del cfg["split"]
    assert "required when data_path" in errors(data)["train_dataset.dataloader.config.split"]


def test_missing_data_is_an_error_unless_mock():
    data = tiny()
    del data["train_dataset"]["dataloader"]["config"]["data_path"]
    assert "no data" in errors(data)["train_dataset.dataloader.config.data_path"]
    data["train_dataset"]["dataloader"]["config"]["mock"] = True
    assert errors(data) == {}


def test_split_must_parse():
    data = tiny()
    data["train_dataset"]["dataloader"]["config"]["split"] = "a, b"
    assert "does not parse" in errors(data)["train_dataset.dataloader.config.split"]
    data["train_dataset"]["dataloader"]["config"]["split"] = "0, 0, 0"
    assert "sums to 0" in errors(data)["train_dataset.dataloader.config.split"]


def test_save_path_required_when_saving():
    data = tiny()
    data["checkpoint"]["save_path"] = ""
    assert "required" in errors(data)["checkpoint.save_path"]
    data["checkpoint"]["enable_save"] = False
    assert errors(data) == {}


def test_lr_schedule_arguments():
    data = tiny()
    data["lr_scheduler"] = {"type": "ConstantWarmUpLR", "learning_rate": 1.0e-3}
    assert "needs warmup_steps or warmup_ratio" in errors(data)["lr_scheduler.warmup_steps"]
    data["lr_scheduler"] = {"type": "CosineWithWarmUpLR", "warmup_ratio": 1.5}
    assert "[0, 1]" in errors(data)["lr_scheduler.warmup_ratio"]
    data["lr_scheduler"] = {"type": "NoSuchLR"}
    assert "unknown schedule" in errors(data)["lr_scheduler.type"]
    data["lr_scheduler"] = {"type": "WarmUpStableDecayLR", "learning_rate": 1.0e-8, "warmup_steps": 0}
    assert "must be < learning_rate" in errors(data)["lr_scheduler.lr_end"]


def test_rampup_rules():
    data = tiny()
    data["training"]["rampup_batch_size"] = [2, 4]
    assert "3" in errors(data)["training.rampup_batch_size"]
    data["training"]["rampup_batch_size"] = [2, 4, 100]     # (8-2) % 4 = 2
    assert "(8 − 2) % 4 = 2" in errors(data)["training.rampup_batch_size"]
    data["training"]["rampup_batch_size"] = [4, 2, 100]
    assert errors(data) == {}
    data["training"]["rampup_batch_size"] = [2, 2, 100]      # start 2 not divisible by dp·lbs = 4
    assert "divisible" in errors(data, world_size=4)["training.rampup_batch_size"]


def test_recompute_and_swap_grammar():
    data = tiny()
    data["recompute"] = {"mode": "full"}
    assert "required" in errors(data)["recompute.full_recompute_layer"]
    data["recompute"] = {"mode": "full", "full_recompute_layer": ["1", "0"]}
    assert "ascending" in errors(data)["recompute.full_recompute_layer[1]"]
    data["recompute"] = {"mode": "full", "full_recompute_layer": ["0-5"]}
    assert "does not exist" in errors(data)["recompute.full_recompute_layer"]
    data["recompute"] = {"mode": "sometimes"}
    assert "not one of" in errors(data)["recompute.mode"]
    data["recompute"] = {"mode": "None"}
    data["swap"] = {"enable": True, "default_prefetch": 5, "layer_swap": [{"op": 1}]}
    found = errors(data)
    assert "[1, 1]" in found["swap.default_prefetch"] and "layers" in found["swap.layer_swap[0]"]


def test_swap_and_the_recompute_forms_mftk_does_not_build_are_refused():
    """swap is never accepted and ignored; dropout is refused where recompute applies (world > 1); exclude_op (the
    2.1 mapping) is accepted there, with a note without a mode."""
    data = tiny()
    data["swap"] = {"enable": True}
    assert "not built" in errors(data)["swap.enable"] and "host memory" in errors(data)["swap.enable"]
    data = tiny()
    data["recompute"] = {"mode": "full", "full_recompute_layer": ["0-1"], "exclude_op": {"*linear_proj": ["0"]}}
    assert "exclude_op" not in errors(data)  # one process: recompute is not applied (a note says so)
    assert errors(data, world_size=2) == {}  # applied: the excluded cells keep their outputs (engine.recompute)
    data["recompute"] = {"mode": "None", "exclude_op": {"*linear_proj": ["0"]}}
    assert errors(data, world_size=2) == {}
    noted = {p.path: p.message for p in load_data(data, world_size=2, check_files=False).notes}
    assert "no effect while recompute.mode is None" in noted["recompute.exclude_op"]
    data = tiny()
    data["recompute"] = {"mode": "full", "full_recompute_layer": ["0-1"]}
    assert errors(data, world_size=2) == {}
    data["model"]["hidden_dropout"] = 0.1
    data["parallelism"]["data_parallel_shard"] = 1
    assert "dropout masks" in errors(data, world_size=2)["recompute.mode"]
    data["recompute"] = {"mode": "None"}
    data["parallelism"]["data_parallel_shard"] = -1  # FSDP over both workers: its units run their forward once
    assert errors(data, world_size=2) == {}


def test_max_norm_zero_is_a_note_not_an_error():
    data = tiny()
    data["training"]["max_norm"] = 0.0
    loaded = load_data(data, check_files=False)
    assert any(p.path == "training.max_norm" and p.severity == "note" for p in loaded.notes)


@pytest.mark.parametrize("text,expected", [("3", [3]), ("2-4", [2, 3, 4]), (" 1 - 2 ", [1, 2]),
                                           ("4-2", None), ("a", None), ("1-2-3", None)])
def test_parse_layer_range(text, expected):
    assert parse_layer_range(text) == expected


def test_quick_start_example_validates():
    data = yaml.safe_load((ROOT / "tests/config/fixtures/pynative_ds3.yaml").read_text())
    assert errors(data, world_size=2) == {}


_DL = "train_dataset.dataloader"


@pytest.mark.parametrize("change, path, match", [
    (lambda d: d.update(sizes=None), f"{_DL}.sizes", "required"),
    (lambda d: d.update(sizes=[0, 0, 0]), f"{_DL}.sizes", "positive train count"),
    (lambda d: d.update(sizes=[1, 0, 0]), f"{_DL}.sizes", "< global_batch_size"),
    (lambda d: d.update(type="HFDataLoader"), f"{_DL}.type", "not supported by mftk"),
    (lambda d: d.update(type="Bert"), f"{_DL}.type", "unknown dataloader type"),
    (lambda d: d.update(datasets_type="BertDataset"), f"{_DL}.datasets_type", "must be 'GPTDataset'"),
    (lambda d: d["config"].update(seq_length=0), f"{_DL}.config.seq_length", "required: a positive integer"),
    (lambda d: d["config"].update(split="0, 1, 0"), f"{_DL}.config.split", "training split no data"),
    (lambda d: d["config"].update(split="1 ; x"), f"{_DL}.config.split", "does not parse"),
    (lambda d: d["config"].update(data_path=["-1", "corpA"]), f"{_DL}.config.data_path[0]", "must be a number > 0"),
    (lambda d: d["config"].update(data_path=["0", "a", "1", "b"]), f"{_DL}.config.data_path[0]", "weight '0' of a"),
    (lambda d: d["config"].update(data_path=["0.5", "a", "b", "c"]), f"{_DL}.config.data_path[2]", "mixes weights"),
    (lambda d: d["config"].update(train_data_path=["corpA"]), f"{_DL}.config.train_data_path", "cannot be combined"),
    (lambda d: d["config"].update(data_path=None), f"{_DL}.config.data_path", "no data: data_path is missing"),
    (lambda d: d["config"].update(mock=True), f"{_DL}.config.mock", "data_path is also set"),
])
def test_dataloader_rules_are_checked_once_here(change, path, match):
    """The loader does not check these again (one place, tests/data/test_loader.py keeps the file-dependent ones)."""
    data = tiny()
    change(data["train_dataset"]["dataloader"])
    found = errors(data)
    assert path in found and match in found[path], found


def test_a_zero_weight_fails_validate_config_as_it_would_fail_train():
    """The issue's example of the two validations disagreeing: one rule now (derive.parse_data_path)."""
    data = tiny()
    data["train_dataset"]["dataloader"]["config"]["data_path"] = ["0", "a", "1", "b"]
    assert "remove the prefix" in str(pytest.raises(ConfigError, load_data, data, check_files=False).value.problems[0].hint)


def test_mind_dataset_rules():
    data = tiny()
    data["train_dataset"]["dataloader"] = {"type": "MindDataset", "config": {"add_extra_token_to_sequence": False}}
    found = errors(data)
    assert "MindDataset needs dataset_files" in found[f"{_DL}.dataset_files"]
    assert "must be true for MindDataset" in found[f"{_DL}.config.add_extra_token_to_sequence"]
