"""Faults around the step end a run with a save and a clear message, never a traceback (issue 34, part B):
a log folder that fills up, a data file truncated while the run reads it. One process, the tiny Qwen3."""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
import yaml

from mftk.ckpt.verify import check_step_dir
from mftk.logs.format import MetricsFileSink
from tests.helpers.cli import runner
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = pytest.mark.engine


def _config(tmp_path, corpus, steps=12):
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ckpt", steps=steps)
    raw["checkpoint"]["save_interleaved_steps"] = 100  # only the fault's save, and the final one
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


def _at_step(monkeypatch, step, action):
    """Run ``action`` once, as step ``step`` is reported (before its metrics line is written)."""
    real = MetricsFileSink.on_step

    def on_step(self, metrics):
        if metrics["step"] == step:
            action()
        real(self, metrics)

    monkeypatch.setattr(MetricsFileSink, "on_step", on_step)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only; skipped where it cannot be mounted)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if not shutil.which("mount") or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                                                   capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt):
    """Write a filler file until the filesystem is full (ENOSPC)."""
    with open(mnt / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 1024)
        except OSError:
            pass
    try:
        with open(mnt / "filler2", "wb", buffering=0) as f:
            while True:
                f.write(b"\0")
    except OSError:
        pass


@pytest.mark.slow
def test_full_log_folder_saves_and_stops_with_a_message(tmp_path, corpus, tiny_tmpfs, monkeypatch):
    from commands.app import app

    cfg = _config(tmp_path, corpus)
    _at_step(monkeypatch, 2, lambda: _fill(tiny_tmpfs))
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tiny_tmpfs / "out")])
    assert r.exit_code == 4, r.output
    assert "No space left on device" in r.stderr and "log folder is full or not writable" in r.stderr
    assert "Traceback" not in r.output and "Logging error" not in r.output
    saved = sorted((tmp_path / "ckpt").glob("iteration_*"))
    assert len(saved) == 1 and f"checkpoint saved to {saved[0]}" in " ".join(r.stderr.split())
    step = int(saved[0].name.split("_")[1])
    assert 2 <= step < 12 and f"stopped after step {step}" in r.stderr
    assert check_step_dir(saved[0]).ok
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == str(step)


@pytest.mark.slow
def test_data_file_truncated_mid_run_is_named_after_a_save(tmp_path, monkeypatch):
    from commands.app import app

    corpus = write_corpus(tmp_path / "data" / "tiny_text_document")  # this test's own copy: it is damaged
    cfg = _config(tmp_path, corpus)
    bin_path = str(corpus) + ".bin"
    size = os.path.getsize(bin_path)
    _at_step(monkeypatch, 3, lambda: os.truncate(bin_path, size // 2))
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    err = " ".join(r.stderr.split())
    assert f"{bin_path}: changed while the run was reading it (truncated from {size} to {size // 2} bytes)" in err
    assert "stopped after step 3" in err and "Traceback" not in r.output
    assert check_step_dir(tmp_path / "ckpt" / "iteration_00000003").ok


def test_loader_names_a_changed_data_file_before_reading(tmp_path):
    """The check before every micro-batch: truncated, rewritten in place, replaced by another file."""
    from mftk.data.indexed import IndexedDataset
    from mftk.errors import DataFormatError

    prefix = write_corpus(tmp_path / "c")
    ds = IndexedDataset(prefix)
    ds.check_unchanged()
    bin_path = tmp_path / "c.bin"
    data = bin_path.read_bytes()
    os.truncate(bin_path, 100)
    with pytest.raises(DataFormatError) as e:
        ds.check_unchanged()
    assert e.value.path == str(bin_path) and f"truncated from {len(data)} to 100 bytes" in e.value.message
    with pytest.raises(DataFormatError, match="truncated from"):  # a read past the new end: no SIGBUS
        ds.get(len(ds) - 1)
    replacement = tmp_path / "other.bin"
    replacement.write_bytes(data)
    os.replace(replacement, bin_path)
    with pytest.raises(DataFormatError, match="replaced by another file"):
        ds.check_unchanged()
    fresh = IndexedDataset(prefix)
    np.testing.assert_array_equal(fresh.get(0), np.frombuffer(data, np.uint16)[:len(fresh.get(0))])


def test_log_write_failures_are_kept_for_the_trainer_not_printed(capsys):
    """/dev/full fails every write with ENOSPC: the handler keeps the failure (no 'Logging error' traceback on
    stderr at every line) and closes without raising."""
    from mftk.logs.sinks import FileLogHandler, detach, log, write_failure

    h = FileLogHandler("/dev/full")
    log.addHandler(h)
    try:
        log.info("a line that cannot be written")
        log.info("and another")
        assert write_failure() == "cannot write /dev/full: No space left on device"
    finally:
        detach(h)
    assert "Logging error" not in capsys.readouterr().err
    assert write_failure() is None  # detached: no longer the run's
