import errno
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from mftk.ckpt import safetensors_io
from mftk.ckpt.common import CommonInfo
from mftk.ckpt.layout import TRACKER, iteration_dirs, locate
from mftk.ckpt.load import load_global, load_rank
from mftk.ckpt.metadata import ShardedTensor, build_metadata
from mftk.ckpt.save import (Retention, begin_save, finalize_save, save_checkpoint, temp_dir_for,
                            write_rank_files)
from mftk.errors import CheckpointError

from tests.helpers.handmade import mf_step_dir


def _common(step, gbs=2):
    return CommonInfo.for_step(step=step, max_steps=10, global_batch_size=gbs, consumed_samples=step * gbs)


def _save(root, step, **kw):
    model = {"w": np.full((2, 2), float(step), np.float32), "b": safetensors_io.to_bf16(np.array([0.5, -1.0], np.float32))}
    opt = {"adam_m.w": np.zeros((2, 2), np.float32), "global_step": np.array([step], np.int64)}
    return save_checkpoint(root, step=step, common=_common(step), model=model, optimizer=opt, **kw)


def test_layout_on_disk_and_read_back_independently(tmp_path):
    saved = _save(tmp_path, 3, extra={"rng": np.arange(5, dtype=np.uint32), "epoch_pos": 7})
    d = tmp_path / "iteration_00000003"
    assert saved.path == str(d)
    assert sorted(os.listdir(d)) == ["checkpoint-model-0000000-0000001.safetensors",
                                     "checkpoint-opt-0000000-0000001.safetensors", "common.json",
                                     "mftk-state-0000000-0000001.json"]
    assert (tmp_path / TRACKER).read_bytes() == b"3"
    opt = load_file(str(d / "checkpoint-opt-0000000-0000001.safetensors"))
    assert opt["global_step"].dtype == np.int64 and opt["global_step"].tolist() == [3]
    assert json.loads((d / "common.json").read_text())["consumed_samples"] == 6
    assert oct(os.stat(d).st_mode & 0o777) == "0o750"
    assert oct(os.stat(d / "common.json").st_mode & 0o777) == "0o640"
    back = load_rank(tmp_path)
    assert back.model["b"].tolist() == [0.5, -1.0] and back.model["w"].tolist() == [[3, 3], [3, 3]]
    assert back.extra["rng"].dtype == np.uint32 and back.extra["rng"].tolist() == [0, 1, 2, 3, 4]
    assert back.extra["epoch_pos"] == 7 and back.common.global_step == 3
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def _earlier_run(root, *steps):
    """Iteration dirs an earlier run left under ``root`` (written by hand, not through `Retention`)."""
    for step in steps:
        mf_step_dir(root, step=step)


def test_retention_never_removes_another_runs_dirs(tmp_path):
    _earlier_run(tmp_path, 1, 2, 7)
    keep = Retention(str(tmp_path), save_max=2)
    removed = []
    for s in (3, 4, 5, 6):
        _save(tmp_path, s)
        removed += keep.record(s)
    # this run saved 3..6 and keeps its newest two; the earlier run's 1, 2 and 7 are all still there
    assert list(iteration_dirs(tmp_path)) == [1, 2, 5, 6, 7]
    assert removed == [str(tmp_path / "iteration_00000003"), str(tmp_path / "iteration_00000004")]


def test_retention_off_and_vanished_dirs(tmp_path):
    keep = Retention(str(tmp_path), save_max=None)
    for s in (1, 2, 3):
        _save(tmp_path, s)
        assert keep.record(s) == []
    assert list(iteration_dirs(tmp_path)) == [1, 2, 3]
    # a dir of this run that someone removed is forgotten, and pruning goes on (the reference stops for good)
    keep = Retention(str(tmp_path), save_max=1, saved=[1, 2])
    import shutil

    shutil.rmtree(tmp_path / "iteration_00000001")
    assert keep.record(3) == [str(tmp_path / "iteration_00000002")]
    _save(tmp_path, 4)
    assert keep.record(4) == [str(tmp_path / "iteration_00000003")] and keep.saved == [4]


def test_retention_never_removes_the_tracked_dir(tmp_path):
    keep = Retention(str(tmp_path), save_max=1)
    _save(tmp_path, 9)
    keep.record(9)
    _save(tmp_path, 1)
    (tmp_path / TRACKER).write_text("9")  # the tracker still names 9 (e.g. the user reset it by hand)
    assert keep.record(1) == [] and list(iteration_dirs(tmp_path)) == [1, 9]


def test_disk_full_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    _save(tmp_path, 2)
    before = {p.name: p.read_bytes() for p in (tmp_path / "iteration_00000002").iterdir()}
    calls = {"n": 0}
    real = safetensors_io.write_all

    def full(fh, data):
        calls["n"] += 1
        if calls["n"] == 3:  # fail in the middle of the model file
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fh, data)

    monkeypatch.setattr(safetensors_io, "write_all", full)
    with pytest.raises(CheckpointError) as e:
        _save(tmp_path, 4)
    assert "No space left on device" in e.value.message and "free disk space" in e.value.hint
    assert (tmp_path / TRACKER).read_text() == "2" and locate(tmp_path).step == 2
    assert list(iteration_dirs(tmp_path)) == [2] and not temp_dir_for(tmp_path, 4).exists()
    assert {p.name: p.read_bytes() for p in (tmp_path / "iteration_00000002").iterdir()} == before


@pytest.mark.parametrize("target,file", [(b'{\n    "epoch_num"', "common.json"), (b"4", TRACKER)])
def test_disk_full_on_common_json_and_tracker(tmp_path, monkeypatch, target, file):
    _save(tmp_path, 2)
    real = safetensors_io.write_all

    def full(fh, data):
        if bytes(data).startswith(target) and len(data) < 200:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fh, data)

    monkeypatch.setattr(safetensors_io, "write_all", full)
    with pytest.raises(CheckpointError) as e:
        _save(tmp_path, 4)
    assert file in e.value.message
    assert (tmp_path / TRACKER).read_text() == "2" and locate(tmp_path).step == 2
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_a_killed_save_is_invisible_and_cleaned_next_time(tmp_path):
    _save(tmp_path, 2)
    tmp = begin_save(tmp_path, 4)  # the process "dies" after writing one rank's files
    write_rank_files(tmp, rank=0, world=1, step=4, model={"w": np.zeros(1, np.float32)})
    assert locate(tmp_path).step == 2 and list(iteration_dirs(tmp_path)) == [2]
    _save(tmp_path, 4)
    assert locate(tmp_path).step == 4 and not tmp.exists()


def test_resaving_the_same_step_replaces_it(tmp_path):
    _save(tmp_path, 2)
    _save(tmp_path, 2, extra={"x": 1})
    assert load_rank(tmp_path).extra == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iteration_00000002", TRACKER]


def test_no_save_optim_and_missing_rank_refused(tmp_path):
    save_checkpoint(tmp_path, step=1, common=_common(1), model={"w": np.ones(2, np.float32)}, optimizer=None)
    assert load_rank(tmp_path, optimizer=False).optimizer is None
    with pytest.raises(CheckpointError, match="no optimizer file") as e:
        load_rank(tmp_path)
    assert "--weights-only" in e.value.hint
    tmp = begin_save(tmp_path, 2)
    write_rank_files(tmp, rank=0, world=2, step=2, model={"w": np.ones(1, np.float32)})
    with pytest.raises(CheckpointError, match="incomplete") as e:
        finalize_save(tmp_path, 2, common=_common(2), world=2, optimizer_saved=False, metadata={})
    assert e.value.problems == ["rank 1: model file missing"]
    assert locate(tmp_path).step == 1 and not tmp.exists()


def test_two_ranks_with_metadata_reassemble(tmp_path):
    full = np.arange(8, dtype=np.float32).reshape(4, 2)
    w = ShardedTensor(global_shape=(4, 2), axis_fragmentations=(2, 1), holders={0: 0, 1: 1})
    b = ShardedTensor(global_shape=(3,), axis_fragmentations=(1,), holders={0: 0, 1: 0})
    tmp = begin_save(tmp_path, 5)
    for rank in (0, 1):
        write_rank_files(tmp, rank=rank, world=2, step=5, model={"w": full[2 * rank:2 * rank + 2], "b": np.ones(3, np.float32)},
                         optimizer={"adam_m.w": -full[2 * rank:2 * rank + 2]}, extra={"rank": rank})
    meta = build_metadata({"w": w, "b": b}, {"adam_m.w": w}, world=2)
    saved = finalize_save(tmp_path, 5, common=_common(5), world=2, metadata=meta)
    assert "metadata.json" in saved.files
    g = load_global(tmp_path)
    np.testing.assert_array_equal(g["w"], full)
    np.testing.assert_array_equal(g["adam_m.w"], -full)
    assert g["b"].tolist() == [1, 1, 1]
    r1 = load_rank(tmp_path, rank=1, world=2)
    np.testing.assert_array_equal(r1.model["w"], full[2:])
    assert r1.extra == {"rank": 1}
    with pytest.raises(CheckpointError, match="saved with world size 2"):
        load_rank(tmp_path)
    with pytest.raises(CheckpointError, match="needs metadata.json"):
        tmp = begin_save(tmp_path, 6)
        write_rank_files(tmp, rank=0, world=2, step=6, model={"w": full})
        write_rank_files(tmp, rank=1, world=2, step=6, model={"w": full})
        finalize_save(tmp_path, 6, common=_common(6), world=2, optimizer_saved=False)
