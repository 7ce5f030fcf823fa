"""The placement table without processes: the ``metadata.json`` it describes tiles every tensor from the
blocks the ranks save (TP, EP, FSDP and PP together), and the norm weights count every gradient element
exactly once over the world."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.derive import Layout, stage_chunks
from tests.helpers.models import make_dsv3, make_qwen3

pytestmark = pytest.mark.engine

LAYOUTS = [
    (make_qwen3(), Layout(world=2, dp_shard=2)),
    (make_qwen3(), Layout(world=4, dp_replicate=2, dp_shard=2)),
    (make_qwen3(tie_word_embeddings=True), Layout(world=8, dp_shard=2, tp=2, pp=2)),
    (make_dsv3(num_attention_heads=4), Layout(world=8, dp_shard=2, tp=2, ep=2, pp=2)),
    (make_dsv3(), Layout(world=8, dp_replicate=2, dp_shard=2, cp=2, ep=4)),
]


def _ranks(cfg, layout):
    """(groups, placement table) of every rank, and the full model's tensors."""
    from mftk.engine.models.build import build_model, state_dict
    from mftk.engine.parallel.groups import mesh_groups
    from mftk.engine.parallel.parallelize import ParallelDims, parallelize

    ref = state_dict(build_model(cfg, seed=1))
    out = []
    for rank in range(layout.world):
        groups = mesh_groups(layout, rank)
        chunks = stage_chunks(cfg.num_hidden_layers, layout.pp, 1) if layout.pp > 1 else None
        par = parallelize(build_model(cfg, seed=1), ParallelDims(layout=layout, groups=groups, stage_chunks=chunks))
        out.append((groups, par.table))
    return ref, out


@pytest.mark.parametrize("cfg,layout", LAYOUTS)
def test_metadata_describes_shards_that_tile_each_tensor(cfg, layout):
    from mftk.ckpt.metadata import build_metadata, coverage_problems, parse_metadata, shard_slices

    ref, ranks = _ranks(cfg, layout)
    saved = {}
    for rank, (groups, table) in enumerate(ranks):  # what each rank writes: its stage's tensors, fully cut
        model = {n: table[n].cut(a, groups) for n, a in ref.items() if table.owned(n, groups)}
        opt = {f"adam_m.{n}": a for n, a in model.items() if table[n].trainable}
        saved[rank] = {**model, **opt, "global_step": np.array([2], np.int64)}
    groups, table = ranks[0]
    keys = [p.name for p in table]
    opt_keys = [f"adam_m.{p.name}" for p in table if p.trainable] + ["global_step"]
    meta = parse_metadata(build_metadata(table.sharded_tensors(keys, layout), table.sharded_tensors(opt_keys, layout),
                                         world=layout.world))
    assert set(meta) == set(keys) | set(opt_keys)
    for name, t in meta.items():
        assert coverage_problems(t) == []
        out = np.zeros(t.global_shape, saved[0]["global_step"].dtype if name == "global_step" else np.float32)
        for index, _ in t.chunks:  # what load_global does: each shard from the rank storage_data names
            entry = t.storage[index][0]
            assert ("-opt-" in entry.file_name) == (name.startswith("adam_") or name == "global_step")
            out[shard_slices(index, t.global_shape, t.axis_fragmentations)] = saved[entry.storage_rank][name]
        want = np.array([2]) if name == "global_step" else ref[name.removeprefix("adam_m.")]
        np.testing.assert_array_equal(out, want, err_msg=name)


@pytest.mark.parametrize("cfg,layout", LAYOUTS)
def test_norm_weights_count_each_element_once(cfg, layout):
    ref, ranks = _ranks(cfg, layout)
    rng = np.random.default_rng(0)
    grads = {n: rng.normal(size=a.shape) for n, a in ref.items()}
    total = 0.0
    for groups, table in ranks:  # every trainable tensor this rank holds, as its optimizer does (FSDP rows)
        for n, g in grads.items():
            if table[n].trainable and table.held(n, groups):
                local = table[n].cut(g, groups)
                total += table.norm_weight(n, groups) * float((local * local).sum())
    want = sum(float((g * g).sum()) for n, g in grads.items() if ranks[0][1][n].trainable)
    assert total == pytest.approx(want, rel=1e-12)


def test_fsdp_rows_nest_inside_the_tp_block():
    ref, ranks = _ranks(make_qwen3(), Layout(world=4, dp_shard=2, tp=2))
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    groups, table = ranks[3]  # tp rank 1, fsdp rank 1: the last quarter of the rows
    assert table[qkv].splits == ((0, "tp"), (0, "fsdp"))
    rows = ref[qkv].shape[0] // 4
    np.testing.assert_array_equal(table[qkv].cut(ref[qkv], groups), ref[qkv][3 * rows:])
    assert table[qkv].shard_index(groups) == 3
