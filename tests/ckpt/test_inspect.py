import json
import math
import struct

import numpy as np
import pytest

from mftk.ckpt.common import CommonInfo
from mftk.ckpt.diff import diff_checkpoints
from mftk.ckpt.inspect import inspect_checkpoint
from mftk.ckpt.metadata import ShardedTensor, build_metadata
from mftk.ckpt.save import begin_save, finalize_save, save_checkpoint, write_rank_files

from tests.helpers.handmade import f32, mf_step_dir, write


def _supported(report):
    return [s.number for s in report.scenarios if s.supported]


def test_handmade_dir_from_headers_only(tmp_path):
    mf_step_dir(tmp_path, step=4)
    r = inspect_checkpoint(tmp_path)
    assert (r.kind, r.step, r.world, r.prefix, r.problems) == ("mf", 4, 1, "checkpoint", [])
    rows = {t.name: (t.kind, t.dtype, t.shape, t.nbytes) for t in r.tensors}
    assert rows == {"w": ("model", "F32", (2, 2), 16), "b": ("model", "BF16", (2,), 4),
                    "adam_m.w": ("optimizer", "F32", (2, 2), 16), "adam_v.w": ("optimizer", "F32", (2, 2), 16),
                    "global_step": ("optimizer", "I64", (1,), 8)}
    assert (r.model_parameters, r.optimizer_elements) == (6, 9)
    assert r.bytes_by_dtype == {"F32": 48, "BF16": 4, "I64": 8}
    assert r.common["consumed_samples"] == 8 and not r.tensors_read and r.tensors[0].norm is None
    assert _supported(r) == [1, 2, 3, 4]
    assert "not bit-exact" in r.scenarios[0].reason


def test_full_read_norms_and_nan_scan(tmp_path):
    d = mf_step_dir(tmp_path, step=4)
    r = inspect_checkpoint(d, verify=True, read_tensors=True)
    norms = {t.name: t.norm for t in r.tensors}
    assert norms["w"] == pytest.approx(math.sqrt(1 + 4 + 9 + 16)) and norms["b"] == pytest.approx(math.sqrt(0.5))
    write(d / "checkpoint-model-0000000-0000001.safetensors",
          [("w", "F32", [2, 2], f32(1, float("nan"), float("inf"), 4)), ("b", "BF16", [2], struct.pack("<2H", 0x7FC0, 0))])
    r = inspect_checkpoint(d, verify=True, read_tensors=True)
    assert sorted(r.problems) == ["b: 1 NaN and 0 Inf value(s)", "w: 1 NaN and 1 Inf value(s)"]


def test_scenarios_without_optimizer_or_common(tmp_path):
    d = mf_step_dir(tmp_path, step=4, opt=False)
    r = inspect_checkpoint(d)
    assert _supported(r) == [2, 4] and "no_save_optim" in r.scenarios[0].reason
    (d / "common.json").unlink()
    r = inspect_checkpoint(d)
    assert _supported(r) == [] and "common.json is required" in r.scenarios[1].reason
    assert any("no common.json" in p for p in r.problems)


def test_single_file_and_hf_dir(tmp_path):
    d = mf_step_dir(tmp_path)
    r = inspect_checkpoint(d / "checkpoint-model-0000000-0000001.safetensors")
    assert r.kind == "file" and _supported(r) == [] and len(r.tensors) == 2
    hf = tmp_path / "hf"
    hf.mkdir()
    write(hf / "a.safetensors", [("x", "F32", [1], f32(1))])
    write(hf / "b.safetensors", [("y", "F32", [1], f32(2))])
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}))
    r = inspect_checkpoint(hf, read_tensors=True)
    assert r.kind == "hf" and _supported(r) == [2, 4] and [t.norm for t in r.tensors] == [1.0, 2.0]
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../a.safetensors"}}))
    r = inspect_checkpoint(hf)
    assert any("never followed" in p for p in r.problems)


def test_verify_finds_damage(tmp_path):
    d = mf_step_dir(tmp_path)
    f = d / "checkpoint-opt-0000000-0000001.safetensors"
    f.write_bytes(f.read_bytes()[:-3])
    r = inspect_checkpoint(tmp_path, verify=True)
    assert any("data region" in p for p in r.problems) and 1 not in _supported(r)


def _two_rank(tmp_path, *, meta_edit=None):
    full = np.arange(8, dtype=np.float32).reshape(4, 2)
    w = ShardedTensor(global_shape=(4, 2), axis_fragmentations=(2, 1), holders={0: 0, 1: 1})
    tmp = begin_save(tmp_path, 6)
    for rank in (0, 1):
        write_rank_files(tmp, rank=rank, world=2, step=6, model={"w": full[2 * rank:2 * rank + 2]},
                         optimizer={"adam_m.w": full[2 * rank:2 * rank + 2]}, extra={})
    meta = build_metadata({"w": w}, {"adam_m.w": w}, world=2)
    if meta_edit:
        meta_edit(meta)
    finalize_save(tmp_path, 6, common=CommonInfo.for_step(step=6, max_steps=9, global_batch_size=4,
                                                         consumed_samples=24), world=2, metadata=meta)
    return full


def test_sharded_checkpoint_report_and_verify(tmp_path):
    full = _two_rank(tmp_path)
    r = inspect_checkpoint(tmp_path, verify=True, read_tensors=True)
    assert r.problems == [] and r.world == 2 and r.has_metadata and r.has_extra_state
    w = next(t for t in r.tensors if t.name == "w")
    assert (w.shape, w.shards, w.layout, w.nbytes) == ((4, 2), 2, "2x1 over 2 ranks", 32)
    assert w.norm == pytest.approx(float(np.linalg.norm(full)))
    assert _supported(r) == [1, 2, 3, 4]
    assert "4 unique shards" in r.scenarios[3].reason and "bit-exact continuation" in r.scenarios[0].reason


def test_sharded_checkpoint_double_cover_and_missing_file(tmp_path):
    def edit(meta):
        meta["state_dict_metadata"]["w"]["chunk"][1]["global_offset"] = [0]
        meta["storage_data"]["('adam_m.w', (1,))"][0]["file_name"] = "gone-opt-0000001-0000002.safetensors"

    _two_rank(tmp_path, meta_edit=edit)
    problems = inspect_checkpoint(tmp_path, verify=True).problems
    assert any("w: shards [1] of 2 are not listed" in p for p in problems)
    assert any("w: shards [0] are listed more than once" in p for p in problems)
    assert any("gone-opt-0000001-0000002.safetensors does not exist" in p for p in problems)


def test_diff_reports_changes_against_hand_computation(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    mf_step_dir(a, step=4)
    save_checkpoint(b, step=8, common=CommonInfo.for_step(step=8, max_steps=10, global_batch_size=2, consumed_samples=16),
                    model={"w": np.array([[1, 2], [3, 6]], np.float32), "extra": np.zeros(1, np.float32)},
                    optimizer={"adam_m.w": np.zeros((2, 2), np.float32), "adam_v.w": np.zeros((4,), np.float32),
                               "global_step": np.array([8], np.int32)})
    d = diff_checkpoints(a, b, read_tensors=True)
    assert (d.step_a, d.step_b, d.added, d.removed) == (4, 8, ["extra"], ["b"])
    assert [c.name for c in d.reshaped] == ["adam_v.w"] and [c.name for c in d.retyped] == ["global_step"]
    rel = {c.name: c.rel_change for c in d.changes}
    assert rel["w"] == pytest.approx(2 / math.sqrt(30)) and rel["adam_m.w"] == 0.0
    assert not d.identical
    same = diff_checkpoints(a, a / "iteration_00000004", read_tensors=True)
    assert same.identical and same.problems == []
