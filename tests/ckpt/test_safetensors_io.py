import json
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file

from mftk.ckpt import safetensors_io as st
from mftk.errors import CheckpointError

from tests.helpers.handmade import f32, pack, write


def test_reads_handmade_file_header_and_data(tmp_path):
    p = write(tmp_path / "a.safetensors", [("w", "F32", [2, 2], f32(1, 2, 3, 4)),
                                           ("i", "I32", [3], struct.pack("<3i", -1, 0, 7)),
                                           ("b", "BF16", [2], struct.pack("<2H", 0x3F80, 0xC040))])
    h = st.read_header(p)
    assert [(t.name, t.dtype, t.shape, t.begin, t.end) for t in h.tensors.values()] == [
        ("w", "F32", (2, 2), 0, 16), ("i", "I32", (3,), 16, 28), ("b", "BF16", (2,), 28, 32)]
    got = st.read_tensors(p)
    np.testing.assert_array_equal(got["w"], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(got["i"], [-1, 0, 7])
    assert got["b"].dtype == np.float32 and got["b"].tolist() == [1.0, -3.0]  # 0x3F80 = 1.0, 0xC040 = -3.0


def test_writer_output_is_read_by_the_safetensors_package(tmp_path):
    arrays = {"z": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.array([1, -2], np.int64),
              "h": np.array([0.5], np.float16), "m": np.array([True, False])}
    p = tmp_path / "x.safetensors"
    st.write_file(p, arrays)
    back = load_file(str(p))
    assert sorted(back) == sorted(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype
        np.testing.assert_array_equal(back[k], v)
    assert (8 + struct.unpack("<Q", p.read_bytes()[:8])[0]) % 8 == 0  # data region aligned


def test_bf16_round_trip_and_rounding(tmp_path):
    # 1 + 2**-8 is a tie between bf16 1.0 and 1.0078125: round to even -> 1.0;
    # 1 + 3*2**-8 ties between 1.0078125 (odd) and 1.015625 (even) -> 1.015625.
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.inf], np.float32)
    bits = st.to_bf16(x).bits
    assert bits.tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80]
    assert np.isnan(st.bf16_to_float32(st.to_bf16(np.array([np.nan], np.float32)).bits)).all()
    p = tmp_path / "b.safetensors"
    st.write_file(p, {"b": st.to_bf16(x)})
    raw = p.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert json.loads(raw[8:8 + n])["b"] == {"dtype": "BF16", "shape": [5], "data_offsets": [0, 10]}
    assert st.read_tensors(p)["b"].tolist() == [1.0, 1.0, 1.015625, -2.5, np.inf]


def _problems(tmp_path, data: bytes) -> str:
    p = tmp_path / "bad.safetensors"
    p.write_bytes(data)
    with pytest.raises(CheckpointError) as e:
        st.read_header(p)
    assert e.value.path == str(p)
    return " | ".join([e.value.message, *e.value.problems])


def test_hostile_too_short(tmp_path):
    assert "too short" in _problems(tmp_path, b"\x01\x02")


def test_hostile_header_length_beyond_file(tmp_path):
    assert "runs past the end" in _problems(tmp_path, struct.pack("<Q", 10**12) + b"{}")


def test_hostile_header_not_json(tmp_path):
    assert "not UTF-8 JSON" in _problems(tmp_path, struct.pack("<Q", 5) + b"hello")
    assert "expected an object" in _problems(tmp_path, struct.pack("<Q", 2) + b"[]")


def test_hostile_unknown_dtype(tmp_path):
    raw = pack([("w", "F33", [1], b"\0\0\0\0")])
    assert "unknown dtype 'F33'" in _problems(tmp_path, raw)


def test_hostile_offsets_disagree_with_shape(tmp_path):
    head = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}).encode()
    msg = _problems(tmp_path, struct.pack("<Q", len(head)) + head + b"\0" * 4)
    assert "hold 4 bytes, but F32[2] needs 8" in msg


def test_hostile_truncated_data(tmp_path):
    raw = pack([("w", "F32", [4], f32(1, 2, 3, 4))])
    assert "past the 12-byte data region" in _problems(tmp_path, raw[:-4])


def test_hostile_overlap_and_tail(tmp_path):
    head = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}).encode()
    msg = _problems(tmp_path, struct.pack("<Q", len(head)) + head + b"\0" * 12)
    assert "overlap a" in msg and "tensors end at 8" in msg


def test_hostile_bad_shape_and_offsets(tmp_path):
    head = json.dumps({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]},
                       "b": {"dtype": "F32", "shape": [1], "data_offsets": "0-4"}}).encode()
    msg = _problems(tmp_path, struct.pack("<Q", len(head)) + head + b"\0" * 4)
    assert "shape [-1]" in msg and "data_offsets '0-4'" in msg


def test_read_missing_name_and_f8(tmp_path):
    p = write(tmp_path / "a.safetensors", [("q", "F8_E4M3", [2], b"\0\0")])
    assert st.read_header(p).tensors["q"].nbytes == 2  # size math works without numpy support
    with pytest.raises(CheckpointError, match="numpy cannot read"):
        st.read_tensors(p)
    with pytest.raises(CheckpointError, match="not in file"):
        st.read_tensors(p, ["nope"])
