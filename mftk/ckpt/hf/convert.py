"""Numpy layout helpers shared by the HF ↔ reference mappings (no MindSpore import)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from mftk.errors import CheckpointError


def interleave_rows(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``[F, H] + [F, H] → [2F, H]`` with rows gate0, up0, gate1, up1, … (reference dense fc1, gotcha #7)."""
    return np.stack([gate, up], 1).reshape(-1, gate.shape[1])


def deinterleave_rows(fc1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return fc1[0::2].copy(), fc1[1::2].copy()


class Source:
    """A name → array mapping that remembers what was used, so leftovers and misses are reported."""

    def __init__(self, tensors: Mapping[str, np.ndarray], what: str) -> None:
        self.tensors, self.what, self.used, self.missing = tensors, what, set(), []

    def take(self, name: str) -> np.ndarray | None:
        if name not in self.tensors:
            self.missing.append(name)
            return None
        self.used.add(name)
        return np.asarray(self.tensors[name])

    def skip(self, name: str) -> None:
        self.used.add(name)

    def check(self, ignore_prefixes: tuple[str, ...] = ()) -> None:
        unused = sorted(n for n in self.tensors if n not in self.used and not n.startswith(ignore_prefixes))
        problems = [f"missing {self.what} tensor: {n}" for n in self.missing]
        problems += [f"unexpected {self.what} tensor (would be silently dropped): {n}" for n in unused]
        if problems:
            raise CheckpointError(message=f"{self.what} state dict does not match the model config "
                                  f"({len(self.missing)} missing, {len(unused)} unexpected)",
                                  problems=problems, hint="check that the model: section matches the checkpoint")


def expect_shape(name: str, a: np.ndarray, shape: tuple[int, ...]) -> None:
    if tuple(a.shape) != tuple(shape):
        raise CheckpointError(message=f"{name}: shape {tuple(a.shape)} does not match the config's {tuple(shape)}",
                              problems=[f"{name}: expected {tuple(shape)}, found {tuple(a.shape)}"],
                              hint="check hidden_size / heads / head dims in the model: section")
