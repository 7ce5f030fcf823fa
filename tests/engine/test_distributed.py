"""FSDP sharding plan over the flat optimizer, its checkpoint metadata, and worker results (no processes)."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.ckpt.metadata import build_metadata, coverage_problems, parse_metadata, shard_slices
from mftk.engine.distributed import DistContext, FlatSharding
from mftk.engine.optim import AdamW, decide_weight_decay
from mftk.derive import Layout

NAMES = ["emb", "norm", "odd", "proj"]
SHAPES = [(8, 3), (4,), (5, 2), (6, 4)]


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def _optimizer(sh: FlatSharding, arrays):
    decisions = decide_weight_decay(list(zip(NAMES, SHAPES)), 0.1)
    return AdamW(NAMES, [sh.local(i, a) for i, a in enumerate(arrays)], decisions)


def test_rows_split_evenly_else_replicated():
    sh = FlatSharding(NAMES, SHAPES, size=2, rank=1)
    assert sh.rows == [(4, 8), (2, 4), None, (3, 6)]  # 5 rows do not split in 2: kept whole
    assert [sh.local_shape(i) for i in range(4)] == [(4, 3), (2,), (5, 2), (3, 4)]
    assert FlatSharding(NAMES, SHAPES, size=1, rank=0).enabled is False


def test_scatter_and_cut_agree_with_slicing_each_tensor():
    arrays = _arrays()
    for rank in (0, 1):
        sh = FlatSharding(NAMES, SHAPES, size=2, rank=rank)
        opt = _optimizer(sh, arrays)
        full = np.concatenate([a.ravel() for a in arrays])
        local = sh.scatter(full, opt)
        for i, a in enumerate(arrays):
            want = a if sh.rows[i] is None else a[sh.rows[i][0]:sh.rows[i][1]]
            np.testing.assert_array_equal(opt.view(local, i), want)
        cut = sh.cut({"adam_m.emb": arrays[0], "odd": arrays[2], "global_step": np.array([3])})
        np.testing.assert_array_equal(cut["adam_m.emb"], arrays[0][4 * rank:4 * rank + 4])
        np.testing.assert_array_equal(cut["odd"], arrays[2])
        assert cut["global_step"].tolist() == [3]


def test_norm_weights_count_replicated_parameters_once():
    arrays = _arrays(1)
    full = np.concatenate([a.ravel() for a in arrays]).astype(np.float64)
    total = 0.0
    for rank in (0, 1):  # the sum over the shard group of the weighted local squares
        sh = FlatSharding(NAMES, SHAPES, size=2, rank=rank)
        opt = _optimizer(sh, arrays)
        local = sh.scatter(full.astype(np.float32), opt).astype(np.float64)
        total += float(np.dot(local * sh.norm_weights(opt), local))
    assert np.sqrt(total) == pytest.approx(np.linalg.norm(full), rel=1e-6)


@pytest.mark.parametrize("layout", [Layout(world=2, dp_shard=2), Layout(world=4, dp_replicate=2, dp_shard=2),
                                    Layout(world=2, dp_replicate=2)])
def test_metadata_describes_shards_that_tile_each_tensor(layout):
    from mftk.engine.parallel.groups import mesh_groups

    arrays = _arrays(2)
    saved = {}
    specs = None
    for rank in range(layout.world):
        groups = mesh_groups(layout, rank)
        sh = FlatSharding(NAMES, SHAPES, groups.fsdp.size, groups.fsdp.rank)
        ctx = DistContext(groups=groups, sharding=sh)
        model = sh.cut(dict(zip(NAMES, arrays)))
        opt = {f"adam_m.{n}": a for n, a in model.items()} | {"global_step": np.array([2], np.int64)}
        saved[rank] = {**model, **opt}
        if rank == 0:
            specs = ctx.metadata_specs(model, opt)
    meta = parse_metadata(build_metadata(*specs, world=layout.world))
    for name, t in meta.items():
        assert coverage_problems(t) == []
        out = np.zeros(t.global_shape, saved[0][name].dtype)
        for index, _ in t.chunks:  # what load_global does: each shard from the rank storage_data names
            entry = t.storage[index][0]
            assert entry.file_name.endswith(f"-{entry.storage_rank:07d}-{layout.world:07d}.safetensors")
            assert ("-opt-" in entry.file_name) == (name.startswith("adam_") or name == "global_step")
            out[shard_slices(index, t.global_shape, t.axis_fragmentations)] = saved[entry.storage_rank][name]
        base = name.removeprefix("adam_m.")
        want = arrays[NAMES.index(base)] if base in NAMES else np.array([2])
        np.testing.assert_array_equal(out, want)
    frag = meta["emb"].axis_fragmentations
    assert frag == ((layout.dp_shard, 1) if layout.dp_shard > 1 else (1, 1))
    assert meta["odd"].axis_fragmentations == (1, 1)


def test_worker_result_round_trips_through_json():
    import json

    import attrs

    from mftk.ckpt.resume import ResumePlan
    from mftk.engine.run import TrainResult
    from mftk.engine.workers import result_from_json

    plan = ResumePlan(source="s", kind="mf", step_dir="d", scenario=1, saved_step=2, saved_global_batch_size=4,
                      global_batch_size=4, saved_world=2, world=1, start_step=2, consumed_samples=8,
                      skip_micro_batches=8, loads=("model weights",), notes=("n",))
    r = TrainResult(start_step=2, final_step=4, total_steps=4, consumed_samples=16, losses=(1.5, 1.25),
                    grad_norms=(0.5, None), skipped_steps=0, checkpoint="c", output_dir="o", log_file="l",
                    metrics_file="m", phases=(("model build", 0.1),), resume=plan)
    assert result_from_json(json.loads(json.dumps(attrs.asdict(r)))) == r
