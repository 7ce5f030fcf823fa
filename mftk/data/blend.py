"""Blending several prefixes into one sample stream: data_path, split and size arithmetic.

Reproduces MindSpore Transformers' builder (reference megatron-data.md §4): weights are
normalised twice (builder, then BlendedDataset), each weighted source is asked for
``ceil(t·w·1.005)`` samples, split bounds use Python's half-to-even ``round``, and the
greedy blending index picks, at every step, the source furthest behind its share.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

SIZE_SURPLUS = 0.005  # MF's margin on every weighted source's sample count


# ---------------------------------------------------------------------------------------------
# weights and split bounds (parsing data_path and split is `mftk.derive`'s)
# ---------------------------------------------------------------------------------------------
def normalize(weights: Sequence[float]) -> list[float]:
    """``w / sum(w)`` in float64, as a list (the reference applies it twice; so do we)."""
    w = np.array(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()


def split_matrix(shares: Sequence[float]) -> list[tuple[float, float] | None]:
    """Cumulative bookends per split (the first is the integer 0, as in the reference); None when empty."""
    bookends: list[float] = [0]
    for s in shares:
        bookends.append(bookends[-1] + s)
    return [(a, b) if b > a else None for a, b in zip(bookends[:-1], bookends[1:])]


def split_ranges(shares: Sequence[float], num_sequences: int) -> list[tuple[int, int] | None]:
    """Sequence ranges ``[beg, end)`` of each split for a dataset of ``num_sequences`` sequences."""
    out: list[tuple[int, int] | None] = []
    for bounds in split_matrix(shares):
        if bounds is None:
            out.append(None)
        else:
            out.append((int(round(bounds[0] * float(num_sequences))), int(round(bounds[1] * float(num_sequences)))))
    return out


# ---------------------------------------------------------------------------------------------
# sizes and blending indices
# ---------------------------------------------------------------------------------------------
def sizes_per_dataset(weights: Sequence[float], sizes: Sequence[int | None]) -> list[list[int | None]]:
    """Samples asked of each weighted source per split: ``ceil(t·w·1.005)`` (MF's formula)."""
    return [[None if t is None else int(math.ceil(t * w * (1 + SIZE_SURPLUS))) for t in sizes] for w in weights]


def build_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy error-minimising interleave: at step s pick the first d maximising ``w_d·max(s,1) − count_d``.

    Returns (dataset_index int16, dataset_sample_index int64). The decision at step s does not
    depend on ``size``, so blends of different sizes agree on their common prefix.
    """
    w = [float(x) for x in weights]
    n = len(w)
    counts = [0] * n
    dataset_index = np.empty(size, dtype=np.int16)
    sample_index = np.empty(size, dtype=np.int64)
    if n == 1:
        dataset_index[:] = 0
        sample_index[:] = np.arange(size)
        return dataset_index, sample_index
    ds_list = [0] * size
    smp_list = [0] * size
    rng = range(n)
    for s in range(size):
        x = float(max(s, 1))
        best, best_err = 0, w[0] * x - counts[0]
        for d in rng:
            err = w[d] * x - counts[d]
            if err > best_err:
                best, best_err = d, err
        ds_list[s] = best
        smp_list[s] = counts[best]
        counts[best] += 1
    dataset_index[:] = ds_list
    sample_index[:] = smp_list
    return dataset_index, sample_index


def build_exhaustive_blending_indices(sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Greedy interleave that takes every sample of every source exactly once (``size`` None)."""
    sizes = [int(s) for s in sizes]
    total = sum(sizes)
    weights = [s / total for s in sizes] if total else [0.0] * len(sizes)
    counts = [0] * len(sizes)
    unspent = [d for d, s in enumerate(sizes) if s > 0]
    ds_list: list[int] = []
    smp_list: list[int] = []
    s = 0
    while unspent:
        x = float(max(s, 1))
        best, best_err = unspent[0], weights[unspent[0]] * x - counts[unspent[0]]
        for d in unspent[1:]:
            err = weights[d] * x - counts[d]
            if err > best_err:
                best, best_err = d, err
        ds_list.append(best)
        smp_list.append(counts[best])
        counts[best] += 1
        if counts[best] == sizes[best]:
            unspent.remove(best)
        s += 1
    return np.array(ds_list, dtype=np.int16), np.array(smp_list, dtype=np.int64)


class BlendedDataset:
    """Samples drawn from several GPTDatasets through the blending index (no further shuffle)."""

    def __init__(self, datasets: Sequence[Any], weights: Sequence[float] | None, size: int | None) -> None:
        self.datasets = list(datasets)
        if size is None:
            if weights is not None:
                raise ValueError("a blend with weights needs a size")
            lengths = [len(d) for d in self.datasets]
            self.weights = normalize(lengths)
            self.dataset_index, self.dataset_sample_index = build_exhaustive_blending_indices(lengths)
        else:
            if weights is None:
                weights = [len(d) for d in self.datasets]
            self.weights = normalize(weights)
            self.dataset_index, self.dataset_sample_index = build_blending_indices(self.weights, size)
        self.size = len(self.dataset_index)

    def __len__(self) -> int:
        return self.size

    def source(self, i: int) -> tuple[int, int]:
        """(dataset number, sample number inside that dataset) of blended sample ``i``."""
        return int(self.dataset_index[i]), int(self.dataset_sample_index[i])

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        d, j = self.source(i)
        return self.datasets[d][j]


class SingleDataset:
    """One GPTDataset seen through the blended interface (a single unweighted prefix: no blend)."""

    def __init__(self, dataset: Any) -> None:
        self.datasets = [dataset]
        self.weights = [1.0]
        self.size = len(dataset)

    def __len__(self) -> int:
        return self.size

    def source(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.size:
            raise IndexError(f"sample {i} out of range for {self.size} samples")
        return 0, int(i)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.datasets[0][self.source(i)[1]]
