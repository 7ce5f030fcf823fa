"""Numpy layout helpers shared by the HF ↔ reference mappings (no MindSpore import).

A family's mapping is one table of `Rule` rows (HF names ↔ reference names, with the layout change each way);
`apply_table` reads it in either direction, so the two directions cannot drift apart.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

import attrs
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


# ----------------------------------------------------------------------------- one table, both directions

def _same(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    return arrays


@attrs.frozen
class Rule:
    """One row of a family's mapping table: HF tensors ``hf`` ↔ reference tensors ``mf``. ``to_mf`` turns the HF
    arrays (in ``hf``'s order) into the reference's, ``to_hf`` back; a rename needs neither. A side with no
    counterpart on the other is made or dropped: ``to_mf=None`` (or ``to_hf=None``) drops the source tensors
    when present (max-logit buffers, a tied head), a row with no ``hf`` names makes its reference tensors
    from nothing (the zeros of ``tokens_per_expert``), and a function that returns nothing checks what it
    drops (a frozen buffer that must hold its constant)."""

    hf: tuple[str, ...]
    mf: tuple[str, ...]
    to_mf: Callable[..., tuple[np.ndarray, ...]] | None = _same
    to_hf: Callable[..., tuple[np.ndarray, ...]] | None = _same


def rename(hf: str, mf: str) -> Rule:
    return Rule((hf,), (mf,))


def apply_table(table: Iterable[Rule], tensors: Mapping[str, np.ndarray], to: str,
                ignore_prefixes: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """``tensors`` (HF names when ``to == "mf"``, reference names when ``to == "hf"``) through every row of
    ``table`` in that direction; raises CheckpointError naming every missing and unexpected tensor (but those
    under ``ignore_prefixes``)."""
    src, out = Source(tensors, "HF" if to == "mf" else "mftk"), {}
    for row in table:
        names, made, fn = (row.hf, row.mf, row.to_mf) if to == "mf" else (row.mf, row.hf, row.to_hf)
        if fn is None:
            for name in names:
                src.skip(name)
            continue
        arrays = [src.take(name) for name in names]
        if all(a is not None for a in arrays):
            out.update(zip(made, fn(*arrays)))
    src.check(ignore_prefixes)
    return out


def ends_table(tied: bool, names: tuple[str, str, str]) -> list[Rule]:
    """The embedding, final norm and output layer: HF ``names`` (embedding, norm, head) ↔ the reference's; a tied
    head has no reference tensor (HF may store one: dropped)."""
    head = (Rule((names[2],), (), to_mf=None) if tied else rename(names[2], "output_layer.weight"))
    return [rename(names[0], "embedding.word_embeddings.weight"), rename(names[1], "decoder.final_layernorm.weight"),
            head]


def dense_mlp_table(p: str, m: str) -> list[Rule]:
    """HF ``mlp.{gate,up,down}_proj`` ↔ the reference's row-interleaved ``mlp.linear_fc1`` and ``mlp.linear_fc2``."""
    return [rename(p + "mlp.down_proj.weight", m + "mlp.linear_fc2.weight"),
            Rule((p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"), (m + "mlp.linear_fc1.weight",),
                 to_mf=lambda g, u: (interleave_rows(g, u),), to_hf=deinterleave_rows)]


def experts_rule(key: Callable[[int, str], str], num_experts: int, names: tuple[str, str, str],
                 weight1: str, weight2: str) -> Rule:
    """Per-expert HF tensors ``key(e, name)`` (gate ``[F, H]``, up ``[F, H]``, down ``[H, F]``) ↔ reference
    ``weight1 [E, H, 2F]`` = ``[gateᵀ | upᵀ]`` and ``weight2 [E, F, H]`` = ``downᵀ``."""
    hf = tuple(key(e, n) for e in range(num_experts) for n in names)

    def to_mf(*arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        per = [arrays[i:i + 3] for i in range(0, len(arrays), 3)]
        return (np.stack([np.concatenate([g.T, u.T], 1) for g, u, _ in per]), np.stack([d.T for _, _, d in per]))

    def to_hf(w1: np.ndarray, w2: np.ndarray) -> tuple[np.ndarray, ...]:
        f = w1.shape[-1] // 2
        return tuple(a for e in range(w1.shape[0])
                     for a in (w1[e, :, :f].T.copy(), w1[e, :, f:].T.copy(), w2[e].T.copy()))

    return Rule(hf, (weight1, weight2), to_mf=to_mf, to_hf=to_hf)
