"""DP-averaged and FSDP-sharded gradients equal the full-batch gradient; FSDP's step equals DP's."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine.parallel import jobs, reference

pytestmark = [pytest.mark.slow, pytest.mark.engine]
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rank", [0, 1])
def test_dp_average_equals_full_batch_gradient(two_rank, rank):
    ref = reference.regression(jobs.dp_data())
    dp = two_rank[rank]["dp"]
    np.testing.assert_allclose(dp["dw"], ref["dw"], **TOL)
    np.testing.assert_allclose(dp["db"], ref["db"], **TOL)
    assert dp["norm"] == pytest.approx(ref["norm"], rel=1e-6)
    np.testing.assert_allclose(dp["flat"], np.concatenate([ref["dw"].ravel(), ref["db"]]), **TOL)  # flat numpy path
    assert dp["loss_mean"] == pytest.approx(ref["loss"], rel=1e-6)  # mean of the two half-batch losses


def test_fsdp_shards_step_and_gather(two_rank):
    d, ref = jobs.dp_data(), reference.regression(jobs.dp_data())
    assert [two_rank[r]["fsdp"]["local_rows"][0] for r in (0, 1)] == [[0, 3], [3, 5]]  # ceil blocks of 5 rows
    np.testing.assert_allclose(np.concatenate([two_rank[r]["fsdp"]["local_dw"] for r in (0, 1)]), ref["dw"], **TOL)
    for r in (0, 1):
        f = two_rank[r]["fsdp"]
        assert f["norm"] == pytest.approx(ref["norm"], rel=1e-6)
        np.testing.assert_allclose(f["w_after"], d["w"] - 0.1 * ref["dw"], **TOL)
        np.testing.assert_allclose(f["b_after"], d["b"] - 0.1 * ref["db"], **TOL)
