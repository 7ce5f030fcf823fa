"""Schedules (pure: hand-written tables, and a simulation of every rank showing that no order deadlocks with
asynchronous sends and order-matched receives) and a 2-stage pipeline whose summed micro-batch losses and
gradients equal the unsplit model's."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.engine.parallel.pipeline import make_schedule, schedule_1f1b, schedule_gpipe, sends, virtual_stage
from tests.engine.parallel import jobs, reference


def _f(*micro):
    return [("F", i, 0) for i in micro]


def test_1f1b_order_matches_hand_written_tables():
    assert schedule_1f1b(4, 2, 0) == [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0), ("B", 1, 0), ("F", 3, 0),
                                      ("B", 2, 0), ("B", 3, 0)]
    assert schedule_1f1b(4, 2, 1) == [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0), ("F", 2, 0), ("B", 2, 0),
                                      ("F", 3, 0), ("B", 3, 0)]
    assert schedule_1f1b(2, 4, 0) == _f(0, 1) + [("B", 0, 0), ("B", 1, 0)]  # fewer micro-batches than warm-up
    assert schedule_gpipe(2) == _f(0, 1) + [("B", 0, 0), ("B", 1, 0)]
    with pytest.raises(ValueError, match="unsupported pipeline schedule"):
        make_schedule("zero_bubble", 4, 2, 0)


def test_interleaved_order_matches_megatron_table():
    # pp 2, 2 chunks, 4 micro-batches, rank 0: warm-up 2·(2−0−1) + (2−1)·2 = 4 forwards, micro-batches in groups of pp
    got = make_schedule("1f1b", 4, 2, 0, chunks=2)
    assert got[:4] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1)]
    assert got[4:6] == [("F", 2, 0), ("B", 0, 1)]  # backwards start with the last chunk
    assert got[-1] == ("B", 3, 0)
    with pytest.raises(ValueError, match="multiple of"):
        make_schedule("interleaved_1f1b", 3, 2, 0, chunks=2)


def _simulate(name: str, micro: int, pp: int, chunks: int) -> bool:
    """Run every rank's schedule: an action waits until the message it needs was sent (sends never block)."""
    schedules = {r: make_schedule(name, micro, pp, r, chunks) for r in range(pp)}
    last, pos, sent, forwards = pp * chunks - 1, {r: 0 for r in range(pp)}, set(), set()
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while pos[r] < len(schedules[r]):
                kind, i, c = schedules[r][pos[r]]
                vs = virtual_stage(c, r, pp)
                need = (("act", i, vs) if vs > 0 else None) if kind == "F" else (("grad", i, vs) if vs < last else None)
                if need is not None and need not in sent:
                    break
                if kind == "B":
                    assert (i, vs) in forwards  # a backward only after its forward
                forwards.add((i, vs))
                sent.update(key for _, key in sends([schedules[r][pos[r]]], r, pp, chunks))
                pos[r] += 1
                progress = True
    for r, actions in schedules.items():  # every (micro-batch, chunk) once forward and once backward
        assert sorted(actions) == sorted((k, i, c) for k in "BF" for i in range(micro) for c in range(chunks))
    return all(pos[r] == len(schedules[r]) for r in range(pp))


@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("micro_per_pp", [1, 2, 3])
def test_no_schedule_deadlocks(pp, chunks, micro_per_pp):
    names = ["1f1b", "gpipe"] if chunks == 1 else ["interleaved_1f1b"]
    for name in names:
        assert _simulate(name, pp * micro_per_pp, pp, chunks), (name, pp, chunks, micro_per_pp)


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("schedule", ["pp_1f1b", "pp_gpipe"])
def test_two_stage_pipeline_equals_single_process(two_rank, schedule):
    ref = reference.tp_mlp(jobs.tp_data())
    assert two_rank[0][schedule]["losses"] == []  # only the last stage reports a loss
    assert sum(two_rank[1][schedule]["losses"]) == pytest.approx(ref["loss"], rel=1e-6)
    assert len(two_rank[1][schedule]["losses"]) == 4
    np.testing.assert_allclose(two_rank[0][schedule]["grad"], ref["dw1"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two_rank[1][schedule]["grad"], ref["dw2"], rtol=1e-5, atol=1e-6)
