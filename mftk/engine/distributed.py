"""Data parallel and FSDP around the trainer's flat numpy optimizer, and the checkpoint layout they save.

Why not `parallel.data_parallel.FsdpParams` as is: the trainer keeps its gradients and AdamW state
in flat fp32 numpy buffers (one vectorised update, `optim.py`), while `FsdpParams` shards
MindSpore Parameters with ceil-sized row blocks; uneven blocks cannot be described by the
reference's ``metadata.json`` (``local_shape = global_shape // axis_fragmentations``). So here a
parameter is sharded along dim 0 over the FSDP group **when dim 0 divides evenly** by its size,
and kept whole (replicated) otherwise; the collectives are the foundation's (`parallel.comm`).

Per step (`DistContext`): the full flat gradient is averaged over the dp×cp group (one message;
the CPU reduce-scatter is an all-reduce + slice anyway), this rank keeps its rows of each sharded
parameter, the norm is summed over the shard group, AdamW updates the local rows only, and the
updated rows are all-gathered (one message) back into the full model parameters.

Numerics: each rank's loss is the mean over its micro-batches, so the dp-average of gradients
and losses equals the single-process run with the same global batch (same samples, summed in
another order: equal within fp32 rounding).
"""
from __future__ import annotations

from typing import Any, Sequence

import attrs
import numpy as np

from mftk.ckpt.metadata import ShardedTensor

_DTYPE_NAMES = {"float32": "Float32", "float16": "Float16", "float64": "Float64", "int64": "Int64",
                "int32": "Int32", "int8": "Int8", "uint8": "UInt8", "bool": "Bool"}


# --------------------------------------------------------------------------------------- sharding plan
class FlatSharding:
    """Which rows of each trainable parameter this rank owns, and the full-size gradient layout.

    ``size``/``rank``: the FSDP (dp_shard·cp) group; size 1 means plain DP (everything whole).
    """

    def __init__(self, names: Sequence[str], shapes: Sequence[tuple[int, ...]], size: int, rank: int,
                 exclude: Sequence[str] = ()) -> None:
        self.names, self.shapes = list(names), [tuple(s) for s in shapes]
        self.size, self.rank = int(size), int(rank)
        skip = set(exclude)  # expert-parallel weights: their replicas are the EDP group, not the FSDP group
        self.rows: list[tuple[int, int] | None] = [None if n in skip else self._rows(s)
                                                   for n, s in zip(self.names, self.shapes)]
        self.full_slices, start = [], 0
        for s in self.shapes:
            n = int(np.prod(s, dtype=np.int64))
            self.full_slices.append(slice(start, start + n))
            start += n
        self.full_size = start
        self.index = {n: i for i, n in enumerate(self.names)}

    def _rows(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        if self.size <= 1 or not shape or shape[0] % self.size:
            return None
        block = shape[0] // self.size
        return self.rank * block, (self.rank + 1) * block

    @property
    def enabled(self) -> bool:
        return any(r is not None for r in self.rows)

    def sharded(self, name: str) -> bool:
        i = self.index.get(name)
        return i is not None and self.rows[i] is not None

    def local_shape(self, i: int) -> tuple[int, ...]:
        r = self.rows[i]
        return self.shapes[i] if r is None else (r[1] - r[0],) + self.shapes[i][1:]

    def local(self, i: int, full: np.ndarray) -> np.ndarray:
        r = self.rows[i]
        return np.asarray(full) if r is None else np.ascontiguousarray(np.asarray(full)[r[0]:r[1]])

    def cut(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """Global tensors (model names, or ``adam_m.<name>``-style optimizer names) → this rank's pieces."""
        out = {}
        for key, value in tensors.items():
            base = key.split(".", 1)[1] if key.startswith(("adam_m.", "adam_v.", "main_param.", "muon_m.")) else key
            i = self.index.get(base)
            out[key] = value if i is None else self.local(i, value)
        return out

    # ---------------------------------------------------------------- full-size gradient buffer
    def zeros_full(self) -> np.ndarray:
        return np.zeros(self.full_size, np.float32)

    def add_grads(self, flat: np.ndarray, grads: Sequence[np.ndarray], scale: float = 1.0) -> None:
        for sl, g in zip(self.full_slices, grads):
            src = np.asarray(g, np.float32).reshape(-1)
            flat[sl] += src if scale == 1.0 else src * np.float32(scale)

    def scatter(self, full: np.ndarray, optimizer: Any) -> np.ndarray:
        """This rank's rows of a full flat gradient, in the optimizer's flat layout."""
        local = optimizer.zeros_like_flat()
        for i, sl in enumerate(self.full_slices):
            optimizer.view(local, i)[...] = self.local(i, full[sl].reshape(self.shapes[i]))
        return local

    def norm_weights(self, optimizer: Any) -> np.ndarray:
        """Per element of the local flat buffer: 1 for owned rows, 1/size for replicated ones (counted once)."""
        w = np.ones(optimizer.size, np.float32)
        for i, r in enumerate(self.rows):
            if r is None:
                w[optimizer.slices[i]] = 1.0 / self.size
        return w


# --------------------------------------------------------------------------------------- step collectives
@attrs.define
class DistContext:
    """What the trainer needs to run one replica of a data-parallel (DP/FSDP/HSDP) job."""

    groups: Any  # parallel.groups.ParallelGroups
    sharding: FlatSharding
    splits: dict = attrs.field(factory=dict)  # name -> parallel.model_parallel.Split (TP / EP blocks)
    norm_weights: np.ndarray | None = None  # set by `bind` under TP/EP: 1/replicas per local gradient element
    pipeline: Any = None  # PipelineTable under PP: every stage's tensor names, shapes and dtypes
    stage: Any = None  # parallel.pipeline_model.StageModel of this rank under PP
    _opt_slices: list | None = None

    @property
    def model_parallel(self) -> bool:
        """TP/EP splits or PP stages: the grad norm sums each element once over the whole world."""
        return bool(self.splits) or self.groups.pp.size > 1

    def bind(self, optimizer: Any) -> None:
        """Learn the optimizer's flat layout (the trainer's gradient buffer when not FSDP) and, under TP/EP,
        each local gradient element's weight in the global norm: 1 / (ranks holding the same element)."""
        from mftk.engine.parallel.data_parallel import param_replicas

        self._opt_slices = list(optimizer.slices)
        if not self.model_parallel:
            return
        w = np.ones(optimizer.size, np.float32)
        for i, name in enumerate(self.sharding.names):
            split = self.splits.get(name)
            over: tuple[str, ...] = (split.axis,) if split is not None else ()
            if self.sharding.rows[i] is not None:
                over += ("dp_shard", "cp")
            w[optimizer.slices[i]] = 1.0 / param_replicas(self.groups, over)
        self.norm_weights = w

    def cut(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """Global tensors (a loaded checkpoint's optimizer state) → this rank's TP/EP block, then FSDP rows."""
        from mftk.engine.parallel.model_parallel import base_name, cut

        if self.pipeline is not None:  # other stages' optimizer states stay with them
            tensors = {k: v for k, v in tensors.items() if k == "global_step" or base_name(k) in self.sharding.index}
        return self.sharding.cut(cut(tensors, self.splits))

    def _buffer_slices(self) -> list:
        return self.sharding.full_slices if self.sharding.enabled else self._opt_slices

    def _pack(self, flat: np.ndarray, idx: Sequence[int]) -> np.ndarray:
        sl = self._buffer_slices()
        return np.concatenate([flat[sl[i]] for i in idx]) if idx else np.zeros(0, np.float32)

    def _unpack(self, flat: np.ndarray, idx: Sequence[int], packed: np.ndarray) -> None:
        sl, off = self._buffer_slices(), 0
        for i in idx:
            n = sl[i].stop - sl[i].start
            flat[sl[i]] = packed[off:off + n]
            off += n

    def _all_reduce_np(self, packed: np.ndarray, group: Any, op: str = "sum") -> np.ndarray:
        from mindspore import Tensor

        from mftk.engine.parallel import comm

        if group.is_trivial or not packed.size:
            return packed
        return comm.all_reduce(Tensor.from_numpy(np.ascontiguousarray(packed)), group, op).asnumpy()

    @property
    def rank(self) -> int:
        return self.groups.rank

    @property
    def world(self) -> int:
        return self.groups.layout.world

    def sync_grads(self, full: np.ndarray) -> np.ndarray:
        """Average over dp×cp. Under TP (with SP) every replicated parameter first has its partial
        gradients summed over TP (norms see only this rank's tokens or heads). Expert-parallel weights
        are distinct per EP rank: summed over the ranks holding the same experts, divided by dp×cp."""
        from mftk.engine.parallel.data_parallel import sync_flat_gradients

        if not self.model_parallel:
            return sync_flat_gradients(full, self.groups, op="avg")
        full = np.array(full, np.float32, copy=True)
        names = self.sharding.names
        if self.groups.tp.size > 1:
            rep = [i for i, n in enumerate(names) if n not in self.splits]
            self._unpack(full, rep, self._all_reduce_np(self._pack(full, rep), self.groups.tp))
        experts = [i for i, n in enumerate(names) if n in self.splits and self.splits[n].axis == "ep"]
        mine = self._pack(full, experts)
        full = sync_flat_gradients(full, self.groups, op="avg")
        if experts:
            for g in (self.groups.edp, self.groups.dp_replicate):
                mine = self._all_reduce_np(mine, g)
            self._unpack(full, experts, mine / np.float32(max(self.groups.dp_cp.size, 1)))
        return full

    def mean(self, values: Sequence[float]) -> np.ndarray:
        """Scalars averaged over dp×cp (the logged loss, aux and MTP losses), at float64 precision."""
        g = self.groups.dp_cp
        return _sum_f64(np.asarray(values, np.float64), g) / max(g.size, 1)

    def sum_counts(self, counts: np.ndarray) -> np.ndarray:
        """tokens_per_expert summed over dp×cp before the expert-bias update (counts are exact in fp32)."""
        from mindspore import Tensor

        from mftk.engine.parallel import comm

        g = self.groups.dp_cp
        if g.is_trivial:
            return counts
        t = comm.all_reduce(Tensor(np.ascontiguousarray(counts, np.float32)), g, "sum")
        return t.asnumpy().astype(np.float64)

    def grad_norm(self, local: np.ndarray, weights: np.ndarray | None) -> float:
        """The full gradient's norm: local squares (replicated parts weighted 1/size) summed over the shard group."""
        if self.norm_weights is not None:  # TP/EP: every element counted once over the whole world
            g64 = local.astype(np.float64)
            sq = float(np.dot(g64 * self.norm_weights, g64))
            return float(np.sqrt(_sum_f64(np.array([sq]), self.groups.world)[0]))
        if weights is None:
            from mftk.engine.optim import global_norm

            return global_norm(local)
        g64 = local.astype(np.float64)
        sq = float(np.dot(g64 * weights, g64))
        return float(np.sqrt(_sum_f64(np.array([sq]), self.groups.fsdp)[0]))

    def gather_params(self, optimizer: Any) -> list[np.ndarray]:
        """Full parameter values from every rank's updated rows (one all-gather over the shard group)."""
        from mindspore import Tensor

        from mftk.engine.parallel import comm

        sh = self.sharding
        local = optimizer.masters()
        owned = [i for i, r in enumerate(sh.rows) if r is not None]
        if not owned:
            return local
        packed = np.concatenate([local[i].reshape(-1) for i in owned])
        parts = [p.asnumpy() for p in comm.all_gather_list(Tensor(packed), self.groups.fsdp)]
        out = list(local)
        off = 0
        for i in owned:
            shape = sh.local_shape(i)
            n = int(np.prod(shape, dtype=np.int64))
            out[i] = np.concatenate([p[off:off + n].reshape(shape) for p in parts], axis=0)
            off += n
        return out

    def any_flag(self, flag: bool) -> bool:
        """True on every rank when any rank has the flag (a stop request must be agreed on)."""
        return bool(_sum_f64(np.array([1.0 if flag else 0.0]), self.groups.world)[0] > 0)

    def barrier(self) -> None:
        from mftk.engine.parallel import comm

        comm.barrier(self.groups.world)

    # ---------------------------------------------------------------- checkpoint layout
    def metadata_specs(self, model: dict[str, np.ndarray], optimizer: dict[str, np.ndarray] | None
                       ) -> tuple[dict[str, ShardedTensor], dict[str, ShardedTensor]]:
        """`ShardedTensor` specs of this rank's saved tensors (every rank saves the same names)."""
        from mftk.engine.parallel.groups import mesh_groups

        layout = self.groups.layout
        mesh = [mesh_groups(layout, r) for r in range(layout.world)]
        if self.pipeline is not None:  # rank 0 describes every stage's tensors, not only its own
            model, optimizer = self.pipeline.placeholders(optimizer is not None)

        def spec(key: str, local: np.ndarray) -> ShardedTensor:
            base = key.split(".", 1)[1] if key.startswith(("adam_m.", "adam_v.", "main_param.", "muon_m.")) else key
            i = self.sharding.index.get(base)
            if self.pipeline is not None and i is None and self.sharding.size > 1:
                raise ValueError("pipeline parallel with FSDP is not supported")  # refused by run.check_supported_layout
            dtype = _DTYPE_NAMES.get(str(getattr(local, "dtype", "")), "BFloat16")
            split = self.splits.get(base)
            rows = i is not None and self.sharding.rows[i] is not None
            shape = list(self.sharding.shapes[i] if rows else np.shape(local))  # the TP/EP block, before FSDP
            frag = [1] * len(shape)
            if split is not None:
                frag[split.dim] *= split.group.size
                shape[split.dim] *= split.group.size
            if rows:  # FSDP rows inside the TP/EP block on dim 0
                frag[0] *= self.sharding.size
            holders = {}
            stage = self.pipeline.stage_of(key) if self.pipeline is not None else None
            for r in range(layout.world):
                if stage is not None and mesh[r].pp.rank != stage:
                    continue  # held by the ranks of its pipeline stage only
                coords = [0] * len(shape)
                if split is not None:
                    coords[split.dim] = getattr(mesh[r], split.axis).rank
                if rows:
                    coords[0] = coords[0] * self.sharding.size + mesh[r].fsdp.rank
                holders[r] = int(np.ravel_multi_index(coords, frag)) if coords else 0
            groups: dict[int, list[int]] = {}
            for r, s in holders.items():
                groups.setdefault(s, []).append(r)
            replica = [groups[holders[r]].index(r) for r in sorted(holders)]
            return ShardedTensor(global_shape=tuple(shape), axis_fragmentations=tuple(frag), holders=holders,
                                 dtype=dtype, replica_id=replica)

        return ({k: spec(k, v) for k, v in model.items()},
                {k: spec(k, v) for k, v in (optimizer or {}).items()})


def _sum_f64(values: np.ndarray, group: Any) -> np.ndarray:
    """Sum float64 values over a group through fp32 collectives: each value travels as hi + lo fp32 parts,
    every rank gathers all parts and adds them in float64 in rank order (same result on every rank)."""
    if group.is_trivial:
        return values.astype(np.float64)
    from mindspore import Tensor

    from mftk.engine.parallel import comm

    hi = values.astype(np.float32)
    lo = (values - hi.astype(np.float64)).astype(np.float32)
    n = len(values)
    total = np.zeros(n, np.float64)
    for part in comm.all_gather_list(Tensor(np.concatenate([hi, lo])), group):
        a = part.asnumpy().astype(np.float64)
        total += a[:n] + a[n:]
    return total


def make_context(layout: Any, names: Sequence[str], shapes: Sequence[tuple[int, ...]], *, groups: Any = None,
                 splits: dict | None = None) -> DistContext:
    """The sharding plan of this rank; creates the process groups (after ``communication.init()``) unless given.
    ``splits``: the TP/EP blocks of a model-parallel model (`parallel.model_parallel.param_splits`)."""
    from mftk.engine.parallel.groups import create_groups

    groups = groups if groups is not None else create_groups(layout)
    splits = dict(splits or {})
    experts = [n for n, s in splits.items() if s.axis == "ep"]
    return DistContext(groups=groups, sharding=FlatSharding(names, shapes, groups.fsdp.size, groups.fsdp.rank,
                                                            exclude=experts), splits=splits)
