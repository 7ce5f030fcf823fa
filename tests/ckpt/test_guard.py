"""The save_path guard: a run never takes over another run's checkpoints unasked (mftk.ckpt.guard)."""
import pytest

from mftk.ckpt.guard import check_save_path
from mftk.ckpt.layout import TRACKER, iteration_dirs
from mftk.errors import CheckpointError

from tests.helpers.handmade import mf_step_dir


def _run_dirs(root, *steps, tracker=None):
    """Iteration dirs of "another run", written without mftk."""
    for step in steps:
        mf_step_dir(root, step=step)
    if tracker is not None:
        (root / TRACKER).write_text(str(tracker))


def test_empty_or_missing_save_path_is_fine(tmp_path):
    assert check_save_path(tmp_path / "new", resume_dir=None, weights_only=False, new_run=False, total_steps=5) == []
    assert check_save_path(tmp_path, resume_dir=None, weights_only=False, new_run=False, total_steps=5) == []


def test_fresh_run_over_checkpoints_is_refused_naming_newest_step_and_resume(tmp_path):
    _run_dirs(tmp_path, 4, 8, tracker=8)
    with pytest.raises(CheckpointError) as e:
        check_save_path(tmp_path, resume_dir=None, weights_only=False, new_run=False, total_steps=20)
    assert "step 8" in e.value.message and "iteration_00000008" in e.value.message
    assert "mftk resume" in e.value.hint and "--new-run" in e.value.hint
    assert list(iteration_dirs(tmp_path)) == [4, 8]


def test_tracker_alone_counts(tmp_path):
    (tmp_path / TRACKER).write_text("12")
    with pytest.raises(CheckpointError, match="step 12"):
        check_save_path(tmp_path, resume_dir=None, weights_only=False, new_run=False, total_steps=20)


def test_weights_only_start_from_the_same_folder_is_a_fresh_run(tmp_path):
    _run_dirs(tmp_path, 4, tracker=4)
    with pytest.raises(CheckpointError, match="weights-only start"):
        check_save_path(tmp_path, resume_dir=tmp_path / "iteration_00000004", weights_only=True, new_run=False,
                        total_steps=10)


def test_resume_from_another_folder_into_a_used_one_is_refused(tmp_path):
    _run_dirs(tmp_path / "a", 4, tracker=4)
    _run_dirs(tmp_path / "b", 2, tracker=2)
    with pytest.raises(CheckpointError):
        check_save_path(tmp_path / "b", resume_dir=tmp_path / "a" / "iteration_00000004", weights_only=False,
                        new_run=False, total_steps=10)


def test_continuing_in_the_same_folder_notes_newer_dirs(tmp_path):
    _run_dirs(tmp_path, 4, 8, tracker=8)
    assert check_save_path(tmp_path, resume_dir=tmp_path / "iteration_00000008", weights_only=False,
                           new_run=False, total_steps=20) == []
    notes = check_save_path(tmp_path, resume_dir=tmp_path / "iteration_00000004", weights_only=False,
                            new_run=False, total_steps=20)
    assert len(notes) == 1 and "iteration_00000008" in notes[0] and "newer than the resumed step 4" in notes[0]


def test_new_run_is_allowed_only_when_no_existing_dir_is_on_its_path(tmp_path):
    _run_dirs(tmp_path, 30, 40, tracker=40)
    notes = check_save_path(tmp_path, resume_dir=None, weights_only=False, new_run=True, total_steps=20)
    assert "kept" in notes[0]
    with pytest.raises(CheckpointError) as e:
        check_save_path(tmp_path, resume_dir=None, weights_only=False, new_run=True, total_steps=30)
    assert "iteration_00000030" in e.value.message and "never deletes" in e.value.message
    assert list(iteration_dirs(tmp_path)) == [30, 40]
