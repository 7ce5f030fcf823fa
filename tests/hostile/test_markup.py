"""User text rendered as Rich markup (issue 21, item 6).

``[/]`` in anything Rich renders closes a tag that was never opened (MarkupError, a traceback);
``[final]`` or ``[bold]`` is taken for a style and vanishes. Paths, YAML keys, tensor names,
``--metrics`` and ``--explain`` values are the user's, so every one of them must come out literally.
(Literal input paths holding glob characters, ``data[1].jsonl``, are in ``test_preprocess.py``.)
"""
from __future__ import annotations

import shutil

import pytest
import yaml

from tests.helpers.handmade import f32, mf_step_dir, write
from tests.helpers.hostile import ROOT, assert_clean_failure, flat, mftk
from tests.helpers.logsynth import synth_lines
from tests.helpers.tiny import tiny_raw

TEMPLATE = ROOT / "templates" / "qwen3_tiny.yaml"
NAMES = ["[/]", "[final]", "[bold]x[/bold]"]


def _ok(r, *texts: str) -> str:
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "MarkupError" not in out
    for t in texts:
        assert t in flat(out), (t, out[-3000:])
    return out


@pytest.mark.parametrize("name", NAMES)
def test_config_path_with_markup(tmp_path, name):
    d = tmp_path / name / "cfg"
    d.mkdir(parents=True)
    cfg = d / "my.yaml"
    shutil.copy(TEMPLATE, cfg)
    _ok(mftk("validate-config", str(cfg), "--no-check-files"), f"✓ valid: {cfg}")
    r = mftk("validate-config", str(d / "missing.yaml"))
    assert_clean_failure(r, 2, f"config file not found: {d / 'missing.yaml'}")


def test_yaml_keys_with_markup(tmp_path):
    raw = yaml.safe_load(TEMPLATE.read_text())
    raw["[/]top"] = 1  # an unknown top-level key: a warning that names it
    raw["training"]["[bold]steps[/bold]"] = 3  # an unknown key in a strict section: an error that names it
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    r = mftk("validate-config", str(cfg), "--no-check-files")
    assert_clean_failure(r, 1, "training.[bold]steps[/bold]", "unknown key", "[/]top")
    r = mftk("validate-config", str(TEMPLATE), "--no-check-files", "--set", "[final]=1")
    assert_clean_failure(r, 2, "--set [final]=1: '[final]' names no setting")  # an ignored override is an error


@pytest.fixture
def marked_ckpt(tmp_path):
    """A checkpoint under a dir named ``[/]`` whose tensors are named with markup."""
    root = tmp_path / "[/]" / "[final]"
    d = mf_step_dir(root)
    write(d / "checkpoint-model-0000000-0000001.safetensors",
          [("w[/]", "F32", [2], f32(1, 2)), ("[bold]b", "F32", [1], f32(3))])
    write(d / "checkpoint-opt-0000000-0000001.safetensors",
          [("adam_m.w[/]", "F32", [2], f32(0, 0)), ("adam_v.w[/]", "F32", [2], f32(0, 0))])
    return d


def test_inspect_names_and_paths_with_markup(marked_ckpt):
    out = _ok(mftk("inspect-ckpt", str(marked_ckpt), "--verify", "--tensors"), "w[/]", "[bold]b", "adam_m.w[/]")
    assert str(marked_ckpt) in out.replace("\n", "")


def test_diff_names_and_paths_with_markup(marked_ckpt, tmp_path):
    other = mf_step_dir(tmp_path / "[red]other")
    _ok(mftk("inspect-ckpt", str(marked_ckpt), "--diff", str(other)), "w[/]", "[bold]b", "[red]other")


def test_problems_naming_markup_files(marked_ckpt):
    (marked_ckpt / "common.json").write_text("{")
    r = mftk("inspect-ckpt", str(marked_ckpt), "--verify")
    assert_clean_failure(r, 1, f"{marked_ckpt / 'common.json'}: not valid JSON")


def test_parse_log_paths_metrics_and_warnings_with_markup(tmp_path):
    d = tmp_path / "[/]run" / "[final]"
    d.mkdir(parents=True)
    log = d / "worker_0.log"
    log.write_bytes(("\n".join(synth_lines(12)) + "\n").encode() + b"\0" * 64)  # a NUL tail: a warning naming it
    _ok(mftk("parse-log", str(log)), str(log), "NUL byte(s) skipped")
    r = mftk("parse-log", str(log), "--metrics", "loss,[/]")
    assert_clean_failure(r, 2, "--metrics: [/] not in the log")
    r = mftk("parse-log", str(log), "--csv", str(d / "[x].csv"))
    _ok(r, f"wrote {d / '[x].csv'}")
    assert (d / "[x].csv").is_file()


@pytest.mark.parametrize("text", ["[/]", "tp2.[red]", "[bold]dps4"])
def test_explain_values_with_markup(text):
    r = mftk("plan-parallel", str(TEMPLATE), "--world-size", "8", "--explain", text)
    assert_clean_failure(r, 2, f"cannot read layout '{text}'")


def test_plan_config_in_a_markup_dir(tmp_path):
    cfg = tmp_path / "[final]" / "c.yaml"
    cfg.parent.mkdir()
    shutil.copy(TEMPLATE, cfg)  # its relative data path is looked for next to it: a warning naming the dir
    r = mftk("plan-parallel", str(cfg), "--world-size", "2")
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr and "MarkupError" not in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.engine
def test_train_and_resume_with_markup_paths(tmp_path, corpus):
    d = tmp_path / "[/]" / "[final]"
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt", steps=2)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = _ok(mftk("train", str(cfg), "--output-dir", str(d / "out")), "trained steps 1..2 of 2")
    assert f"checkpoint: {d / 'ckpt' / 'iteration_00000002'}" in flat(out)
    _ok(mftk("resume", str(cfg), "--dry-run"), str(d / "ckpt" / "iteration_00000002"))
