"""`mftk preprocess --format mindrecord` through the CLI: exit codes, stdout (table, YAML block, JSON), stderr."""
from __future__ import annotations

import json

import yaml

import pytest
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.data import CORPUS, make_tokenizer

pytestmark = pytest.mark.engine  # the mindrecord path imports mindspore



def flat(text):
    return " ".join(text.split())


def _setup(tmp_path):
    make_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS[:8]))
    return tmp_path


def test_mindrecord_table_json_and_yaml_block(tmp_path):
    d = _setup(tmp_path)
    args = ["preprocess", "-i", str(d / "a.jsonl"), "-o", str(d / "out"), "-t", str(d), "--append-eod",
            "--format", "mindrecord", "--seq-length", "16"]
    r = runner.invoke(app, args, terminal_width=200)
    assert r.exit_code == 0, r.output
    path = f"{d}/out_text.mindrecord"
    assert "samples" in r.stdout and "dropped tokens" in r.stdout and "17 tokens per sample" in r.stdout
    snippet = r.stdout[r.stdout.index("train_dataset:"):]  # valid YAML, nested under its section
    assert yaml.safe_load(snippet) == {"train_dataset": {"dataloader": {"type": "MindDataset",
                                                                        "dataset_files": [str(path)]}}}
    r = runner.invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    out = data["sources"][0]["outputs"][0]
    assert data["format"] == "mindrecord" and data["seq_length"] == 16 and out["prefix"] == path
    assert out["tokens"] == out["sequences"] * 17 and 0 <= out["dropped_tokens"] < 17


def test_mindrecord_needs_seq_length_exit_2(tmp_path):
    d = _setup(tmp_path)
    r = runner.invoke(app, ["preprocess", "-i", str(d / "a.jsonl"), "-o", str(d / "out"), "-t", str(d),
                            "--format", "mindrecord"])
    assert r.exit_code == 2
    assert "--format mindrecord needs --seq-length" in flat(r.stderr) and r.stdout == ""


def test_too_little_data_exit_1(tmp_path):
    d = _setup(tmp_path)
    r = runner.invoke(app, ["preprocess", "-i", str(d / "a.jsonl"), "-o", str(d / "out"), "-t", str(d),
                            "--format", "mindrecord", "--seq-length", "100000"])
    assert r.exit_code == 1
    assert "fewer than one sample of seq_length + 1 = 100001 tokens" in flat(r.stderr)
    assert "lower --seq-length" in flat(r.stderr)
    assert not list(d.glob("out*")) and not list(d.glob(".out*"))
