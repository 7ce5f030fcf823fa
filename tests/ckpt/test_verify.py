"""Checksums in saved checkpoints: recorded at save time, checked by `mftk.ckpt.verify`, and the resume's
choice of the newest checkpoint that verifies (`mftk.ckpt.resume.select_checkpoint`)."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from safetensors.numpy import load_file

from mftk.ckpt import safetensors_io as st
from mftk.ckpt.layout import locate
from mftk.ckpt.resume import select_checkpoint
from mftk.ckpt.verify import check_file, check_step_dir
from mftk.errors import CheckpointError

from tests.helpers.damage import MODEL, flip_exponent_bit, save_small as _save, write_nan
from tests.helpers.handmade import mf_step_dir


def test_saved_files_record_zlib_crc32_of_each_tensor(tmp_path):
    """The record is zlib's CRC-32 of the bytes the safetensors package reads back (an independent reader)."""
    _save(tmp_path, 2)
    for name in (MODEL, "checkpoint-opt-0000000-0000001.safetensors"):
        path = tmp_path / "iteration_00000002" / name
        sums = json.loads(st.read_header(path).metadata[st.CHECKSUM_KEY])
        back = load_file(str(path))
        assert sums == {k: f"{zlib.crc32(v.tobytes()):08x}" for k, v in back.items()}
    assert check_step_dir(tmp_path / "iteration_00000002").ok


def test_flipped_exponent_bit_fails_the_checksum_though_finite(tmp_path):
    _save(tmp_path, 2)
    path = tmp_path / "iteration_00000002" / MODEL
    flip_exponent_bit(path, "w", 5)
    w = load_file(str(path))["w"]
    assert np.isfinite(w).all() and w.max() > 1e30  # no NaN/Inf scan could see this
    problems = check_file(path).problems
    assert len(problems) == 1 and problems[0].startswith(f"{MODEL}: w: checksum mismatch")


def test_nan_in_a_saved_weight_is_caught(tmp_path):
    _save(tmp_path, 2)
    path = tmp_path / "iteration_00000002" / MODEL
    write_nan(path, "w")
    assert [p.split(" (")[0] for p in check_file(path).problems] == [f"{MODEL}: w: checksum mismatch"]


def test_file_without_checksums_is_checked_for_nan_only_with_a_note(tmp_path):
    d = mf_step_dir(tmp_path, step=4)  # written by hand, as an older mftk or the reference would
    check = check_step_dir(d)
    assert check.ok and set(check.unchecksummed) == {MODEL, "checkpoint-opt-0000000-0000001.safetensors"}
    assert "carry no checksums" in check.note()
    write_nan(d / MODEL, "w", 1)
    assert check_step_dir(d).problems == (f"{MODEL}: w: holds NaN or infinity",)


def test_resume_selection_falls_back_to_the_newest_that_verifies(tmp_path):
    for step in (2, 4, 6):
        _save(tmp_path, step)
    flip_exponent_bit(tmp_path / "iteration_00000006" / MODEL, "w")
    write_nan(tmp_path / "iteration_00000004" / MODEL, "w", 3)
    chosen = select_checkpoint(locate(tmp_path))
    assert chosen.step_dir.name == "iteration_00000002"
    assert len(chosen.skipped) == 2
    assert chosen.skipped[0].startswith(f"skipped iteration_00000006: {MODEL}: w: checksum mismatch")
    assert chosen.skipped[1].startswith(f"skipped iteration_00000004: {MODEL}: w: checksum mismatch")


def test_no_checkpoint_left_names_tensor_and_file(tmp_path):
    for step in (2, 4):
        _save(tmp_path, step)
        flip_exponent_bit(tmp_path / f"iteration_{step:08d}" / MODEL, "w")
    with pytest.raises(CheckpointError) as e:
        select_checkpoint(locate(tmp_path))
    assert "no checkpoint in" in e.value.message and "(2 checked)" in e.value.message
    assert f"iteration_00000004: {MODEL}: w: checksum mismatch" in e.value.message
    assert any(p.startswith(f"iteration_00000002: {MODEL}: w:") for p in e.value.problems)


def test_an_explicit_step_dir_has_no_fallback(tmp_path):
    for step in (2, 4):
        _save(tmp_path, step)
    flip_exponent_bit(tmp_path / "iteration_00000004" / MODEL, "w")
    with pytest.raises(CheckpointError) as e:
        select_checkpoint(locate(tmp_path / "iteration_00000004"))
    assert "does not verify" in e.value.message and f"{MODEL}: w: checksum mismatch" in e.value.message
