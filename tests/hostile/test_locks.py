"""Two writers of one output (issue 21, item 2): a checkpoint ``save_path`` and an ``--export-hf`` dir.

The run that owns the output holds ``<output>.lock`` (`mftk.lock`) for as long as it writes: a
single-process run itself, an msrun job's parent (so the second job is refused before a worker
starts). A second run is refused with exit 2 and an error naming the holder, and writes nothing:
no log line into the first run's files, no checkpoint, no lock left behind.
(The preprocess output prefix is in ``test_preprocess.py``.)
"""
from __future__ import annotations

import signal
import socket
import time

import pytest
import yaml

from mftk.ckpt.export import EXPORT_WHAT
from mftk.ckpt.guard import SAVE_LOCK_WHAT
from tests.helpers.handmade import mf_step_dir
from tests.helpers.hostile import assert_clean_failure, hold, mftk, release, start_mftk
from tests.helpers.tiny import tiny_raw

pytestmark = pytest.mark.engine


@pytest.fixture
def cfg(tmp_path, corpus):
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ckpt", steps=2)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _refused(r, output, holder_pid: int) -> None:
    assert_clean_failure(r, 2, f"{output}: another run is writing this output: pid {holder_pid} on host "
                         f"{socket.gethostname()}, started", f"({SAVE_LOCK_WHAT})", "wait for it to finish")


@pytest.mark.parametrize("command", [["train"], ["resume", "--from", "SAVE"], ["train", "--nproc", "2"]],
                         ids=["train", "resume", "train-nproc2"])
def test_a_second_run_on_a_held_save_path_is_refused(tmp_path, cfg, command):
    save = tmp_path / "ckpt"
    if "resume" in command:
        mf_step_dir(save)
    holder = hold(save, SAVE_LOCK_WHAT)
    try:
        before = sorted(p.name for p in save.iterdir()) if save.exists() else []
        args = [a if a != "SAVE" else str(save) for a in command]
        r = mftk(*args, str(cfg), "--output-dir", str(tmp_path / "out"))
        _refused(r, save, holder.pid)
        assert not (tmp_path / "out").exists()  # no log, no msrun_log: refused before anything started
        assert (sorted(p.name for p in save.iterdir()) if save.exists() else []) == before
    finally:
        release(holder)
    assert not (tmp_path / "ckpt.lock").exists()


def test_export_into_a_held_directory_is_refused(tmp_path):
    d = mf_step_dir(tmp_path / "ckpt")
    out = tmp_path / "hf"
    holder = hold(out, EXPORT_WHAT)
    try:
        r = mftk("inspect-ckpt", str(d), "--export-hf", str(out))
        assert_clean_failure(r, 2, f"{out}: another run is writing this output: pid {holder.pid}", f"({EXPORT_WHAT})")
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "hf.lock"]
    finally:
        release(holder)


@pytest.mark.slow
def test_two_real_train_runs_on_one_save_path(tmp_path, corpus):
    """Run A trains; run B on the same save_path is refused naming A; A stops on SIGTERM (save, exit 75)
    and its lock goes with it."""
    save = tmp_path / "ckpt"
    raw = tiny_raw("qwen3_tiny.yaml", corpus, save, steps=10_000)
    raw["checkpoint"]["save_interleaved_steps"] = 10_000
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    a = start_mftk("train", str(cfg), "--output-dir", str(tmp_path / "a"))
    try:
        log = tmp_path / "a" / "log" / "rank_0" / "info.log"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and "{ step:[" not in (log.read_text() if log.exists() else ""):
            time.sleep(0.3)
        assert a.poll() is None, a.communicate()
        b = mftk("train", str(cfg), "--output-dir", str(tmp_path / "b"))
        _refused(b, save, a.pid)
        assert not (tmp_path / "b").exists()
        a.send_signal(signal.SIGTERM)
        out, err = a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 75, err
    assert "SIGTERM received: stopped after step" in err and "checkpoint saved to" in err and "Traceback" not in err
    tracked = int((save / "latest_checkpointed_iteration.txt").read_text())
    assert (save / f"iteration_{tracked:08d}").is_dir() and tracked >= 1
    assert not (tmp_path / "ckpt.lock").exists()
