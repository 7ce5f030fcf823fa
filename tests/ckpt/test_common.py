import json

import pytest

from mftk.ckpt.common import KEYS, CommonInfo, parse_common, read_common
from mftk.errors import CheckpointError

# The reference's sample (§3.3), as json.dumps(..., indent=4) writes it.
REFERENCE = """{
    "epoch_num": 1,
    "step_num": 10,
    "global_step": 10,
    "loss_scale": 1.0,
    "global_batch_size": 2,
    "consumed_samples": 20,
    "ckpt_status": null
}"""


def test_writes_the_reference_bytes():
    info = CommonInfo.for_step(step=10, max_steps=10, global_batch_size=2, consumed_samples=20, epoch=0)
    assert info.to_json() == REFERENCE
    assert list(json.loads(info.to_json())) == list(KEYS) and len(KEYS) == 7


def test_step_zero_is_null_and_epoch_kept():
    info = CommonInfo.for_step(step=0, max_steps=5, global_batch_size=4, consumed_samples=0, epoch=3)
    assert json.loads(info.to_json())["global_step"] is None and info.step == 0 and info.epoch_num == 3


def test_round_trip(tmp_path):
    (tmp_path / "common.json").write_text(REFERENCE)
    assert read_common(tmp_path) == CommonInfo(1, 10, 10, 1.0, 2, 20, None)


def test_older_file_missing_keys_reads_null_and_newer_keys_are_kept():
    """2.1 §2.2: a missing key is the reference's default (None); extra keys are kept, written back after the 7."""
    data = json.loads(REFERENCE) | {"data_plan_state": {"cursor": 3}, "rng": 1}
    del data["consumed_samples"], data["ckpt_status"]
    info = parse_common(json.dumps(data))
    assert info.consumed_samples is None and info.ckpt_status is None and info.global_step == 10
    assert info.missing == ("consumed_samples", "ckpt_status")
    assert info.extra == {"data_plan_state": {"cursor": 3}, "rng": 1}
    notes = info.notes()
    assert "no 'consumed_samples'" in notes[0] and "read as null" in notes[0]
    assert "'data_plan_state'" in notes[2] and "drops it" in notes[2]
    assert "'rng'" in notes[3] and "refuses" in notes[3]
    written = json.loads(info.to_json())
    assert list(written) == list(KEYS) + ["data_plan_state", "rng"]
    assert written["consumed_samples"] is None and written["data_plan_state"] == {"cursor": 3}


def test_bad_json_bad_types_and_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="not valid JSON"):
        parse_common("{")
    with pytest.raises(CheckpointError) as e:
        parse_common(REFERENCE.replace('"global_step": 10', '"global_step": "10"'))
    assert e.value.problems == ["global_step: '10' is not a non-negative integer or null"]
    with pytest.raises(CheckpointError, match="no common.json"):
        read_common(tmp_path)
