"""FSDP rows of the flat optimizer and worker results (no processes); the checkpoint metadata and the norm
weights are tested with the placement table (tests/engine/parallel/test_placement.py)."""
from __future__ import annotations

import numpy as np

from mftk.engine.distributed import FlatSharding

NAMES = ["emb", "norm", "odd", "proj"]
SHAPES = [(8, 3), (4,), (5, 2), (6, 4)]


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def test_rows_split_evenly_else_replicated():
    sh = FlatSharding(NAMES, SHAPES, size=2, rank=1)
    assert sh.rows == [(4, 8), (2, 4), None, (3, 6)]  # 5 rows do not split in 2: kept whole
    assert [sh.local_shape(i) for i in range(4)] == [(4, 3), (2,), (5, 2), (3, 4)]
    assert FlatSharding(NAMES, SHAPES, size=1, rank=0).enabled is False


def test_cut_agrees_with_slicing_each_tensor():
    arrays = _arrays()
    for rank in (0, 1):
        sh = FlatSharding(NAMES, SHAPES, size=2, rank=rank)
        for i, a in enumerate(arrays):
            want = a if sh.rows[i] is None else a[sh.rows[i][0]:sh.rows[i][1]]
            np.testing.assert_array_equal(sh.local(i, a), want)
        cut = sh.cut({"adam_m.emb": arrays[0], "odd": arrays[2], "global_step": np.array([3])})
        np.testing.assert_array_equal(cut["adam_m.emb"], arrays[0][4 * rank:4 * rank + 4])
        np.testing.assert_array_equal(cut["odd"], arrays[2])
        assert cut["global_step"].tolist() == [3]


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
