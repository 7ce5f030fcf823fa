"""What a new user meets in the first hour: units that show the value, notes apart from errors, `--set`
mistakes as usage errors, a closed pipe, a resume that makes the LR jump, the planner explaining itself."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from commands.app import app
from tests.helpers.cli import runner
from tests.helpers.tiny import tiny_raw

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "templates" / "qwen3_tiny.yaml"
UNITS = {"K": 1e3, "M": 1e6, "B": 1e9}


def _cfg(tmp_path, corpus, **edits):
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ckpt", steps=3, gbs=2)
    for dotted, value in edits.items():
        section, key = dotted.split("__")
        raw[section][key] = value
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# ----------------------------------------------------------------------------- numbers

@pytest.mark.engine
def test_tiny_run_reports_nonzero_rates_and_a_parameter_count_with_a_unit(tmp_path, corpus):
    cfg = _cfg(tmp_path, corpus)
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    m = re.search(r"^model (\d+(?:\.\d+)?)([KMB]) parameters; ([\d,]+(?:\.\d+)?) tokens/s, ([\d.]+) ([kMGT]?)FLOP/s "
                  r"per device",
                  r.stdout, flags=re.M)
    assert m, r.stdout
    from mftk.plan.flops import param_counts
    from mftk.config.load import load_config

    total, _ = param_counts(load_config(cfg).config.model)
    assert math.isclose(float(m.group(1)) * UNITS[m.group(2)], total, rel_tol=5e-3)  # 3 significant digits
    tokens_s = float(m.group(3).replace(",", ""))
    metrics = [json.loads(line) for line in (tmp_path / "out/log/rank_0/metrics.jsonl").read_text().splitlines()]
    steady = metrics[1:]  # after the first (warm-up) step, as the summary says
    by_hand = sum(2 * 32 for _ in steady) / (sum(x["per_step_time"] for x in steady) / 1000)  # gbs·seq / s
    # as printed: 3 significant digits or a whole number (a busy machine runs slower, so fewer digits show)
    assert tokens_s > 0 and math.isclose(tokens_s, by_hand, rel_tol=0.01, abs_tol=0.5)
    assert float(m.group(4)) > 0
    assert r.stdout.count("Weight decay:") == 1 and "param_name:" not in r.stdout  # one summary line
    # parse-log of the exact metrics: a non-zero rate in a unit that shows it; of the step lines: said why not
    exact = runner.invoke(app, ["parse-log", str(tmp_path / "out/log/rank_0/metrics.jsonl")], env={"COLUMNS": "80"})
    assert exact.exit_code == 0, exact.output
    rate = re.search(r"throughput per device\s*│\s*([\d.]+) ([kMGT]?)FLOP/s", exact.stdout)
    assert rate and float(rate.group(1)) > 0 and "0.00" not in rate.group(1)
    assert re.search(r"tokens/s\s*│\s*(?:[1-9][\d,]*|0\.\d*[1-9])", exact.stdout)
    logged = runner.invoke(app, ["parse-log", str(tmp_path / "out/log/rank_0/info.log")], env={"COLUMNS": "80"})
    assert logged.exit_code == 0 and "too coarse" in logged.stderr
    assert "lr_jump" not in logged.stdout


def test_validate_config_counts_and_flops_have_units():
    r = runner.invoke(app, ["validate-config", str(TINY), "--no-check-files"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert re.search(r"parameters\s+623K \(622,976\)", r.stdout)
    assert re.search(r"FLOPs per step\s+\d+(\.\d+)? GFLOP", r.stdout)
    plan = runner.invoke(app, ["plan-parallel", str(TINY), "--world-size", "2"])
    assert "623K params" in plan.stdout and "0.000623B" not in plan.stdout


def test_every_step_wording(tmp_path):
    data = yaml.safe_load(TINY.read_text())
    data["checkpoint"]["save_interleaved_steps"] = 1
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    r = runner.invoke(app, ["validate-config", str(cfg), "--no-check-files"])
    assert "every step and at the end" in r.stdout and "every 1 steps" not in r.stdout


# ----------------------------------------------------------------------------- errors, notes, --set

def test_set_without_a_value_is_a_usage_error_without_a_yaml_line():
    r = runner.invoke(app, ["validate-config", str(TINY), "--no-check-files", "--set", "training.steps"])
    assert r.exit_code == 2, r.output
    assert "--set training.steps: expected KEY=VALUE" in r.stderr and "line" not in r.stderr
    assert "--set training.steps=20" in r.stderr  # the hint shows the form


def test_a_set_value_error_names_the_override_not_the_line_it_replaced():
    r = runner.invoke(app, ["validate-config", str(TINY), "--no-check-files", "--set", "training.steps=-3"])
    assert r.exit_code == 1, r.output
    assert "training.steps: must be positive, got -3 (from --set training.steps=-3)" in r.stderr
    assert "training.steps (line" not in r.stderr


def test_notes_are_apart_from_errors_and_not_counted(tmp_path):
    data = yaml.safe_load(TINY.read_text())
    data["model"]["compute_dtype"] = "bfloat16"  # a note: computed as fp32 on CPU
    data["training"]["bogus"] = 1  # the one error
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    r = runner.invoke(app, ["validate-config", str(cfg), "--no-check-files"])
    assert r.exit_code == 1
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"error: {cfg}: training.bogus") and "problem(s)" not in r.stderr
    note = next(line for line in lines if "compute_dtype" in line)
    assert note.startswith("note: model.compute_dtype") and "•" not in note


def test_missing_data_hint_fits_the_command_that_printed_it(tmp_path, corpus):
    cfg = _cfg(tmp_path, tmp_path / "no_such_prefix")
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 1
    assert "`mftk validate-config --no-check-files`" in r.stderr and "use --no-check-files" not in r.stderr


def test_a_template_validates_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["validate-config", str(TINY)])
    assert r.exit_code == 0, r.output
    assert "next to the config file" in r.stderr and r.stderr.startswith("note:")


def test_closed_pipe_stops_quietly(tmp_path):
    """`mftk … | head -1`: the reader is gone before mftk writes; no traceback, no message, exit 141."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "mftk", "templates"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=tmp_path)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == "", err


# ----------------------------------------------------------------------------- resume and the LR

def test_lr_change_at_resume_against_the_cosine_by_hand():
    """The template's cosine (peak 3e-3, 3 warm-up steps, end 3e-4): 30 steps end at 3e-4; resumed to 60,
    step 30 of the longer cosine is 3e-4 + 2.7e-3·½(1 + cos(π·27/57))."""
    from mftk.config.load import load_config
    from mftk.engine.schedule import lr_change_at_resume

    import attrs

    s = load_config(TINY, check_files=False).config.lr_scheduler
    text = lr_change_at_resume(attrs.asdict(s), 30, 30, s, 60, 30)
    new = 3e-4 + 2.7e-3 * 0.5 * (1 + math.cos(math.pi * 27 / 57))
    assert f"uses {new:.3e} where the saved run was at 3.000e-04" in text and "training.steps 30 -> 60" in text
    assert lr_change_at_resume(attrs.asdict(s), 30, 20, s, 30, 20) is None  # same schedule: it continues
    constant = attrs.evolve(s, type="ConstantWarmUpLR")
    assert lr_change_at_resume(attrs.asdict(constant), 30, 30, constant, 60, 30) is None  # nothing decays


@pytest.mark.engine
def test_resume_dry_run_to_a_larger_target_warns_of_the_lr_jump(tmp_path, corpus):
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ckpt", steps=2, gbs=2)
    raw["lr_scheduler"] = {"type": "CosineWithWarmUpLR", "learning_rate": 3e-3, "warmup_steps": 1, "lr_end": 3e-4}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    assert runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out")]).exit_code == 0
    r = runner.invoke(app, ["resume", str(cfg), "--dry-run", "--set", "training.steps=6"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    new = 3e-4 + 2.7e-3 * 0.5 * (1 + math.cos(math.pi * 1 / 5))  # step 2 of a 6-step cosine after 1 warm-up
    assert "the learning rate jumps at the resume: training.steps 2 -> 6" in r.stdout
    assert f"uses {new:.3e} where the saved run was at 3.000e-04" in r.stdout


# ----------------------------------------------------------------------------- plan-parallel explains itself

def test_plan_parallel_says_how_it_ranks_and_why_it_chose():
    r = runner.invoke(app, ["plan-parallel", str(ROOT / "templates/qwen3_0.6b.yaml"), "--world-size", "8",
                            "--device-memory", "32GiB", "--json"])
    data = json.loads(r.stdout)
    best, runner_up = data["layouts"][0], data["layouts"][1]
    assert data["ranking"].startswith("ranked by: fits in device memory")
    label = "·".join(str(best["layout"][k]) for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep"))
    assert data["why_chosen"][0].startswith(f"{label} is recommended: it fits")
    assert best["fits"] and sum(best["comm_bytes"].values()) < sum(runner_up["comm_bytes"].values())
    assert "the least communication" in data["why_chosen"][0]
    text = runner.invoke(app, ["plan-parallel", str(ROOT / "templates/qwen3_0.6b.yaml"), "--world-size", "8",
                               "--device-memory", "32GiB"])
    assert data["ranking"] in text.stdout and data["why_chosen"][0] in text.stdout


def test_plan_parallel_check_says_which_terms_do_not_fit_and_by_how_much():
    args = [str(ROOT / "templates/qwen3_0.6b.yaml"), "--world-size", "8", "--check", "--device-memory", "8GiB"]
    r = runner.invoke(app, ["plan-parallel", *args])
    assert r.exit_code == 1
    data = json.loads(runner.invoke(app, ["plan-parallel", *args, "--json"]).stdout)
    layout = data["layouts"][0]
    peak = layout["peak_bytes"] / 2 ** 30
    over = peak - 8
    assert f"needs {peak:.3g} GiB per device, {over:.3g} GiB more than the 8 GiB given" in r.stderr
    terms = layout["stages"][layout["peak_stage"]]["terms"]
    largest = max(terms, key=terms.get)
    assert f"; {largest} {terms[largest] / 2 ** 30:.3g} GiB" in r.stderr


def test_plan_parallel_explain_does_not_repeat_the_table():
    r = runner.invoke(app, ["plan-parallel", str(ROOT / "templates/qwen3_0.6b.yaml"), "--world-size", "8",
                            "--explain", "dps4.tp2"])
    assert r.exit_code == 0
    assert "peak@st" not in r.stdout and "layout: dp_replicate=1 × dp_shard=4" in r.stdout
    assert "models.md" not in r.stdout


# ----------------------------------------------------------------------------- samples

def test_show_samples_shows_labels_mask_and_positions(tmp_path, corpus):
    cfg = _cfg(tmp_path, corpus)
    r = runner.invoke(app, ["validate-config", str(cfg), "--show-samples", "1"])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  ")}
    assert "(32 tokens)" in rows["input_ids"] and "(input_ids shifted by one)" in rows["labels"]
    assert re.search(r"\d+ of 32 tokens count in the loss", rows["loss_mask"])
    assert rows["position_ids"].split()[1] == "0..31"
