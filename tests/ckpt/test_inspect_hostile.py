"""`inspect-ckpt --verify` on checkpoints that lie (issue 35): each used to pass, give a traceback, or be
misnamed. Built by hand (tests/helpers/handmade.py) so nothing depends on the saver."""
from __future__ import annotations

import json
import os

from commands.app import app
from mftk.ckpt.inspect import inspect_checkpoint
from tests.helpers.cli import runner
from tests.helpers.handmade import mf_step_dir
from tests.helpers.sharded import two_rank_checkpoint


def _cli(*args):
    return runner.invoke(app, ["inspect-ckpt", *map(str, args)], env={"COLUMNS": "300"})


def test_a_step_dir_that_is_a_symlink_to_another_step_fails_verify(tmp_path):
    mf_step_dir(tmp_path, step=4)
    os.symlink("iteration_00000004", tmp_path / "iteration_00000006")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("6")
    problems = inspect_checkpoint(tmp_path, verify=True).problems
    assert any("iteration_00000006 is a symlink to" in p for p in problems), problems
    assert "iteration_00000006 is step 6 but its common.json says global_step 4" in problems
    r = _cli(tmp_path, "--verify")
    assert r.exit_code == 1 and "is a symlink to" in r.stderr, r.output


def test_a_renamed_step_dir_disagrees_with_its_common_json(tmp_path):
    d = mf_step_dir(tmp_path, step=4)
    d.rename(tmp_path / "iteration_00000008")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("8")
    assert "iteration_00000008 is step 8 but its common.json says global_step 4" in \
        inspect_checkpoint(tmp_path, verify=True).problems


def test_two_shards_mapped_to_the_same_bytes_fail_verify(tmp_path):
    d = two_rank_checkpoint(tmp_path)  # its bias holds a NaN on purpose (bit-exact round trips): headers only
    assert inspect_checkpoint(tmp_path, verify=True, quick=True).problems == []
    meta = json.loads((d / "metadata.json").read_text())
    # shard 1 of w read from rank 0's file, which holds w's rank-0 slice of the same shape: the same bytes twice
    meta["storage_data"]["('w', (1,))"][0]["file_name"] = "checkpoint-model-0000000-0000002.safetensors"
    (d / "metadata.json").write_text(json.dumps(meta))
    problems = inspect_checkpoint(tmp_path, verify=True, quick=True).problems
    assert problems == ["w shards 0 and 1: both mapped to w in checkpoint-model-0000000-0000002.safetensors, the "
                        "same bytes (each shard needs its own)"]
    assert _cli(tmp_path, "--verify", "--quick").exit_code == 1


def test_a_garbage_saved_config_fails_verify_as_resume_refuses_it(tmp_path):
    d = mf_step_dir(tmp_path, step=4)
    for text in ("{garbage", json.dumps([1, 2])):
        (d / "mftk-config.json").write_text(text)
        problems = inspect_checkpoint(tmp_path, verify=True).problems
        assert len(problems) == 1 and "mftk-config.json" in problems[0], problems
    from mftk.ckpt.run_config import read_run_config
    from mftk.errors import CheckpointError

    try:
        read_run_config(d)  # what resume reads: refused the same way
    except CheckpointError as exc:
        assert "mftk-config.json" in exc.message
    else:
        raise AssertionError("resume's reader accepted a garbage mftk-config.json")


def test_a_shard_that_is_a_symlink_to_itself_is_a_problem_not_a_traceback(tmp_path):
    d = mf_step_dir(tmp_path, step=4)
    f = d / "checkpoint-opt-0000000-0000001.safetensors"
    f.unlink()
    os.symlink(f.name, f)
    r = _cli(tmp_path, "--verify")
    assert r.exit_code == 1, r.output
    assert "checkpoint-opt-0000000-0000001.safetensors: cannot be read (Too many levels of symbolic links)" in r.stderr
    assert "Traceback" not in r.output


def test_common_json_or_tracker_as_the_path_is_named_for_what_it_is(tmp_path):
    d = mf_step_dir(tmp_path, step=4)
    for path, parent in ((d / "common.json", d), (tmp_path / "latest_checkpointed_iteration.txt", tmp_path)):
        r = _cli(path)
        assert r.exit_code == 2, r.output
        assert f"is a checkpoint's {path.name}" in r.stderr and "damaged" not in r.output
        assert f"mftk inspect-ckpt {parent}" in r.stderr


def test_a_root_whose_only_dir_holds_metadata_is_not_offered_as_complete(tmp_path):
    (tmp_path / "iteration_00000004").mkdir()
    (tmp_path / "iteration_00000004" / "metadata.json").write_text("{}")
    r = _cli(tmp_path)
    assert r.exit_code == 1, r.output
    assert "complete dirs present" not in r.stderr
    assert "no complete iteration_* dirs are present (iteration_00000004: no common.json or no model files)" \
        in r.stderr
    mf_step_dir(tmp_path, step=2)  # a complete one next to it is offered, the partial one is not
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    r = _cli(tmp_path)
    assert "complete dirs present: iteration_00000002;" in r.stderr, r.stderr
