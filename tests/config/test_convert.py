"""`mftk convert-config` on the reference's static-graph pretrain configs (DeepSeek-V3 671B, Qwen3 32B,
Qwen3-MoE 30B-A3B). Expected values are the hand arithmetic of mindformers-2.1.md §7 (its DS3/Q3/Q3M columns)."""
from __future__ import annotations

import json

import pytest
import yaml
from tests.helpers.cli import runner

from commands.app import app
from mftk.config.convert import check_conversion, convert_file
from mftk.config.static_map import stages_from_offset
from mftk.config.load import load_config
from mftk.errors import ConfigError
from tests.config.static_yamls import STATIC, write_static


# §7.2 / §7.6: world = dp·tp·pp; gbs = batch_size·dp·micro_batch_num·interleave (pp > 1); steps = epochs·⌊sizes[0]/gbs⌋
EXPECTED = {
    "deepseek3_671b": dict(world=256, tp=8, pp=8, ep=32, lbs=1, gbs=1 * 4 * 32 * 1, steps=1 * (128000 // 128),
                           lr=2e-5, wd=0.01, save_every=1000, keep=5, prefix="deepseekv3", seed=42),
    "qwen3_32b": dict(world=16, tp=4, pp=4, ep=None, lbs=1, gbs=1 * 1 * 4 * 1, steps=2 * (8000 // 4),
                      lr=1e-6, wd=0.0, save_every=5000, keep=1, prefix="qwen3", seed=42),
    "qwen3_moe_30b_a3b": dict(world=16, tp=4, pp=4, ep=4, lbs=1, gbs=1 * 1 * 16 * 1, steps=1 * (8000 // 16),
                              lr=1e-5, wd=0.0, save_every=5000, keep=1, prefix="qwen3_moe", seed=1234),
}


@pytest.fixture(params=list(STATIC))
def converted(request, tmp_path):
    conv = convert_file(write_static(tmp_path, request.param))
    return request.param, conv


def test_layout_batches_steps_optimizer_and_checkpoint(converted):
    name, conv = converted
    want, c = EXPECTED[name], converted[1].config
    assert conv.world_size == want["world"]
    p = c["parallelism"]
    assert (p["tensor_parallel"], p["pipeline_parallel"], p.get("expert_parallel")) == (want["tp"], want["pp"], want["ep"])
    assert p["sequence_parallel"] is True  # tp > 1 needs it in PyNative (Q3's static file has it off)
    t = c["training"]
    assert (t["local_batch_size"], t["global_batch_size"], t["steps"], t["seed"]) == \
        (want["lbs"], want["gbs"], want["steps"], want["seed"])
    assert t["max_norm"] == 1.0  # use_clip_grad: True, max_grad_norm default 1.0
    assert c["optimizer"]["type"] == "AdamW" and c["optimizer"]["weight_decay"] == want["wd"]
    assert isinstance(c["optimizer"]["weight_decay"], float) and "swap" not in c["optimizer"]
    assert c["lr_scheduler"]["type"] == "ConstantWarmUpLR" and c["lr_scheduler"]["learning_rate"] == want["lr"]
    assert "total_steps" not in c["lr_scheduler"]
    ck = c["checkpoint"]
    assert (ck["enable_save"], ck["save_path"], ck["save_interleaved_steps"], ck["save_max"], ck["prefix"]) == \
        (True, "./output/checkpoint", want["save_every"], want["keep"], want["prefix"])
    assert c["context"] == {"mode": 1, "device_target": "Ascend",
                            "max_device_memory": "56GB" if name == "deepseek3_671b" else "58GB"}
    assert c["run_mode"] == "train"


def test_model_structure_is_lifted_one_level_with_a_string_architecture(converted):
    name, conv = converted
    model, static = conv.config["model"], yaml.safe_load(STATIC[name])["model"]["model_config"]
    arch = static["architectures"]
    assert model["architectures"] == (arch[0] if isinstance(arch, list) else arch)
    assert model["model_type"] == static["model_type"]
    assert model["num_hidden_layers"] == static["num_hidden_layers"] and model["hidden_size"] == static["hidden_size"]
    assert "offset" not in model and "pp_interleave_num" not in model and "model_config" not in model
    assert "router_dense_type" not in model and model.get("moe_router_dtype", "float32") == "float32"
    assert model["seq_length"] == 4096  # Q3M's model_config has none: taken from the dataset's seq_length


def test_dataset_section_and_columns(converted):
    name, conv = converted
    ds = conv.config["train_dataset"]
    loader = ds["dataloader"]
    assert loader["type"] == "BlendedMegatronDatasetDataLoader" and loader["datasets_type"] == "GPTDataset"
    assert loader["config"]["create_compressed_eod_mask"] is False and loader["config"]["seq_length"] == 4096
    # §7.4: DS3 has no input_columns, but PyNative's default [input_ids, labels] would drop two columns
    assert loader["column_names"] == ["input_ids", "labels", "loss_mask", "position_ids"]
    assert loader["python_multiprocessing"] is False and ds["num_parallel_workers"] == 8
    assert "seed" not in ds and "input_columns" not in ds and "construct_args_key" not in ds


def test_every_static_key_is_mapped_or_listed_with_a_reason(converted):
    name, conv = converted
    from mftk.config.static_map import _leaf_paths

    sources = {s.strip() for src, _ in conv.mapped for s in src.split(",")}
    listed = sources | {path for path, _ in conv.unmapped}
    for leaf in _leaf_paths(yaml.safe_load(STATIC[name])):
        assert any(leaf == k or leaf.startswith(k + ".") or leaf.startswith(k + "[") for k in listed), leaf
    assert all(reason for _, reason in conv.unmapped)


def test_unmapped_keys_of_deepseek3(tmp_path):
    conv = convert_file(write_static(tmp_path, "deepseek3_671b"))
    why = dict(conv.unmapped)
    assert "seqpipe" in why["parallel.pipeline_config.pipeline_scheduler"]
    assert "data_parallel_shard" in why["parallel.parallel_optimizer_config.optimizer_weight_shard_size"]
    assert "no data sinking" in why["runner_config.sink_mode"]
    assert "built into the PyNative trainer" in why["callbacks[0]"]
    assert "rejects it" in why["context.jit_config.jit_level"]
    assert "no loss scaling" in why["runner_wrapper.scale_sense"]


def test_pipeline_stages_from_the_static_offset():
    # DS3: 61 layers, pp 8, interleave 2, offset [[1]*8, [1]*7 + [-2]]: base 61 // 16 = 3 → 4 per chunk, last 1
    stages = stages_from_offset(61, 8, 2, [[1] * 8, [1] * 7 + [-2]])
    assert stages[0] == "0-3,32-35" and stages[6] == "24-27,56-59" and stages[7] == "28-31,60"
    # Q3: 64 layers, pp 4, offset [-1, -1, 1, 1]: 15, 15, 17, 17
    assert stages_from_offset(64, 4, 1, [-1, -1, 1, 1]) == ["0-14", "15-29", "30-46", "47-63"]
    assert stages_from_offset(48, 4, 1, 0) == "auto"
    assert stages_from_offset(48, 4, 1, [1, 1, 1, 1]) is None  # 13·4 = 52 ≠ 48
    assert stages_from_offset(10, 4, 1, [0, 0]) is None  # one entry per stage is needed


def test_recompute_true_is_full_recompute_of_every_layer_and_mtp(tmp_path):
    c = convert_file(write_static(tmp_path, "deepseek3_671b")).config
    assert c["recompute"] == {"mode": "full", "full_recompute_layer": ["0-61"]}  # 61 layers + 1 MTP layer
    assert c["parallelism"]["pipeline_parallel_interleave_num"] == 2


@pytest.mark.parametrize("name", ["deepseek3_671b", "qwen3_32b", "qwen3_moe_30b_a3b"])
def test_the_result_validates(tmp_path, name):
    conv = convert_file(write_static(tmp_path, name))
    out = tmp_path / "pynative.yaml"
    out.write_text(conv.to_yaml())
    loaded = load_config(out, world_size=conv.world_size, check_files=False)
    assert loaded.config.training.global_batch_size == EXPECTED[name]["gbs"]
    assert [p for p in check_conversion(conv) if p.severity == "error"] == []


def test_qwen3_moe_converts_and_validate_gives_one_line(tmp_path):
    conv = convert_file(write_static(tmp_path, "qwen3_moe_30b_a3b"))
    out = tmp_path / "q3m.yaml"
    r = runner.invoke(app, ["convert-config", str(write_static(tmp_path, "qwen3_moe_30b_a3b")), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(out.read_text()) == conv.config
    v = runner.invoke(app, ["validate-config", str(out), "--world-size", "16", "--no-check-files"],
                      env={"COLUMNS": "400"})
    # its own layout (tp4·pp4·ep4 on 16 ranks, global_aux_loss) is one mftk trains: valid as converted
    assert v.exit_code == 0, v.output
    assert "✓ valid" in v.stdout and "tp=4 × pp=4 × ep=4" in v.stdout, v.output
    assert not [line for line in v.stderr.splitlines() if line.strip().startswith("•")], v.output
    assert yaml.safe_load(out.read_text())["model"]["moe_router_load_balancing_type"] == "global_aux_loss"


def test_validate_config_on_a_static_yaml_is_one_line(tmp_path):
    src = write_static(tmp_path, "qwen3_32b")
    r = runner.invoke(app, ["validate-config", str(src)], env={"COLUMNS": "400"})
    assert r.exit_code == 1
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "static-graph (GRAPH_MODE) config" in lines[0] and "mftk convert-config" in lines[0]
    j = runner.invoke(app, ["validate-config", str(src), "--json"])
    data = json.loads(j.stdout)
    assert data["valid"] is False and len(data["problems"]) == 1 and "convert-config" in data["problems"][0]["message"]


def test_cli_writes_atomically_refuses_to_overwrite_and_reports(tmp_path):
    src, out = write_static(tmp_path, "qwen3_32b"), tmp_path / "q3.yaml"
    r = runner.invoke(app, ["convert-config", str(src), "-o", str(out)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "validates at --world-size 16" in r.stdout and "mftk validate-config" in r.stdout
    assert "runner_wrapper.scale_sense: no loss scaling in PyNative" in r.stdout
    text = out.read_text()
    assert text.startswith("# Converted by `mftk convert-config` from pretrain_qwen3_32b.yaml")
    assert "#   lr_schedule.total_steps: PyNative forces it to training.steps" in text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left
    again = runner.invoke(app, ["convert-config", str(src), "-o", str(out)])
    assert again.exit_code == 2 and "already exists" in again.stderr
    forced = runner.invoke(app, ["convert-config", str(src), "-o", str(out), "--force", "--json"])
    data = json.loads(forced.stdout)
    assert forced.exit_code == 0 and data["valid"] is True and data["world_size"] == 16
    assert {"key": "optimizer.swap", "reason": "no optimizer swap in PyNative (Muon raises on it)"} not in data["unmapped"]


def test_a_pynative_yaml_is_not_converted(tmp_path):
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "templates" / "qwen3_tiny.yaml"
    with pytest.raises(ConfigError, match="is not a static-graph config"):
        convert_file(src)
    r = runner.invoke(app, ["convert-config", str(src), "-o", str(tmp_path / "x.yaml")])
    assert r.exit_code == 1 and not (tmp_path / "x.yaml").exists()
