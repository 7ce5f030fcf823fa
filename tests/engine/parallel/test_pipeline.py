"""Schedules (pure) and a 2-stage pipeline whose summed micro-batch losses and gradients equal the
unsplit model's."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.engine.parallel.pipeline import make_schedule, schedule_1f1b, schedule_gpipe
from tests.engine.parallel import jobs, reference


def test_1f1b_order_matches_hand_written_tables():
    assert schedule_1f1b(4, 2, 0) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert schedule_1f1b(4, 2, 1) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert schedule_1f1b(2, 4, 0) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]  # fewer micro-batches than warm-up
    assert schedule_gpipe(2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    with pytest.raises(ValueError, match="unsupported pipeline schedule"):
        make_schedule("zero_bubble", 4, 2, 0)


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
