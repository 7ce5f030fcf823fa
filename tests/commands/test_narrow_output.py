"""Piped at COLUMNS=80 (the test runner is not a terminal), every table keeps every identifier whole:
each path, tensor name, header and number appears on one line, and nothing is cut to `…`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from commands.app import app
from tests.helpers.cli import runner
from tests.helpers.data import make_tokenizer
from tests.helpers.handmade import f32, write
from tests.helpers.logsynth import step_metrics
from mftk.logs.format import format_step_line

ROOT = Path(__file__).resolve().parents[2]
NARROW = {"COLUMNS": "80"}
LONG = [f"decoder.layers.{i}.self_attention.linear_qkv.weight_with_a_name_longer_than_eighty_columns_of_text"
        for i in range(3)]


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env=NARROW)


def _assert_whole(out: str, *identifiers: str) -> None:
    assert "…" not in out, out
    for ident in identifiers:
        assert ident in out, f"{ident!r} is not whole on one line of:\n{out}"


def _step_dir(root: Path, names: list[str], step: int = 3) -> Path:
    d = root / f"iteration_{step:08d}"
    d.mkdir(parents=True)
    write(d / "checkpoint-model-0000000-0000001.safetensors", [(n, "F32", [2], f32(1, 2)) for n in names])
    (d / "common.json").write_text(json.dumps({"epoch_num": 1, "step_num": step, "global_step": step,
                                               "loss_scale": 1.0, "global_batch_size": 2,
                                               "consumed_samples": 2 * step, "ckpt_status": None}))
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return d


def test_inspect_ckpt_tensor_names_and_paths_whole(tmp_path):
    root = tmp_path / "runs [final]" / "a_checkpoint_directory_with_a_rather_long_name"
    d = _step_dir(root, LONG)
    r = _invoke("inspect-ckpt", root, "--verify")
    assert r.exit_code == 0, r.output
    _assert_whole(r.stdout, str(d), *LONG, "checkpoint-model-0000000-0000001.safetensors")
    assert max(len(line) for line in r.stdout.splitlines()) > 80  # wider than the window, not folded


def test_inspect_ckpt_diff_lists_whole_names_or_says_none(tmp_path):
    a = _step_dir(tmp_path / "a", LONG)
    b = _step_dir(tmp_path / "b", LONG[:2] + [LONG[2] + "_renamed"])
    r = _invoke("inspect-ckpt", a, "--diff", b)
    assert r.exit_code == 0, r.output
    _assert_whole(r.stdout, LONG[2], LONG[2] + "_renamed")
    same = _invoke("inspect-ckpt", a, "--diff", a)
    assert same.exit_code == 0 and "Tensor differences" not in same.stdout  # no empty table
    assert "no tensor added, removed, reshaped or retyped" in same.stdout


def test_parse_log_headers_and_values_whole(tmp_path):
    """A DeepSeek-style log (balancing and MTP losses) at 80 columns: every column header and value."""
    lines = []
    for s in range(1, 7):
        m = dict(step_metrics(s), mtp_1_loss=8.327184 + s / 1000, consumed_samples=123456 * s)
        lines.append(format_step_line(m, total_steps=6))
    log = tmp_path / "worker_0.log"
    log.write_text("\n".join(lines) + "\n")
    r = _invoke("parse-log", log, "--seq-length", "4096")
    assert r.exit_code == 0, r.output
    header = next(line for line in r.stdout.splitlines() if "consumed_samples" in line)
    for h in ("step", "consumed_samples", "loss", "per_step_time (ms)", "load_balancing_loss", "mtp_1_loss",
              "lr", "grad_norm", "throughput (TFLOP/s)", "tokens/s"):
        assert h in header, (h, header)
    _assert_whole(r.stdout, "8.32818", "740,736", "p50", "tokens/s")


def test_preprocess_table_keeps_prefix_and_file_columns(tmp_path):
    deep = tmp_path / "a_corpus_directory_with_a_long_name" / "and_another_level_below_it"
    deep.mkdir(parents=True)
    (deep / "c.jsonl").write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(5)))
    make_tokenizer(deep / "tokenizer.json")
    r = _invoke("preprocess", "-i", deep / "c.jsonl", "-t", deep / "tokenizer.json", "-o", deep / "out")
    assert r.exit_code == 0, r.output
    header = next(line for line in r.stdout.splitlines() if "output" in line and "docs" in line)
    assert ".bin" in header and ".idx" in header
    _assert_whole(r.stdout, f"{deep}/out_text_document")


def test_validate_config_summary_keeps_the_data_path(tmp_path):
    data = yaml.safe_load((ROOT / "templates" / "qwen3_tiny.yaml").read_text())
    prefix = str(tmp_path / "a_data_directory_with_a_long_name" / "and_a_long_corpus_prefix_text_document")
    data["train_dataset"]["dataloader"]["config"]["data_path"] = ["1", prefix]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    r = _invoke("validate-config", cfg, "--no-check-files", "--world-size", "2")
    assert r.exit_code == 0, r.output
    _assert_whole(r.stdout, prefix, "global_batch_size / (dp·local_batch_size) = 8 / (2·1) = 4")


def test_plan_parallel_table_and_lines_whole():
    r = _invoke("plan-parallel", ROOT / "templates" / "qwen3_0.6b.yaml", "--world-size", "8")
    assert r.exit_code == 0, r.output
    first = r.stdout.splitlines()[0]
    assert first.startswith("qwen3 L=28 H=1024 S=4096, 596M params") and first.endswith("valid of 50")
    labels = re.findall(r"^(\d+·\d+·\d+·\d+·\d+·\d+)\s+(?:yes|no)\s", r.stdout, flags=re.M)
    assert len(labels) == 10 and all(label.count("·") == 5 for label in labels)
    _assert_whole(r.stdout, "states = weights+grads+optimizer+FSDP gather")


def test_templates_paths_whole():
    from mftk.config.templates import shipped_templates

    r = _invoke("templates")
    assert r.exit_code == 0, r.output
    _assert_whole(r.stdout, *(str(t.path) for t in shipped_templates()), *(t.summary for t in shipped_templates()))


@pytest.mark.engine
def test_resume_plan_lists_whole_parameter_names(tmp_path):
    """A dry run against a checkpoint that does not fit lists every missing and unexpected name whole."""
    root = tmp_path / "ckpt"
    _step_dir(root, LONG)
    r = _invoke("resume", ROOT / "templates" / "qwen3_tiny.yaml", "--from", root, "--weights-only", "--dry-run")
    assert r.exit_code == 1, r.output
    _assert_whole(r.stdout, *LONG, "decoder.layers.0.self_attention.linear_qkv.weight")
