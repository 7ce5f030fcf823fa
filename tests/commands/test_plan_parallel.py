"""`mftk plan-parallel` through the CLI: table, JSON, --check, --explain and every bad-input path."""
import json
from pathlib import Path

import pytest
import yaml
from tests.helpers.cli import runner

from commands.app import app

ROOT = Path(__file__).resolve().parents[2]
QWEN = str(ROOT / "templates/qwen3_tiny.yaml")
DSV3 = str(ROOT / "templates/deepseek_v3_tiny.yaml")


def run(*args):
    return runner.invoke(app, ["plan-parallel", *args])


def variant(tmp_path, base, **sections):
    data = yaml.safe_load(Path(base).read_text())
    for key, value in sections.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = {**(data.get(key) or {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_table_and_yaml_block():
    r = run(QWEN, "--world-size", "8", "--top", "3")
    assert r.exit_code == 0, r.output
    assert "valid of" in r.stdout and "peak@st" in r.stdout
    assert "parallelism:\n  data_parallel_shard:" in r.stdout
    assert "rejected:" in r.stdout


def test_json_counts_and_fields():
    r = run(DSV3, "--world-size", "4", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    # brute force for world 4, MoE, interleave ≤ 2: see tests/plan/test_search.py::brute_count
    from tests.helpers.sizes import brute_count

    assert out["candidates"] == brute_count(4, True, 2)
    assert out["valid"] + out["rejected_count"] == out["candidates"]
    top = out["layouts"][0]
    assert {"peak_bytes", "stages", "bubble", "comm_bytes", "flops_per_step"} <= set(top)
    assert top["stages"][0]["terms"]["weights"] > 0
    assert all(r["rules"] for r in out["rejected"])


def test_exclude_op_is_noted_as_outside_the_estimate(tmp_path):
    recompute = {"mode": "full", "full_recompute_layer": ["0-1"]}
    plain = run(variant(tmp_path, QWEN, recompute=recompute), "--world-size", "2", "--json")
    excl = run(variant(tmp_path, QWEN, recompute={**recompute, "exclude_op": {"*linear_proj": ["0"]}}),
               "--world-size", "2", "--json")
    assert plain.exit_code == 0 and excl.exit_code == 0, excl.output
    noted = [n for n in json.loads(excl.stdout)["notes"] if "exclude_op" in n]
    assert len(noted) == 1 and "not in the activation estimate" in noted[0]
    assert not [n for n in json.loads(plain.stdout)["notes"] if "exclude_op" in n]

def test_check_fits_and_does_not_fit():
    assert run(QWEN, "--world-size", "2", "--check").exit_code == 0
    r = run(QWEN, "--world-size", "2", "--check", "--device-memory", "1MiB")
    assert r.exit_code == 1
    assert "no" in r.stdout


def test_check_rejects_tp_across_nodes(tmp_path):
    cfg = variant(tmp_path, QWEN, parallelism={"tensor_parallel": 2, "sequence_parallel": True})
    r = run(cfg, "--world-size", "8", "--nodes", "8", "--check")            # one device per node, tp=2
    assert r.exit_code == 1
    assert "tp_in_node" in r.stdout


def test_check_invalid_config_layout(tmp_path):
    cfg = variant(tmp_path, QWEN, parallelism={"tensor_parallel": 2})           # SP missing
    r = run(cfg, "--world-size", "2", "--check")
    assert r.exit_code == 1
    assert "sequence_parallel" in r.stderr


def test_explain_prints_formulas():
    r = run(QWEN, "--world-size", "4", "--explain", "dps2.tp2")
    assert r.exit_code == 0, r.output
    assert "weights = " in r.stdout and "inputs:" in r.stdout and "activations = " in r.stdout


def test_step_time_with_tflops():
    r = run(QWEN, "--world-size", "2", "--json", "--device-tflops", "10", "--link-gbps", "100")
    assert json.loads(r.stdout)["layouts"][0]["step_time_s"] > 0


@pytest.mark.parametrize("args,code,text", [
    (["--world-size", "0"], 2, ""),
    (["--world-size", "8", "--device-memory", "lots"], 2, "cannot read device memory"),
    (["--world-size", "8", "--nodes", "3"], 2, "does not split world size 8"),
    (["--world-size", "8", "--explain", "banana"], 2, "cannot read layout"),
])
def test_bad_arguments(args, code, text):
    r = run(QWEN, *args)
    assert r.exit_code == code
    assert text in r.output


def test_prime_world_says_why_each_dimension_failed():
    r = run(QWEN, "--world-size", "7")
    assert r.exit_code == 1
    for line in ("tp: num_attention_heads", "pp: num_hidden_layers", "cp: seq_length", "dp: global_batch_size"):
        assert line in r.stderr
    assert "Traceback" not in r.output


def test_model_missing_shape_fields(tmp_path):
    data = yaml.safe_load(Path(QWEN).read_text())
    data["model"] = {"model_type": "qwen3", "architectures": "Qwen3ForCausalLM", "vocab_size": 4096, "seq_length": 128}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    r = run(str(path), "--world-size", "2")
    assert r.exit_code == 1
    assert "missing hidden_size, num_hidden_layers, num_attention_heads" in r.stderr


def test_model_section_missing(tmp_path):
    r = run(variant(tmp_path, QWEN, model=None), "--world-size", "2")
    assert r.exit_code == 1
    assert "model section is missing" in r.stderr


@pytest.mark.parametrize("template", ["qwen3_0.6b", "deepseek_v3_1b"])
def test_published_size_templates_plan(template):
    r = run(str(ROOT / f"templates/{template}.yaml"), "--world-size", "8", "--json", "--top", "1")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["valid"] > 0


def test_profile_option_changes_the_estimate_and_rejects_unknown_names():
    import json as _json

    args = ["plan-parallel", "templates/qwen3_tiny.yaml", "--world-size", "1", "--json", "--check"]
    acc = runner.invoke(app, args)
    cpu = runner.invoke(app, args + ["--profile", "mftk-cpu"])
    assert acc.exit_code == 0 and cpu.exit_code == 0, (acc.output, cpu.output)
    assert _json.loads(acc.stdout) != _json.loads(cpu.stdout)
    bad = runner.invoke(app, args + ["--profile", "gpu-ish"])
    assert bad.exit_code == 2


def test_every_plan_states_the_profiles_measured_error():
    from mftk.plan import references as R

    table = run(QWEN, "--world-size", "2")
    assert table.exit_code == 0, table.output
    default = R.profile_error("accelerator")
    assert default.runs == len(R.rows_for("megatron")) == sum(r.framework == "megatron" for r in R.REFERENCES)
    assert (f"accelerator profile (Megatron-core accounting, = megatron): peak memory within {R._pct(default.low)} to "
            f"{R._pct(default.high)} of {default.runs} published runs (NVIDIA/Megatron-LM, ISEEKYAN/mbridge)"
            ) in table.stdout
    assert "an FSDP2 cluster: --profile torchtitan: peak memory within" in table.stdout
    assert -0.15 <= default.low <= default.high <= 0.15
    out = json.loads(run(QWEN, "--world-size", "2", "--json").stdout)
    assert out["profile"] == "accelerator" and out["profile_error"]["runs"] == default.runs
    for extra in (["--check"], ["--explain", "dps2"]):
        assert "published runs" in run(QWEN, "--world-size", "2", *extra).stdout
    out = json.loads(run(QWEN, "--world-size", "2", "--json", "--profile", "torchtitan").stdout)
    err = out["profile_error"]
    assert out["profile"] == "torchtitan" and err["runs"] == len(R.rows_for("torchtitan"))
    expected = R.profile_error("torchtitan")
    assert (err["low"], err["high"]) == (expected.low, expected.high)
    assert out["profile_error_text"][0].startswith("torchtitan profile: peak memory within")
    cpu = json.loads(run(QWEN, "--world-size", "2", "--json", "--profile", "mftk-cpu").stdout)
    assert cpu["profile_error"]["runs"] == 0 and "not measured on published" in cpu["profile_error_text"][0]


def test_hardware_preset_gives_tokens_per_second_and_ranks_by_it():
    r = run(QWEN, "--world-size", "4", "--json", "--hardware", "h100-sxm", "--profile", "torchtitan")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    rows = out["layouts"]
    assert out["hardware"] == "h100-sxm" and out["ranking"].startswith("ranked by: fits in device memory, then estimated")
    tokens = 8 * 128  # global_batch_size · seq_length of qwen3_tiny
    for row in rows:
        assert row["tokens_per_s_per_device"] == pytest.approx(tokens / 4 / row["step_time_s"])
    fitting = [row["step_time_s"] for row in rows if row["fits"]]
    assert fitting == sorted(fitting)
    table = run(QWEN, "--world-size", "4", "--hardware", "h100-sxm")
    assert "tok/s" in table.stdout and table.exit_code == 0


@pytest.mark.parametrize("args,text", [
    (["--hardware", "h100"], "unknown hardware preset 'h100'"),
    (["--hardware", "h100-sxm", "--device-tflops", "300"], "--hardware and --device-tflops/--link-gbps"),
])
def test_bad_hardware_arguments(args, text):
    r = run(QWEN, "--world-size", "2", *args)
    assert r.exit_code == 2 and text in r.output and "Traceback" not in r.output


def test_explain_shows_the_accelerator_terms():
    r = run(QWEN, "--world-size", "4", "--explain", "dps4", "--profile", "torchtitan", "--hardware", "a100-sxm",
            "--set", "recompute.mode=select", "--set", 'recompute.select_module={"*core_attention": ["0-1"]}')
    assert r.exit_code == 0, r.output
    for text in ("allocator reserve = f·(sum of the terms above)", "per-op SAC", "L (bytes per token·V at the loss)=12",
                 "step time = recompute·(F_mm/(P·e_mm)", "A100 datasheet"):
        assert text in r.stdout, text


def test_a_model_the_engine_does_not_train_is_planned_with_a_warning(tmp_path):
    """Linear biases and dropout under PP (GeLU and a non-gated MLP are trained by the engine too): the accelerator
    profiles plan the cluster's run (MindSpore Transformers may train it); the CPU profile, which is mftk's engine,
    refuses it."""
    cfg = variant(tmp_path, QWEN, model={"hidden_act": "gelu", "gated_linear_unit": False, "add_bias_linear": True,
                                         "hidden_dropout": 0.1})
    r = run(cfg, "--world-size", "2", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert any("add_bias_linear" in n and "planned anyway" in n for n in out["notes"])
    assert not any("gated_linear_unit" in n for n in out["notes"])        # built by the engine: no warning
    assert any(row["layout"]["pp"] == 2 for row in out["layouts"])      # PP with dropout: the engine's limit only
    (tmp_path / "gated").mkdir()
    gated = json.loads(run(variant(tmp_path / "gated", QWEN, model={"hidden_dropout": 0.1}), "--world-size", "2",
                           "--json").stdout)
    weights = lambda o: o["layouts"][0]["stages"][0]["terms"]["weights"]  # noqa: E731
    assert weights(out) < weights(gated)                                  # two MLP matrices instead of three
    cpu = run(cfg, "--world-size", "2", "--profile", "mftk-cpu")
    assert cpu.exit_code == 1 and "not implemented by mftk's engine" in cpu.output
