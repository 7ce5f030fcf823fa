"""Where every model tensor lives: the one table the cutting, the gradient sync, the optimizer sharding, the
grad norm and ``metadata.json`` all read.

`parallel.parallelize` fills it while it parallelizes the built model: for each tensor (parameter or buffer,
reference name) its global shape and dtype, the dims it is split on and over which mesh axis (``tp``,
``ep``, ``fsdp`` — in nesting order: FSDP rows sit inside the TP block of dim 0), and the pipeline stages
holding it (the first stage saves a copy that several stages keep, e.g. the embedding used for tied heads
and MTP). Everything here is pure (rank arithmetic over `groups.mesh_groups`), so it is tested without
processes and rank 0 can describe every rank's shards.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import attrs
import numpy as np

from mftk.ckpt.metadata import ShardedTensor
from mftk.ckpt.names import STEP, param_of
from mftk.derive import Layout

AXES = ("tp", "ep", "fsdp")  # mesh axes a tensor can be split over (`groups.mesh_groups` names)
_DTYPE_NAMES = {"float32": "Float32", "float16": "Float16", "float64": "Float64", "int64": "Int64",
                "int32": "Int32", "int8": "Int8", "uint8": "UInt8", "bool": "Bool", "bfloat16": "BFloat16"}


@attrs.frozen
class Placement:
    """One tensor: global shape, splits ``((dim, axis), ...)`` outermost first, the stages holding it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name
    trainable: bool
    splits: tuple[tuple[int, str], ...] = ()
    stages: tuple[int, ...] = (0,)  # pipeline stages holding it; the first one saves it and counts it in norms

    @property
    def owner(self) -> int:
        return self.stages[0]

    @property
    def expert(self) -> bool:
        """Split over expert parallel: its replicas are the ranks holding the same experts."""
        return any(axis == "ep" for _, axis in self.splits)

    def split_over(self, axis: str) -> bool:
        return any(a == axis for _, a in self.splits)

    def local_shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        shape = list(self.shape)
        for dim, axis in self.splits:
            shape[dim] //= sizes[axis]
        return tuple(shape)

    def fragments(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        frag = [1] * len(self.shape)
        for dim, axis in self.splits:
            frag[dim] *= sizes[axis]
        return tuple(frag)

    def shard_index(self, groups: Any) -> int:
        """Row-major index of the shard ``groups`` (one rank's `ParallelGroups`) holds (metadata numbering)."""
        sizes = axis_sizes(groups)
        coords = [0] * len(self.shape)
        for dim, axis in self.splits:
            g = getattr(groups, axis)
            coords[dim] = coords[dim] * g.size + g.rank
        return int(np.ravel_multi_index(coords, self.fragments(sizes))) if coords else 0

    def cut(self, array: np.ndarray, groups: Any, *, upto: str | None = None) -> np.ndarray:
        """This rank's block of the global ``array``; ``upto="fsdp"`` stops before the FSDP rows."""
        out = np.asarray(array)
        for dim, axis in self.splits:
            if axis == upto:
                break
            g = getattr(groups, axis)
            if g.size > 1:
                out = np.split(out, g.size, axis=dim)[g.rank]
        return np.ascontiguousarray(out)


def axis_sizes(groups: Any) -> dict[str, int]:
    return {axis: getattr(groups, axis).size for axis in AXES}


class PlacementTable:
    """Every tensor's `Placement`, by name, in the model's parameter order."""

    def __init__(self, placements: Iterable[Placement] = ()) -> None:
        self.by_name: dict[str, Placement] = {p.name: p for p in placements}

    def __getitem__(self, name: str) -> Placement:
        return self.by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def __iter__(self):
        return iter(self.by_name.values())

    @classmethod
    def of_model(cls, model: Any) -> "PlacementTable":
        """Every parameter and buffer of a built (global-shape) model, whole, on stage 0."""
        return cls(Placement(name=p.name, shape=tuple(p.shape), dtype=str(p.asnumpy().dtype),
                             trainable=bool(p.requires_grad)) for p in model.get_parameters())

    def split(self, name: str, dim: int, axis: str) -> None:
        p = self.by_name[name]
        self.by_name[name] = attrs.evolve(p, splits=p.splits + ((dim, axis),))

    def place(self, name: str, stages: tuple[int, ...]) -> None:
        self.by_name[name] = attrs.evolve(self.by_name[name], stages=tuple(stages))

    def add_fsdp_rows(self, fsdp_size: int, sizes: Mapping[str, int], only: Iterable[str] | None = None) -> None:
        """FSDP: dim 0 of every trainable, non-expert tensor whose TP-local dim 0 divides by the FSDP
        size is split over ``fsdp`` (the rest stays whole: uneven blocks cannot be described by
        ``metadata.json``, whose local shape is global // fragments); ``only``: the names that may be
        (those of an FSDP unit, `parallel.fsdp.shardable`)."""
        if fsdp_size <= 1:
            return
        allowed = None if only is None else set(only)
        for p in list(self):
            local = p.local_shape(sizes)
            if allowed is not None and p.name not in allowed:
                continue
            if p.trainable and not p.expert and local and local[0] % fsdp_size == 0:
                self.split(p.name, 0, "fsdp")

    # ------------------------------------------------------------------ per rank
    def held(self, name: str, groups: Any) -> bool:
        """Whether this rank's pipeline stage keeps the tensor."""
        return groups.pp.rank in self.by_name[param_of(name)].stages

    def owned(self, name: str, groups: Any) -> bool:
        """Whether this rank's stage saves the tensor (and counts it in the grad norm)."""
        return self.by_name[param_of(name)].owner == groups.pp.rank

    def cut(self, tensors: Mapping[str, Any], groups: Any, *, upto: str | None = None) -> dict[str, Any]:
        """Global tensors (model or ``adam_m.<name>``-style optimizer names) → this rank's blocks of those
        its stage holds; ``global_step`` and unknown names pass unchanged."""
        out = {}
        for key, value in tensors.items():
            p = self.by_name.get(param_of(key))
            if p is None or key == STEP:
                out[key] = value
            elif groups.pp.rank in p.stages:
                out[key] = p.cut(value, groups, upto=upto)
        return out

    def norm_weight(self, name: str, groups: Any) -> float:
        """1 / (ranks holding an identical copy of this rank's block of the gradient), 0 off its owner stage:
        the weight of each local element's square in the global norm (the reference's rule, §2.6)."""
        p = self.by_name[name]
        if p.owner != groups.pp.rank:
            return 0.0
        sizes = axis_sizes(groups)
        blocks = int(np.prod(p.fragments(sizes)))
        return blocks / (groups.layout.world // groups.layout.pp)

    # ------------------------------------------------------------------ checkpoint metadata
    def sharded_tensors(self, keys: Iterable[str], layout: Layout) -> dict[str, ShardedTensor]:
        """`ShardedTensor` of each saved key (model names or optimizer-state names), for ``metadata.json``:
        the ranks of the owner stage hold it, each its shard."""
        from mftk.engine.parallel.groups import mesh_groups

        mesh = [mesh_groups(layout, r) for r in range(layout.world)]
        out = {}
        for key in keys:
            if key == STEP:
                out[key] = ShardedTensor(global_shape=(1,), axis_fragmentations=(1,),
                                         holders={r: 0 for r in range(layout.world)}, dtype="Int64",
                                         replica_id=list(range(layout.world)))
                continue
            p = self.by_name[param_of(key)]
            holders = {r: p.shard_index(g) for r, g in enumerate(mesh) if g.pp.rank == p.owner}
            by_shard: dict[int, list[int]] = {}
            for r, s in holders.items():
                by_shard.setdefault(s, []).append(r)
            replica = [by_shard[holders[r]].index(r) for r in sorted(holders)]
            dtype = "Float32" if key != p.name else _DTYPE_NAMES.get(p.dtype, "Float32")  # optimizer states: fp32
            out[key] = ShardedTensor(global_shape=p.shape, axis_fragmentations=p.fragments(axis_sizes(mesh[0])),
                                     holders=holders, dtype=dtype, replica_id=replica)
        return out
