import pytest

from mftk.ckpt.metadata import (ShardedTensor, build_metadata, coverage_problems, parse_metadata,
                                safe_file_name, shard_slices)
from mftk.errors import CheckpointError


def _meta():
    w = ShardedTensor(global_shape=(4, 2), axis_fragmentations=(2, 1), holders={0: 0, 1: 1, 2: 0, 3: 1})
    b = ShardedTensor(global_shape=(2,), axis_fragmentations=(1,), holders={0: 0, 1: 0, 2: 0, 3: 0}, dtype="BFloat16")
    return build_metadata({"w": w, "b": b}, {"adam_m.w": w}, world=4)


def test_build_matches_the_reference_structure():
    m = _meta()
    assert list(m) == ["state_dict_metadata", "storage_data"]
    w = m["state_dict_metadata"]["w"]
    assert list(w) == ["properties", "global_shape", "axis_fragmentations", "layout", "chunk"]
    assert w["chunk"] == [{"global_offset": [0], "local_shape": [2, 2]}, {"global_offset": [1], "local_shape": [2, 2]}]
    assert m["storage_data"]["('w', (1,))"] == [
        {"file_name": "checkpoint-model-0000001-0000004.safetensors", "storage_rank": 1, "rank_group": [1, 3]}]
    assert m["storage_data"]["('adam_m.w', (0,))"][0]["file_name"] == "checkpoint-opt-0000000-0000004.safetensors"
    assert m["storage_data"]["('b', (0,))"][0]["rank_group"] == [0, 1, 2, 3]
    assert m["state_dict_metadata"]["b"]["properties"]["dtype"] == "BFloat16"


def test_parse_round_trip_and_full_coverage():
    parsed = parse_metadata(_meta())
    assert parsed["w"].shard_count == 2 and parsed["w"].storage[1][0].rank_group == (1, 3)
    assert all(coverage_problems(t) == [] for t in parsed.values())


@pytest.mark.parametrize("name", ["../escape.safetensors", "/etc/passwd", "sub/x.safetensors", "..", "", ".hidden"])
def test_file_names_outside_the_dir_are_rejected(name):
    m = _meta()
    m["storage_data"]["('w', (0,))"][0]["file_name"] = name
    assert not safe_file_name(name)
    with pytest.raises(CheckpointError) as e:
        parse_metadata(m)
    assert any("never followed" in p for p in e.value.problems)


def test_coverage_problems_found():
    m = _meta()
    chunks = m["state_dict_metadata"]["w"]["chunk"]
    chunks[1] = dict(chunks[0])  # shard 0 twice, shard 1 missing
    problems = coverage_problems(parse_metadata(m)["w"])
    assert any("shards [1] of 2 are not listed" in p for p in problems)
    assert any("[0] are listed more than once" in p for p in problems)


def test_malformed_entries_and_keys():
    m = _meta()
    m["storage_data"]["__import__('os')"] = []
    del m["state_dict_metadata"]["b"]["global_shape"]
    with pytest.raises(CheckpointError) as e:
        parse_metadata(m)
    text = " ".join(e.value.problems)
    assert "is not ('name', (index,))" in text and "b: malformed entry" in text


def test_shard_slices_row_major():
    assert shard_slices(3, (4, 6), (2, 3)) == (slice(2, 4), slice(0, 2))
    assert shard_slices(0, (), ()) == ()
