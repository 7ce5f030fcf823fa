"""Balanced loading plan (scenario 4): every unique shard read exactly once, bytes balanced, and the
pieces put back together equal ``load_global`` bit for bit (simulated ranks, no collectives)."""
import json
import random
import struct

import numpy as np
import pytest

from mftk.ckpt import safetensors_io as st
from mftk.ckpt.balance import assign, place, read_unit, read_units
from mftk.ckpt.inspect import inspect_checkpoint
from mftk.ckpt.load import load_global
from mftk.errors import CheckpointError

from tests.helpers.handmade import f32, mf_step_dir, write
from tests.helpers.sharded import assert_bits_equal as _bits_equal, two_rank_checkpoint as _two_rank


def test_assign_hand_example():
    # largest first to the least loaded rank: 5→0, 4→1, 3→1 (4<5), 3→0 (7>5), 3→1 (7<8)
    assert assign([5, 4, 3, 3, 3], 2) == (0, 1, 1, 0, 1)
    assert assign([7, 7, 7], 1) == (0, 0, 0)
    assert assign([], 3) == ()
    with pytest.raises(ValueError):
        assign([1], 0)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_assign_reads_each_unit_once_and_balances_within_the_largest(world):
    rng = random.Random(world)
    for _ in range(50):
        sizes = [rng.choice([4, 64, 4096, rng.randrange(1, 100_000)]) for _ in range(rng.randrange(1, 60))]
        readers = assign(sizes, world)
        assert len(readers) == len(sizes) and all(0 <= r < world for r in readers)  # one reader per unit
        loads = [sum(s for s, r in zip(sizes, readers) if r == k) for k in range(world)]
        assert sum(loads) == sum(sizes)
        assert max(loads) - min(loads) <= max(sizes)
        assert assign(sizes, world) == readers  # every rank computes the same plan


def _simulate(path, world, kinds=("model", "opt")):
    """Each simulated rank reads only its units; the union is then assembled as the broadcast would."""
    units = read_units(path, kinds=kinds)
    readers = assign([u.nbytes for u in units], world)
    pieces, read_by = {}, [0] * world
    for rank in range(world):
        for i, u in enumerate(units):
            if readers[i] == rank:
                assert i not in pieces  # read exactly once
                pieces[i] = read_unit(u)
                read_by[rank] += u.nbytes
    out = {}
    for i, u in enumerate(units):
        place(out, u, pieces[i])
    return units, out, read_by


@pytest.mark.parametrize("world", [1, 2, 3])
def test_sharded_checkpoint_each_shard_once_and_bit_identical(tmp_path, world):
    d = _two_rank(tmp_path)
    units, out, read_by = _simulate(d, world)
    assert sorted((u.name, u.index) for u in units) == sorted(
        [("w", 0), ("w", 1), ("b", 0), ("adam_m.w", 0), ("adam_m.w", 1), ("adam_m.b", 0), ("global_step", 0)])
    _bits_equal(out, load_global(d))
    # replicated tensors are read once although both rank files hold them: less than the files' data
    assert sum(read_by) == sum(u.nbytes for u in units) == 2 * 128 + 2 * 16 + 8
    files = sum(st.read_header(f).data_bytes for f in d.glob("*.safetensors"))
    assert files == 2 * (64 + 16) + 2 * (64 + 16 + 8)
    assert max(read_by) - min(read_by) <= max(u.nbytes for u in units)


def test_weights_only_reads_no_optimizer_file(tmp_path):
    d = _two_rank(tmp_path)
    units, out, _ = _simulate(d, 2, kinds=("model",))
    assert {u.kind for u in units} == {"model"} and "-opt-" not in "".join(u.file.name for u in units)
    _bits_equal(out, load_global(d, ["w", "b"]))


def test_single_card_and_hf_dirs_split_by_tensor(tmp_path):
    mf = mf_step_dir(tmp_path / "mf")
    units, out, read_by = _simulate(mf, 2)
    assert [u.name for u in units] == ["w", "b", "adam_m.w", "adam_v.w", "global_step"]
    assert {u.name: u.kind for u in units}["global_step"] == "opt"
    b = next(u for u in units if u.name == "b")
    assert (b.nbytes, b.out_nbytes, b.dtype) == (4, 8, np.dtype(np.float32))  # BF16 on disk, fp32 in memory
    _bits_equal(out, load_global(mf))
    hf = tmp_path / "hf"
    hf.mkdir()
    write(hf / "a.safetensors", [("x", "F32", [2], f32(1, -0.0))])
    write(hf / "b.safetensors", [("y", "I64", [1], struct.pack("<q", -3))])
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "a.safetensors",
                                                                                 "y": "b.safetensors"}}))
    units, out, read_by = _simulate(hf, 2)
    assert sorted(read_by) == [8, 8]
    _bits_equal(out, load_global(hf))


def test_shard_shape_disagreeing_with_metadata_is_refused_before_reading(tmp_path):
    d = _two_rank(tmp_path)
    meta = json.loads((d / "metadata.json").read_text())
    meta["state_dict_metadata"]["w"]["global_shape"] = [8, 8]
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"w shard 0 has shape \[4, 4\], metadata.json says \[4, 8\]"):
        read_units(d)


def test_inspect_reports_the_same_unit_count(tmp_path):
    d = _two_rank(tmp_path / "two")
    r = inspect_checkpoint(d)
    s4 = r.scenarios[3]
    assert s4.supported and s4.reason.startswith(f"{len(read_units(d))} unique shards")
    mf = mf_step_dir(tmp_path / "mf")
    s4 = inspect_checkpoint(mf).scenarios[3]
    assert s4.supported and s4.reason.startswith(f"{len(read_units(mf))} unique shards")
