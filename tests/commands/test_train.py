"""`mftk train` through the CLI: validation first, step lines on stdout, files on disk, exit codes."""
from __future__ import annotations

import re

import pytest
import yaml
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.tiny import tiny_raw



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
                            "--set", "parallelism.pipeline_parallel=2", "--set", "model.hidden_dropout=0.1"])
    assert r.exit_code == 1, r.output
    assert "model.hidden_dropout" in r.stderr and "hidden_dropout must be 0" in r.stderr
    assert not (tmp_path / "out").exists()  # no worker was started


def test_missing_config_file(tmp_path):
    r = runner.invoke(app, ["train", str(tmp_path / "nope.yaml")])
    assert r.exit_code in (1, 2) and "nope.yaml" in r.stderr


def _another_runs_checkpoints(save_path):
    """iteration_* dirs and a tracker left by another run (written without mftk)."""
    from tests.helpers.handmade import mf_step_dir

    for step in (100, 200):
        mf_step_dir(save_path, step=step)
    (save_path / "latest_checkpointed_iteration.txt").write_text("200")
    return {p.name: sorted(f.name for f in p.iterdir()) for p in save_path.iterdir() if p.is_dir()}


@pytest.mark.engine
def test_fresh_train_over_another_runs_checkpoints_is_refused(tmp_path, corpus):
    cfg = write_config(tmp_path, corpus, steps=2, gbs=1)
    before = _another_runs_checkpoints(tmp_path / "ckpt")
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    assert "step 200" in r.stderr and "mftk resume" in r.stderr and "--new-run" in r.stderr
    assert "Traceback" not in r.output
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "200"
    assert {p.name: sorted(f.name for f in p.iterdir()) for p in (tmp_path / "ckpt").iterdir() if p.is_dir()} == before


@pytest.mark.engine
def test_new_run_with_save_max_keeps_every_dir_of_the_earlier_run(tmp_path, corpus):
    # save_max 1 with saves at 2, 4, 6: this run keeps only its newest, the earlier run's 100 and 200 all stay
    cfg = write_config(tmp_path, corpus, steps=6, gbs=1)
    before = _another_runs_checkpoints(tmp_path / "ckpt")
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out"), "--new-run",
                            "--set", "checkpoint.save_max=1"])
    assert r.exit_code == 0, r.output
    dirs = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.is_dir())
    assert dirs == ["iteration_00000006", "iteration_00000100", "iteration_00000200"]
    for name, files in before.items():
        assert sorted(f.name for f in (tmp_path / "ckpt" / name).iterdir()) == files
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "6"


@pytest.mark.engine
def test_new_run_refuses_when_an_existing_dir_lies_on_its_path(tmp_path, corpus):
    from tests.helpers.handmade import mf_step_dir

    cfg = write_config(tmp_path, corpus, steps=4, gbs=1)
    mf_step_dir(tmp_path / "ckpt", step=4)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("4")
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out"), "--new-run"])
    assert r.exit_code == 1 and "iteration_00000004" in r.stderr and "never deletes" in r.stderr
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["iteration_00000004",
                                                                    "latest_checkpointed_iteration.txt"]
