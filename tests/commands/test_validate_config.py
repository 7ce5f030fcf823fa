"""`mftk validate-config` end to end through the Typer app: exit codes, stdout and stderr apart."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.cli import runner

from commands.app import app

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str):
    return runner.invoke(app, ["validate-config", *args])


def test_valid_template_summary():
    r = run(str(ROOT / "templates/deepseek_v3_tiny.yaml"), "--no-check-files", "--world-size", "2")
    assert r.exit_code == 0, r.output
    assert "valid" in r.stdout
    assert "accumulation steps" in r.stdout and "8 / (2·1) = 4" in r.stdout.replace("\n", " ").replace("  ", " ") \
        or "= 4" in r.stdout
    assert "active parameters" in r.stdout


def test_invalid_config_exit_1_with_paths_on_stderr(tmp_path):
    text = (ROOT / "templates/qwen3_tiny.yaml").read_text().replace("tensor_parallel: 1", "tensor_parallel: 2")
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    r = run(str(p), "--no-check-files", "--world-size", "2")
    assert r.exit_code == 1
    assert "parallelism.sequence_parallel" in r.stderr
    assert r.stdout == ""
    assert "Traceback" not in r.output


def test_json_output_is_machine_readable(tmp_path):
    r = run(str(ROOT / "templates/qwen3_tiny.yaml"), "--no-check-files", "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["valid"] is True
    assert data["resolved"]["training"]["global_batch_size"] == 8
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  steps: -1\n")
    r = run(str(bad), "--json")
    assert r.exit_code == 1
    data = json.loads(r.stdout)
    assert data["valid"] is False
    assert {"training.steps", "model"} <= {p["path"] for p in data["problems"]}


def test_print_resolved_marks_defaults():
    r = run(str(ROOT / "templates/qwen3_tiny.yaml"), "--no-check-files", "--print-resolved")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert any(l.strip().startswith("no_save_optim: false") and "# default" in l for l in lines)
    assert any(l.strip().startswith("global_batch_size: 8") and "# default" not in l for l in lines)


def test_missing_file_and_directory_exit_2(tmp_path):
    r = run(str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2 and "not found" in r.stderr
    r = run(str(tmp_path))
    assert r.exit_code == 2 and "directory" in r.stderr


def test_missing_data_files_named(tmp_path):
    text = (ROOT / "templates/qwen3_tiny.yaml").read_text().replace(
        "data/example_text_document", str(tmp_path / "nothing_here"))
    p = tmp_path / "c.yaml"
    p.write_text(text)
    r = run(str(p))
    assert r.exit_code == 1
    assert "nothing_here.bin" in r.stderr.replace("\n", "")


def test_model_from_hf_prints_a_section_that_validates(tmp_path):
    import yaml

    hf = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
          "torch_dtype": "bfloat16", "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    r = run("--model-from-hf", str(tmp_path / "config.json"))
    assert r.exit_code == 0, r.output
    section = yaml.safe_load(r.stdout)["model"]
    assert section["num_hidden_layers"] == 2 and section["architectures"] == "Qwen3ForCausalLM"
    config = yaml.safe_load((ROOT / "templates/qwen3_tiny.yaml").read_text())
    config["model"] = {**section, "seq_length": 128}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(config))
    assert run(str(p), "--no-check-files").exit_code == 0
    r = run("--model-from-hf", str(tmp_path / "missing.json"))
    assert r.exit_code == 2 and "no such file" in r.stderr


def test_alias_key_error_points_at_what_the_user_typed(tmp_path):
    text = (ROOT / "templates/qwen3_tiny.yaml").read_text().replace("num_hidden_layers: 2", "num_layers: two")
    p = tmp_path / "c.yaml"
    p.write_text(text)
    r = run(str(p), "--no-check-files")
    assert r.exit_code == 1
    assert "model.num_layers" in r.stderr


def test_show_samples_json_matches_the_loader_for_each_rank():
    from mftk.config.load import load_config
    from mftk.data.loader import build_train_dataset

    config = str(ROOT / "templates/qwen3_tiny.yaml")
    r = run(config, "--show-samples", "3", "--rank", "1", "--world-size", "2", "--json")
    assert r.exit_code == 0, r.output
    samples = json.loads(r.stdout)["samples"]
    assert len(samples) == 3 and {"dataset", "dataset_sample", "input_ids", "labels", "loss_mask",
                                  "position_ids"} <= set(samples[0])
    # independent: the full blend in order; DP rank 1 of 2 reads blended samples 1, 3, 5
    cfg = load_config(config).config
    full = build_train_dataset(cfg.train_dataset.dataloader, global_batch_size=8, local_batch_size=1)
    for i, s in enumerate(samples):
        assert s["input_ids"] == full.dataset[2 * i + 1]["input_ids"].tolist()
        assert s["labels"][:-1] == s["input_ids"][1:]
    r = run(config, "--show-samples", "1", "--rank", "2", "--world-size", "2")
    assert r.exit_code == 2 and "outside the world" in r.stderr


def test_deepseek_v4_takes_mfs_test_layout_with_tensor_parallel_and_colossal_context_parallel():
    """MindSpore Transformers' own V4 test layout (tp2·pp2·dp_shard2) validates with AdamW (issue 36), and so
    does cp2; ulysses context parallel is refused at its YAML path with the reason (V4's attention runs whole
    on the gathered sequence) and the fix, and so is a cp that leaves each rank fewer positions than a compress
    ratio divides (MF 2.1.0's CSA context parallel rule)."""
    v4 = str(ROOT / "templates/deepseek_v4_tiny.yaml")
    mf = ["--set", "parallelism.tensor_parallel=2", "--set", "parallelism.pipeline_parallel=2",
          "--set", "parallelism.data_parallel_shard=2", "--set", "parallelism.sequence_parallel=true",
          "--set", 'parallelism.pipeline_parallel_layers_per_stage=["0-1","2"]', "--set", "optimizer.type=AdamW"]
    r = run(v4, "--no-check-files", "--world-size", "8", *mf)
    assert r.exit_code == 0, r.output
    cp2 = ["--set", "parallelism.context_parallel=2", "--set", "parallelism.data_parallel_shard=1"]
    r = run(v4, "--no-check-files", "--world-size", "2", *cp2)
    assert r.exit_code == 0, r.output
    r = run(v4, "--no-check-files", "--world-size", "2", *cp2, "--set", "parallelism.context_parallel_method=ulysses")
    assert r.exit_code == 1 and r.stdout == "" and "Traceback" not in r.output
    assert "parallelism.context_parallel_method: DeepSeek-V4's context parallel runs the attention whole" in r.stderr
    assert "use context_parallel_method: colossal" in r.stderr
    r = run(v4, "--no-check-files", "--world-size", "16", "--set", "parallelism.context_parallel=16",
            "--set", "parallelism.data_parallel_shard=1")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "parallelism.context_parallel: each CP rank's seq_length/cp = 128/16 = 8 positions" in r.stderr
    assert "MindSpore Transformers 2.1.0's CSA context parallel requires it" in r.stderr
def _muon_tp2(tmp_path: Path, template: str, *extra: str) -> Path:
    import yaml

    raw = yaml.safe_load((ROOT / "templates" / template).read_text())
    raw["optimizer"] = {"type": "Muon", "weight_decay": 0.01}
    raw["parallelism"].update({"tensor_parallel": 2, "sequence_parallel": True})
    for kv in extra:
        key, value = kv.split("=")
        raw["optimizer"][key] = yaml.safe_load(value)
    p = tmp_path / f"muon_{template}"
    p.write_text(yaml.safe_dump(raw))
    return p


def test_muon_with_tensor_parallel_validates_and_plans(tmp_path):
    """Muon under TP (issue 36; its whole-matrix update is `engine.muon`'s): validate-config accepts it and
    plan-parallel checks it; DeepSeek-V3's QK-clip (on by default) is what TP refuses, once, at its own key."""
    for template, extra in (("qwen3_tiny.yaml", ()), ("deepseek_v3_tiny.yaml", ("qk_clip_enabled=false",))):
        cfg = _muon_tp2(tmp_path, template, *extra)
        r = run(str(cfg), "--no-check-files", "--world-size", "2")
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, ["plan-parallel", str(cfg), "--world-size", "2", "--json", "--check"])
        assert r.exit_code == 0, r.output
    r = run(str(_muon_tp2(tmp_path, "deepseek_v3_tiny.yaml")), "--no-check-files", "--world-size", "2", "--json")
    assert r.exit_code == 1
    problems = [p for p in json.loads(r.stdout)["problems"] if p["severity"] == "error"]
    assert [p["path"] for p in problems] == ["optimizer.qk_clip_enabled"], problems
    assert "Muon's QK-clip needs max attention logit tracking" in problems[0]["message"]
    assert "qk_clip_enabled: false" in problems[0]["hint"]


def test_deepseek_v4_legacy_mla_variant_validates(tmp_path):
    """DeepSeek-V4 with ``experimental_attention_variant: mla`` (plain MLA attention in V4's layers, as MindSpore
    Transformers 2.1.0 builds it; tests/engine/test_deepseek_v4_mla.py) validates with a note; a value head wider
    than the query head is refused at its key."""
    import yaml

    raw = yaml.safe_load((ROOT / "templates/deepseek_v4_tiny.yaml").read_text())
    raw["model"].update({"experimental_attention_variant": "mla", "kv_lora_rank": 16, "v_head_dim": 16})
    p = tmp_path / "v4_mla.yaml"
    p.write_text(yaml.safe_dump(raw))
    r = run(str(p), "--no-check-files", "--json")
    assert r.exit_code == 0, r.output
    notes = {q["path"]: q["message"] for q in json.loads(r.stdout)["problems"]}
    assert "DeepSeek-V3's MLA attention" in notes["model.experimental_attention_variant"]
    raw["model"]["v_head_dim"] = 33
    p.write_text(yaml.safe_dump(raw))
    r = run(str(p), "--no-check-files")
    assert r.exit_code == 1 and "model.v_head_dim" in r.stderr and "24 + 8 = 32" in r.stderr
