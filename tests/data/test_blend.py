"""data_path, split, size and blending arithmetic against the reference's vectors (§7) and a
second implementation of the greedy blend."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.data import blend
from mftk.derive import parse_split


def test_normalize_twice_is_what_the_reference_does():
    once = blend.normalize([0.3, 0.7])
    assert once == [0.3, 0.7]
    assert blend.normalize([1, 1, 1]) == [1 / 3, 1 / 3, 1 / 3]


@pytest.mark.parametrize("split, n, ranges", [
    ("1, 0, 0", 10, [(0, 10), None, None]),
    ("99,1,0", 1000, [(0, 990), (990, 1000), None]),
    ("98,2,0", 10, [(0, 10), (10, 10), None]),
    ("80,10,10", 10, [(0, 8), (8, 9), (9, 10)]),
    ("1,1", 5, [(0, 2), (2, 5), None]),
    ("969, 30, 1", 12345, [(0, 11962), (11962, 12333), (12333, 12345)]),
    ("0.7,0.2,0.1", 3, [(0, 2), (2, 3), (3, 3)]),
])
def test_split_ranges(split, n, ranges):
    assert blend.split_ranges(parse_split(split), n) == ranges


def test_split_matrix():
    m = blend.split_matrix([1.0, 0.0, 0.0])
    assert m == [(0, 1.0), None, None] and isinstance(m[0][0], int)


@pytest.mark.parametrize("target, weights, mf", [
    (16, [1], [17]), (30, [.3, .7], [10, 22]), (1000, [.25, .75], [252, 754]), (8000, [1], [8040]),
    (7, [1 / 3, 2 / 3], [3, 5]),
])
def test_margin_sizes(target, weights, mf):
    assert [s[0] for s in blend.sizes_per_dataset(weights, [target])] == mf


def test_b7_blending_indices():
    ds, smp = blend.build_blending_indices([0.5, 0.3, 0.2], 20)
    assert ds.dtype == np.int16 and smp.dtype == np.int64
    assert ds.tolist() == [0, 1, 2, 0, 1, 0, 2, 0, 1, 0, 0, 1, 2, 0, 1, 0, 2, 0, 1, 0]
    assert smp.tolist() == [0, 0, 0, 1, 1, 2, 1, 3, 2, 4, 5, 3, 2, 6, 4, 7, 3, 8, 5, 9]


def test_b2_blending_indices():
    w = blend.normalize(blend.normalize([0.3, 0.7]))
    ds, smp = blend.build_blending_indices(w, 32)
    assert ds.tolist() == [1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1,
                           1, 0, 1]
    assert smp.tolist() == [0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7, 8, 9, 4, 10, 11, 5, 12, 13, 6, 14, 15, 16, 7, 17,
                            18, 8, 19, 20, 9, 21]


def test_b3_b4_unweighted_blends():
    ds, smp = blend.build_blending_indices(blend.normalize([8, 7]), 10)
    assert ds.tolist() == [0, 1] * 5 and smp.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    ds, smp = blend.build_exhaustive_blending_indices([8, 7])
    assert ds.tolist() == [0, 1] * 7 + [0]
    assert np.bincount(ds).tolist() == [8, 7]


def _greedy_numpy(weights, size):
    """Second implementation: the same rule with numpy argmax (first maximum wins)."""
    w = np.asarray(weights, dtype=np.float64)
    counts = np.zeros(len(w))
    out = []
    for s in range(size):
        d = int(np.argmax(w * max(s, 1.0) - counts))
        out.append((d, int(counts[d])))
        counts[d] += 1
    return out


@pytest.mark.parametrize("seed", range(20))
def test_blending_matches_second_implementation(seed):
    rng = np.random.RandomState(seed)
    w = blend.normalize(rng.rand(rng.randint(2, 6)) + 0.01)
    size = int(rng.randint(1, 300))
    ds, smp = blend.build_blending_indices(w, size)
    assert list(zip(ds.tolist(), smp.tolist())) == _greedy_numpy(w, size)
    # The decision at step s does not depend on the size.
    ds2, _ = blend.build_blending_indices(w, size // 2)
    assert ds2.tolist() == ds[: size // 2].tolist()


def test_exhaustive_blend_takes_every_sample_once():
    sizes = [5, 0, 13, 2]
    ds, smp = blend.build_exhaustive_blending_indices(sizes)
    assert np.bincount(ds, minlength=4).tolist() == sizes
    for d in range(4):
        assert smp[ds == d].tolist() == list(range(sizes[d]))


class _Fake:
    def __init__(self, name, n):
        self.name, self.n = name, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return (self.name, i)


def test_blended_dataset_routes_samples():
    b = blend.BlendedDataset([_Fake("a", 10), _Fake("b", 22)], [0.3, 0.7], 32)
    assert len(b) == 32 and b[0] == ("b", 0) and b[1] == ("a", 0) and b.source(3) == (1, 2)
    with pytest.raises(ValueError):
        blend.BlendedDataset([_Fake("a", 3)], [1.0], None)
    single = blend.SingleDataset(_Fake("a", 4))
    assert single[3] == ("a", 3) and single.source(2) == (0, 2)
    with pytest.raises(IndexError):
        single.source(4)
