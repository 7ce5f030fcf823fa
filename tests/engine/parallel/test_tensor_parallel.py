"""2-way TP (with and without sequence parallel) equals the unsharded numpy computation."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine.parallel import jobs, reference

pytestmark = [pytest.mark.slow, pytest.mark.engine]
TOL = dict(rtol=1e-5, atol=1e-6)


def _cat(two_rank, section, key, dim):
    return np.concatenate([np.asarray(two_rank[r][section][key]) for r in (0, 1)], axis=dim)


@pytest.mark.parametrize("section", ["tp_mlp", "tp_mlp_nosp"])
def test_column_row_linear_forward_backward(two_rank, section):
    ref = reference.tp_mlp(jobs.tp_data())
    for r in (0, 1):
        assert two_rank[r][section]["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    np.testing.assert_allclose(_cat(two_rank, section, "dw1", 0), ref["dw1"], **TOL)  # column: rows split
    np.testing.assert_allclose(_cat(two_rank, section, "dw2", 1), ref["dw2"], **TOL)  # row: columns split
    if section == "tp_mlp":  # SP: each rank holds its sequence half of the input gradient
        np.testing.assert_allclose(_cat(two_rank, section, "dx", 1), ref["dx"], **TOL)
    else:
        for r in (0, 1):
            np.testing.assert_allclose(two_rank[r][section]["dx"], ref["dx"], **TOL)


def test_vocab_parallel_embedding_and_cross_entropy(two_rank):
    ref = reference.vocab_ce(jobs.vocab_data())
    for r in (0, 1):
        assert two_rank[r]["vocab"]["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    np.testing.assert_allclose(_cat(two_rank, "vocab", "demb", 0), ref["demb"], **TOL)
    np.testing.assert_allclose(_cat(two_rank, "vocab", "dhead", 0), ref["dhead"], **TOL)
