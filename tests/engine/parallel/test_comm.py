"""CPU collectives between 2 msrun workers against hand-computed values."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.engine]


def _x(r: int) -> np.ndarray:
    return np.arange(6, dtype=np.float64).reshape(2, 3) + 10 * r


@pytest.mark.parametrize("rank", [0, 1])
def test_reductions(two_rank, rank):
    c = two_rank[rank]["collectives"]
    np.testing.assert_array_equal(c["sum"], _x(0) + _x(1))
    np.testing.assert_array_equal(c["avg"], (_x(0) + _x(1)) / 2)
    np.testing.assert_array_equal(c["max"], _x(1))
    np.testing.assert_array_equal(c["input_unchanged"], _x(rank))  # collectives must not write into the input
    np.testing.assert_array_equal(c["rs0"], (_x(0) + _x(1))[rank:rank + 1])


@pytest.mark.parametrize("rank", [0, 1])
def test_gather_broadcast_all_to_all(two_rank, rank):
    c = two_rank[rank]["collectives"]
    np.testing.assert_array_equal(c["gather1"], np.concatenate([_x(0), _x(1)], axis=1))
    np.testing.assert_array_equal(c["bcast1"], _x(1))
    np.testing.assert_array_equal(c["a2a"], np.concatenate([_x(0)[rank:rank + 1], _x(1)[rank:rank + 1]], axis=1))


@pytest.mark.parametrize("rank", [0, 1])
def test_uneven_all_to_all(two_rank, rank):
    c = two_rank[rank]["collectives"]
    pieces, counts = [], []
    for sender in (0, 1):
        rows = np.full((sender + 2, 2), sender, np.float64) + np.arange(sender + 2)[:, None]
        lo, hi = (0, sender + 1) if rank == 0 else (sender + 1, sender + 2)
        pieces.append(rows[lo:hi])
        counts.append(hi - lo)
    np.testing.assert_array_equal(c["a2a_uneven"], np.concatenate(pieces))
    assert c["a2a_uneven_counts"] == counts


def test_send_recv(two_rank):
    assert two_rank[1]["collectives"]["p2p"] == [1.5, 2.5]
    assert two_rank[0]["collectives"]["p2p"] == [3.0, 5.0]


@pytest.mark.parametrize("rank", [0, 1])
def test_packed_unit_collectives(two_rank, rank):
    """FSDP's per-unit gathers and reductions: small blocks travel together, a large one alone, and each
    comes back as if gathered / averaged by itself."""
    from tests.engine.parallel.jobs import packed_blocks

    c = two_rank[rank]["collectives"]
    assert c["packs"] == [[0, 1], [2], [3]]
    mine, other = packed_blocks(0), packed_blocks(1)
    for got, a, b in zip(c["gathered"], mine, other):
        np.testing.assert_array_equal(np.array(got), np.concatenate([a, b]))
    for got, a, b in zip(c["reduced"], mine, other):
        np.testing.assert_array_equal(np.array(got), (a.astype(np.float64) + b) / 2)
