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
        parse_common(REFERENCE.replace('"global_step": 10', '"global_step": "10.5"'))
    assert e.value.problems == ["global_step: '10.5' is not a non-negative integer or null (a string that is not "
                                "plainly one)"]
    with pytest.raises(CheckpointError, match="no common.json"):
        read_common(tmp_path)


def test_numeric_strings_read_as_numbers_with_a_note():
    """MF's checkpoint docs show ``"loss_scale": "1.0"``; MF reads common.json without a type check."""
    text = REFERENCE.replace('"loss_scale": 1.0', '"loss_scale": "1.0"').replace('"global_step": 10',
                                                                                  '"global_step": "10"')
    info = parse_common(text, "ck/iteration_0000010/common.json")
    assert info.loss_scale == 1.0 and isinstance(info.loss_scale, float)
    assert info.global_step == 10 and isinstance(info.global_step, int) and info.step == 10
    assert info.from_text == (("global_step", "10"), ("loss_scale", "1.0"))
    notes = [n for n in info.notes() if "holds the string" in n]
    assert len(notes) == 2 and "'loss_scale' holds the string '1.0'" in notes[1] and "1.0" in notes[1]
    written = json.loads(info.to_json())
    assert written["loss_scale"] == 1.0 and written["global_step"] == 10  # numbers from now on
    assert parse_common(REFERENCE.replace('"loss_scale": 1.0', '"loss_scale": "1e3"')).loss_scale == 1000.0


@pytest.mark.parametrize("key, text", [
    ("global_step", "10.0"), ("global_step", " 10"), ("global_step", "+10"), ("global_step", "1e1"),
    ("global_step", "-1"), ("consumed_samples", "1,000"), ("consumed_samples", ""),
    ("loss_scale", "nan"), ("loss_scale", "inf"), ("loss_scale", "1.0.0"), ("loss_scale", "one"),
])
def test_ambiguous_strings_are_still_refused_naming_file_and_key(key, text):
    data = json.loads(REFERENCE)
    data[key] = text
    with pytest.raises(CheckpointError) as e:
        parse_common(json.dumps(data), "ck/iteration_0000010/common.json")
    assert "ck/iteration_0000010/common.json" in e.value.message
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith(f"{key}: {text!r}")
