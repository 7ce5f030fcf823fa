import pytest

from mftk.ckpt import layout as L
from mftk.errors import CheckpointError, InputError

from tests.helpers.handmade import f32, mf_step_dir, write


def test_names_match_the_reference():
    assert L.iteration_dir_name(100) == "iteration_00000100"
    assert L.iteration_dir_name(123456789) == "iteration_123456789"
    assert L.parse_iteration_dir_name("iteration_00000100") == 100
    assert L.parse_iteration_dir_name("iteration_100") is None
    assert L.parse_iteration_dir_name(".tmp-iteration_00000100") is None
    assert L.shard_file_name("model", 3, 8) == "checkpoint-model-0000003-0000008.safetensors"
    assert L.shard_file_name("opt", 0, 1, None) == "opt-0000000-0000001.safetensors"
    assert L.parse_shard_file_name("my-run-opt-0000003-0000008.safetensors") == L.ShardFileName("my-run", "opt", 3, 8)
    assert L.parse_shard_file_name("model-0000000-0000008.safetensors") == L.ShardFileName(None, "model", 0, 8)
    assert L.parse_shard_file_name("model.safetensors") is None


def test_locate_root_step_dir_and_file(tmp_path):
    d = mf_step_dir(tmp_path, step=4)
    loc = L.locate(tmp_path)
    assert (loc.kind, loc.step_dir, loc.step, loc.root) == ("mf", d, 4, tmp_path)
    loc = L.locate(d)
    assert (loc.kind, loc.step_dir, loc.step) == ("mf", d, 4)
    f = d / "checkpoint-model-0000000-0000001.safetensors"
    assert L.locate(f).kind == "file" and L.locate(f).file == f


def test_locate_hf_dir(tmp_path):
    write(tmp_path / "model.safetensors", [("w", "F32", [1], f32(1))])
    assert L.locate(tmp_path).kind == "hf"


def test_missing_path_is_an_error_not_a_fresh_start(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        L.locate(tmp_path / "nope")


def test_tracker_naming_a_missing_dir(tmp_path):
    mf_step_dir(tmp_path, step=4)
    (tmp_path / L.TRACKER).write_text("8")
    with pytest.raises(CheckpointError, match="names step 8") as e:
        L.locate(tmp_path)
    assert "iteration_00000004" in e.value.hint


def test_tracker_garbage_and_no_tracker(tmp_path):
    mf_step_dir(tmp_path, step=4)
    (tmp_path / L.TRACKER).write_text("four")
    with pytest.raises(CheckpointError, match="expected a decimal step"):
        L.locate(tmp_path)
    (tmp_path / L.TRACKER).unlink()
    with pytest.raises(CheckpointError, match="no latest_checkpointed_iteration.txt"):
        L.locate(tmp_path)
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        L.locate(_empty(tmp_path))


def _empty(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    return d


def test_iteration_dirs_ignores_temp_and_files(tmp_path):
    mf_step_dir(tmp_path, step=4)
    (tmp_path / ".tmp-iteration_00000008").mkdir()
    (tmp_path / "iteration_00000009").write_text("not a dir")
    assert list(L.iteration_dirs(tmp_path)) == [4]


def test_scan_step_dir_flags_mixed_worlds(tmp_path):
    d = mf_step_dir(tmp_path)
    write(d / "checkpoint-model-0000001-0000002.safetensors", [("x", "F32", [1], f32(1))])
    files = L.scan_step_dir(d)
    assert any("different world sizes" in p for p in files.problems)
