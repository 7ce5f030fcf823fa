"""Unbounded reads (issue 21, item 4): every file mftk reads is a regular file of bounded size.

``/dev/zero`` would be read forever, a FIFO would block ``open`` forever, a symlink to either is the
same; a shard symlinked from another step would pass every header check. Each case runs the command
a user would run, under a timeout (a hang fails), and checks the exit code, that no traceback is
printed, that the message names the file and what it is, and that nothing was written.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mftk.ckpt.inspect import inspect_checkpoint
from mftk.ckpt.layout import scan_step_dir
from mftk.errors import CheckpointError, InputError
from mftk.files import CONFIG_LIMIT, read_bytes, read_json, read_text
from tests.helpers.handmade import mf_step_dir
from tests.helpers.hostile import ROOT, assert_clean_failure, mftk

TEMPLATE = ROOT / "templates" / "qwen3_tiny.yaml"
QUICK = 60  # seconds: every refusal here is immediate; a hang (FIFO) or an endless read runs into this


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


def _link_to_zero(path: Path) -> Path:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")
    return path


# -- the config ------------------------------------------------------------------------------------

def test_dev_zero_as_config_is_refused_at_once():
    r = mftk("validate-config", "/dev/zero", timeout=QUICK)
    assert_clean_failure(r, 2, "/dev/zero: the config file is a character device, not a regular file")


def test_fifo_as_config_does_not_block(fifo):
    r = mftk("validate-config", str(fifo), timeout=QUICK)
    assert_clean_failure(r, 2, f"{fifo}: the config file is a FIFO (named pipe), not a regular file")


def test_symlink_to_dev_zero_as_config_for_train(tmp_path):
    link = _link_to_zero(tmp_path / "my.yaml")
    r = mftk("train", str(link), "--output-dir", str(tmp_path / "out"), timeout=QUICK)
    assert_clean_failure(r, 2, f"{link}: the config file is a character device")
    assert not (tmp_path / "out").exists()


def test_oversized_config_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(CONFIG_LIMIT + 1)  # sparse: costs no disk
    r = mftk("validate-config", str(big), timeout=QUICK)
    assert_clean_failure(r, 2, f"{big}: the config file is 16 MiB, over the 16 MiB limit")


def test_directory_as_config(tmp_path):
    r = mftk("validate-config", str(tmp_path), timeout=QUICK)
    assert_clean_failure(r, 2, f"{tmp_path} is a directory, not a YAML file")


def test_bounded_read_stops_at_the_limit_even_if_the_file_grows(tmp_path):
    """The size check is made on the open file and the read itself stops at limit + 1."""
    f = tmp_path / "x.json"
    f.write_bytes(b"1" * 100)
    assert read_bytes(f, limit=100) == b"1" * 100
    with pytest.raises(InputError, match="over the 99 bytes limit"):
        read_bytes(f, limit=99)
    with pytest.raises(FileNotFoundError):  # the caller words a missing file itself
        read_text(tmp_path / "none", limit=10)
    f.write_text("{")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_json(f, limit=1000, error=CheckpointError)


# -- checkpoint files ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["common.json", "metadata.json", "mftk-state-0000000-0000001.json"])
def test_checkpoint_json_symlinked_to_dev_zero(tmp_path, name):
    d = mf_step_dir(tmp_path / "ckpt")
    (d / "mftk-state-0000000-0000001.json").write_text("{}")
    link = _link_to_zero(d / name)
    r = mftk("inspect-ckpt", str(d), "--verify", timeout=QUICK)
    assert_clean_failure(r, 1, f"{link}: the", "is a character device, not a regular file")


def test_tracker_symlinked_to_dev_zero(tmp_path):
    mf_step_dir(tmp_path / "ckpt")
    _link_to_zero(tmp_path / "ckpt" / "latest_checkpointed_iteration.txt")
    r = mftk("inspect-ckpt", str(tmp_path / "ckpt"), timeout=QUICK)
    assert_clean_failure(r, 1, "latest_checkpointed_iteration.txt: the tracker file is a character device")


def test_saved_run_config_symlinked_to_dev_zero(tmp_path):
    d = mf_step_dir(tmp_path / "ckpt")
    _link_to_zero(d / "mftk-config.json")
    r = mftk("inspect-ckpt", str(d), "--export-hf", str(tmp_path / "hf"), timeout=QUICK)
    assert_clean_failure(r, 1, "mftk-config.json: the mftk-config.json is a character device")
    assert not (tmp_path / "hf").exists()


def test_shard_that_is_a_fifo_does_not_block_verify(tmp_path):
    d = mf_step_dir(tmp_path / "ckpt")
    shard = d / "checkpoint-opt-0000000-0000001.safetensors"
    shard.unlink()
    os.mkfifo(shard)
    r = mftk("inspect-ckpt", str(d), "--verify", timeout=QUICK)
    assert_clean_failure(r, 1, "checkpoint-opt-0000000-0000001.safetensors: a FIFO (named pipe), not a regular file")


def test_symlinked_shard_of_another_step_fails_verify(tmp_path):
    root = tmp_path / "ckpt"
    mf_step_dir(root, step=4)
    later = mf_step_dir(root, step=6)
    shard = later / "checkpoint-model-0000000-0000001.safetensors"
    shard.unlink()
    shard.symlink_to(Path("..") / "iteration_00000004" / shard.name)  # same shapes: every header check passes
    r = mftk("inspect-ckpt", str(later), "--verify", timeout=QUICK)
    assert_clean_failure(r, 1, f"{shard.name}: a symlink to {root / 'iteration_00000004' / shard.name}, "
                         "outside this checkpoint dir")
    from mftk.ckpt.load import load_global

    with pytest.raises(CheckpointError) as e:  # and nothing loads it as this step's weights
        load_global(later)
    assert any("outside this checkpoint dir" in p for p in e.value.problems)
    assert inspect_checkpoint(root / "iteration_00000004", verify=True).problems == []


def test_a_symlinked_save_root_is_fine(tmp_path):
    """Only a file leaving its step dir is refused: the whole tree may live behind a link."""
    mf_step_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert scan_step_dir(tmp_path / "link" / "iteration_00000004").problems == ()
    r = mftk("inspect-ckpt", str(tmp_path / "link"), "--verify", timeout=QUICK)
    assert r.returncode == 0, r.stderr


# -- Hugging Face files, logs, tokenizers -----------------------------------------------------------

def test_hf_config_symlinked_to_dev_zero(tmp_path):
    link = _link_to_zero(tmp_path / "config.json")
    r = mftk("validate-config", "--model-from-hf", str(tmp_path), timeout=QUICK)
    assert_clean_failure(r, 2, f"{link}: the config.json is a character device")


def test_hf_index_symlinked_to_dev_zero(tmp_path):
    shutil.copy(mf_step_dir(tmp_path / "x") / "checkpoint-model-0000000-0000001.safetensors",
                tmp_path / "model-00001-of-00001.safetensors")
    _link_to_zero(tmp_path / "model.safetensors.index.json")
    r = mftk("inspect-ckpt", str(tmp_path), "--verify", timeout=QUICK)
    assert_clean_failure(r, 1, "model.safetensors.index.json: the index file is a character device")


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_log_that_is_not_a_regular_file(tmp_path, kind):
    log = tmp_path / "worker_0.log"
    os.mkfifo(log) if kind == "fifo" else _link_to_zero(log)
    r = mftk("parse-log", str(log), timeout=QUICK)
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    assert_clean_failure(r, 2, f"{log}: the log file is {what}, not a regular file")


def test_tokenizer_symlinked_to_dev_zero(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"text": "hello"}) + "\n")
    tok = _link_to_zero(tmp_path / "tokenizer.json")
    r = mftk("preprocess", "-i", str(src), "-o", str(tmp_path / "out"), "-t", str(tok), timeout=QUICK)
    assert_clean_failure(r, 2, f"{tok}: the tokenizer file is a character device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "tokenizer.json"]


def test_data_file_symlinked_to_dev_zero(tmp_path, corpus):
    """A .bin/.idx prefix that is not a regular file: the data check names it (mmap of a device is refused)."""
    from mftk.data.indexed import IndexedDataset

    for ext in ("bin", "idx"):
        shutil.copy(f"{corpus}.{ext}", tmp_path / f"d.{ext}")
    _link_to_zero(tmp_path / "d.idx")
    with pytest.raises(InputError, match=r"d\.idx: the \.idx file is a character device"):
        IndexedDataset(tmp_path / "d")
