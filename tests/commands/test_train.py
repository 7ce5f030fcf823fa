"""`mftk train` through the CLI: validation first, step lines on stdout, files on disk, exit codes."""
from __future__ import annotations

import re

import pytest
import yaml
from typer.testing import CliRunner

from commands.app import app
from tests.engine.tiny import tiny_raw, write_corpus

runner = CliRunner()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "tiny_text_document")


def write_config(tmp_path, corpus, **kw):
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ckpt", **kw)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.engine
def test_train_runs_and_logs(tmp_path, corpus):
    cfg = write_config(tmp_path, corpus, steps=2, gbs=1)
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out"), "--set", "training.steps=3"])
    assert r.exit_code == 0, r.output
    lines = [l for l in r.stdout.splitlines() if "{ step:[" in l]
    assert len(lines) == 3 and all(re.search(r"loss:\s+(\d+\.\d+)", l) for l in lines)
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - mindformers\[mindformers/pynative/callback/"
                    r"loss_callback.py:337\] - INFO - \{ step:\[    1/    3\]", lines[0])
    assert (tmp_path / "out" / "log" / "rank_0" / "info.log").is_file()
    assert (tmp_path / "out" / "log" / "rank_0" / "metrics.jsonl").is_file()
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert "checkpoint:" in r.stdout


def test_invalid_config_never_starts(tmp_path, corpus):
    cfg = write_config(tmp_path, corpus)
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out"),
                            "--set", "training.global_batch_size=0", "--set", "optimizer.betas=[2, 0.9]"])
    assert r.exit_code == 1
    assert "training.global_batch_size" in r.stderr and "optimizer.betas" in r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "ckpt").exists()


def test_missing_data_files(tmp_path, corpus):
    cfg = write_config(tmp_path, tmp_path / "no_such_prefix")
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 1 and "no_such_prefix" in r.stderr
    assert not (tmp_path / "out").exists()


def test_model_parallel_degrees_are_refused_before_launch(tmp_path, corpus):
    cfg = write_config(tmp_path, corpus)
    r = runner.invoke(app, ["train", str(cfg), "--nproc", "2", "--output-dir", str(tmp_path / "out"),
                            "--set", "parallelism.pipeline_parallel=2", "--set", "model.tie_word_embeddings=true"])
    assert r.exit_code == 1, r.output
    assert "parallelism.pipeline_parallel" in r.stderr and "tie_word_embeddings" in r.stderr
    assert "not supported yet" in r.stderr
    assert not (tmp_path / "out").exists()  # no worker was started


def test_missing_config_file(tmp_path):
    r = runner.invoke(app, ["train", str(tmp_path / "nope.yaml")])
    assert r.exit_code in (1, 2) and "nope.yaml" in r.stderr
