"""Hostile checkpoint files (issue 7's list, folded into this suite; round two's cases are in
``test_reads.py`` and ``test_blowups.py``): a truncated safetensors file, a header length beyond the
file, a header that is not JSON, an unknown dtype, and file names in ``metadata.json`` or an HF index
that point outside the checkpoint dir. Each through ``inspect-ckpt --verify`` as a user runs it: exit
1, no traceback, the problem named, nothing followed or written. (The header parser's own unit cases,
one per malformation, are in ``tests/ckpt/test_safetensors_io.py``.)
"""
from __future__ import annotations

import json
import struct

import pytest

from tests.helpers.handmade import f32, mf_step_dir, pack
from tests.helpers.hostile import assert_clean_failure, mftk


@pytest.mark.parametrize("data,problem", [
    (b"\x01\x02", "too short for the 8-byte header length"),
    (struct.pack("<Q", 1 << 40) + b"{}", "runs past the end of the file"),
    (struct.pack("<Q", 5) + b"hello", "header is not UTF-8 JSON"),
    (struct.pack("<Q", 2) + b"[]", "expected an object"),
    (pack([("w", "F33", [1], b"\0\0\0\0")]), "unknown dtype 'F33'"),
    (pack([("w", "F32", [4], f32(1, 2, 3, 4))])[:-4], "past the 12-byte data region (file truncated?)"),
], ids=["too-short", "header-beyond-file", "not-json", "json-array", "unknown-dtype", "truncated-data"])
def test_hostile_safetensors_file(tmp_path, data, problem):
    f = tmp_path / "bad.safetensors"
    f.write_bytes(data)
    r = mftk("inspect-ckpt", str(f), "--verify")
    assert_clean_failure(r, 1, str(f), problem)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors"]


def test_truncated_shard_inside_a_checkpoint(tmp_path):
    d = mf_step_dir(tmp_path)
    shard = d / "checkpoint-model-0000000-0000001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-3])
    assert_clean_failure(mftk("inspect-ckpt", str(d), "--verify"), 1, shard.name, "file truncated?")


@pytest.mark.parametrize("name", ["../secret.safetensors", "/etc/passwd"])
def test_metadata_file_names_outside_the_dir_are_never_followed(tmp_path, name):
    d = mf_step_dir(tmp_path)
    (tmp_path / "secret.safetensors").write_bytes(b"x")
    meta = {"state_dict_metadata": {"w": {"properties": {"dtype": "Float32"}, "global_shape": [2, 2],
                                          "axis_fragmentations": [1, 1], "layout": None,
                                          "chunk": [{"global_offset": [0], "local_shape": [2, 2]}]}},
            "storage_data": {"('w', (0,))": [{"file_name": name, "storage_rank": 0, "rank_group": [0]}]}}
    (d / "metadata.json").write_text(json.dumps(meta))
    r = mftk("inspect-ckpt", str(d), "--verify")
    assert_clean_failure(r, 1, "never followed", repr(name))


def test_hf_index_names_outside_the_dir_are_never_followed(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "a.safetensors").write_bytes(pack([("x", "F32", [1], f32(1))]))
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../a.safetensors"}}))
    r = mftk("inspect-ckpt", str(tmp_path / "hf"), "--verify")
    assert_clean_failure(r, 1, "file names outside the dir are never followed", "'../a.safetensors'")
