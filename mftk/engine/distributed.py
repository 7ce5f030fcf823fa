"""What the trainer needs of a multi-process run: the gradient sync, the FSDP rows of the flat optimizer, the
global norm, the logged-value reductions and the checkpoint layout — all read from the placement table
(`parallel.placement`) that `parallel.parallelize` filled.

The trainer keeps its gradients and AdamW state in flat fp32 numpy buffers (one vectorised update,
`optim.py`). Under FSDP the Parameters themselves hold this rank's rows (`parallel.fsdp`), so the flat
layout is the local one and their gradients arrive already reduce-scattered by their units (``presynced``).

Per step (`sync_grads`), on the flat gradient of this rank's parameters, for those not presynced:
1. a tensor two pipeline stages hold (the embedding of a tied head or of MTP) is summed over the two;
2. under TP, every parameter TP left whole saw only this rank's tokens (sequence parallel): summed over TP;
3. dense parameters are averaged over dp×cp (one message);
4. expert-parallel weights are distinct per EP rank: summed over the ranks holding the same experts,
   divided by dp×cp.
Then the norm sums each element once over the world (`norm_weights`) and AdamW updates the local rows.

Numerics: each rank's loss is the mean over its micro-batches, so the dp-average of gradients and losses
equals the single-process run with the same global batch (same samples, summed in another order: equal
within fp32 rounding).
"""
from __future__ import annotations

from typing import Any, Sequence

import attrs
import numpy as np

from mftk.ckpt.metadata import ShardedTensor
from mftk.ckpt.names import MASTER, STEP, split_state, state_name


# --------------------------------------------------------------------------------------- step collectives
@attrs.define
class DistContext:
    """One rank of a multi-process job: its groups, the placement table, its trainable parameters' names (model
    order: the flat layout's; FSDP Parameters already hold only this rank's rows), its pipeline stage."""

    groups: Any  # parallel.groups.ParallelGroups
    table: Any  # parallel.placement.PlacementTable
    names: list[str]
    stage: Any = None  # parallel.pipeline_model.StageModel under PP
    presynced: tuple[int, ...] = ()  # FSDP-sharded parameters: their units already reduced their gradients
    grad_sink: Any = None  # parallel.fsdp.GradSink under FSDP (bound to the optimizer by `bind`)
    norm_weights: np.ndarray | None = None  # set by `bind`: per local gradient element, 1 / its replicas
    _opt_slices: list | None = None
    _state_kinds: Any = None  # set by `bind`: (name, global shape) -> the optimizer's state prefixes for it

    @property
    def pipeline(self) -> bool:
        return self.stage is not None

    def bind(self, optimizer: Any, params: Sequence[Any] = ()) -> None:
        """Learn the optimizer's flat layout (the trainer's gradient buffer when not FSDP) and each local
        gradient element's weight in the global norm (`placement.PlacementTable.norm_weight`)."""
        self._opt_slices = list(optimizer.slices)
        self._state_kinds = getattr(optimizer, "state_kinds", None)
        w = np.ones(optimizer.size, np.float32)
        for i, name in enumerate(self.names):
            w[optimizer.slices[i]] = self.table.norm_weight(name, self.groups)
        self.norm_weights = w
        if self.grad_sink is not None:
            self.grad_sink.bind(params, optimizer)

    def cut(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """Global tensors (a loaded checkpoint's optimizer state) → this rank's blocks of its stage's tensors."""
        return self.table.cut(tensors, self.groups)

    def saved_model(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What this rank writes of its model tensors (TP/EP blocks and FSDP rows): those its stage saves."""
        return {k: v for k, v in tensors.items() if self.table.owned(k, self.groups)}

    def saved_optimizer(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The optimizer states this rank writes: ``global_step`` and those of the tensors its stage saves."""
        return {k: v for k, v in tensors.items() if k == STEP or self.table.owned(k, self.groups)}

    @property
    def rank(self) -> int:
        return self.groups.rank

    @property
    def world(self) -> int:
        return self.groups.layout.world

    def sync_grads(self, full: np.ndarray) -> np.ndarray:
        """The steps of the module docstring on the flat gradient of this rank's parameters, in place; the
        gradients of FSDP-sharded parameters (``presynced``) arrive reduced from their units and are left alone."""
        return self._sync(_FlatGrads(np.asarray(full, np.float32), self._opt_slices)).result

    def sync_grad_tensors(self, grads: list[Any]) -> list[Any]:
        """`sync_grads` on the device path's per-parameter gradient tensors (`device_optim`), on the device."""
        return self._sync(_TensorGrads(grads)).result

    def _sync(self, buf: Any) -> Any:
        """The module docstring's steps, over a host flat buffer or a list of device tensors (``buf``)."""
        pre = set(self.presynced)
        place = [(i, self.table[n]) for i, n in enumerate(self.names) if i not in pre]
        g = self.groups
        buf.reduce([i for i, p in place if len(p.stages) > 1], g.embedding, "sum")
        buf.reduce([i for i, p in place if not p.split_over("tp") and not p.expert], g.tp, "sum")
        experts = [i for i, p in place if p.expert]
        mine = buf.pack(experts)
        if pre:  # only the whole parameters: one message
            buf.reduce([i for i, p in place if not p.expert], g.dp_cp, "avg")
        else:
            buf.reduce_all(g.dp_cp, "avg")
        if experts:
            for group in (g.edp, g.dp_replicate):
                mine = buf.all_reduce(mine, group, "sum")
            buf.unpack(experts, mine / float(max(g.dp_cp.size, 1)))
        return buf

    def norm_squared(self, grads: list[Any], optimizer: Any) -> Any:
        """The device path's squared global norm: each parameter's Σg² weighted by 1/its replicas
        (`placement.PlacementTable.norm_weight`), summed over the world, as a device scalar."""
        from mftk.engine.parallel import comm

        weights = [self.table.norm_weight(n, self.groups) for n in self.names]
        sq = optimizer.squared_norm(grads, weights)
        return comm.all_reduce(sq.reshape(1), self.groups.world, "sum").reshape(())

    def mean(self, values: Sequence[float]) -> np.ndarray:
        """Scalars averaged over dp×cp (the logged loss, aux and MTP losses), at float64 precision."""
        g = self.groups.dp_cp
        return _sum_f64(np.asarray(values, np.float64), g) / max(g.size, 1)

    def stage_sum(self, values: Sequence[float]) -> np.ndarray:
        """Scalars summed over the pipeline stages (each stage fills its own entries, zeros elsewhere)."""
        return _sum_f64(np.asarray(values, np.float64), self.groups.pp)

    def sum_counts(self, counts: np.ndarray) -> np.ndarray:
        """tokens_per_expert summed over every rank (each counts its own tokens, for its stage's layers)
        before the expert-bias update (counts are exact in fp32)."""
        from mindspore import Tensor

        from mftk.engine.parallel import comm

        g = self.groups.world
        if g.is_trivial:
            return counts
        t = comm.all_reduce(Tensor(np.ascontiguousarray(counts, np.float32)), g, "sum")
        return t.asnumpy().astype(np.float64)

    def grad_norm(self, local: np.ndarray) -> float:
        """The full gradient's norm: each local element's square weighted by 1/its replicas, summed over the world.
        Block by block in float64 (`NORM_BLOCK` elements): no float64 copy of the whole gradient."""
        from mftk.engine.optim import NORM_BLOCK

        sq, w = 0.0, self.norm_weights
        for start in range(0, local.size, NORM_BLOCK):
            g64 = local[start:start + NORM_BLOCK].astype(np.float64)
            sq += float(np.dot(g64 * w[start:start + NORM_BLOCK], g64))
        return float(np.sqrt(_sum_f64(np.array([sq]), self.groups.world)[0]))

    def any_flag(self, flag: bool) -> bool:
        """True on every rank when any rank has the flag (a stop request must be agreed on)."""
        return bool(_sum_f64(np.array([1.0 if flag else 0.0]), self.groups.world)[0] > 0)

    def barrier(self) -> None:
        from mftk.engine.parallel import comm

        comm.barrier(self.groups.world)

    # ---------------------------------------------------------------- checkpoint layout
    def metadata_specs(self, model: dict[str, np.ndarray], optimizer: dict[str, np.ndarray] | None
                       ) -> tuple[dict[str, ShardedTensor], dict[str, ShardedTensor]]:
        """`ShardedTensor` specs of every saved tensor of every rank (rank 0 writes metadata.json): the
        model tensors of the table, and the optimizer states this rank saves for every trainable one — only
        the states that parameter has (Muon: ``muon_m`` for orthogonalised weights, ``adam_m``/``adam_v``
        for the rest), which the bound optimizer says for the parameters of other pipeline stages too."""
        layout = self.groups.layout
        model_keys = [p.name for p in self.table]
        opt_keys: list[str] = []
        if optimizer is not None:
            states = sorted({s[0] for s in map(split_state, optimizer) if s is not None})
            has = self._state_kinds or (lambda name, shape: states)
            opt_keys = [state_name(s, p.name) for s in states for p in self.table if p.trainable
                        and (s == MASTER or s in has(p.name, tuple(p.shape)))]
            opt_keys += [STEP] if STEP in optimizer else []
        return (self.table.sharded_tensors(model_keys, layout),
                self.table.sharded_tensors(opt_keys, layout) if optimizer is not None else {})


class _FlatGrads:
    """`DistContext._sync`'s view of the host path's flat fp32 gradient (parameter ``i`` at ``slices[i]``)."""

    def __init__(self, flat: np.ndarray, slices: list) -> None:
        self.result, self.slices = flat, slices

    def pack(self, idx: Sequence[int]) -> np.ndarray:
        return np.concatenate([self.result[self.slices[i]] for i in idx]) if idx else np.zeros(0, np.float32)

    def unpack(self, idx: Sequence[int], packed: np.ndarray) -> None:
        off = 0
        for i in idx:
            n = self.slices[i].stop - self.slices[i].start
            self.result[self.slices[i]] = packed[off:off + n]
            off += n

    @staticmethod
    def all_reduce(packed: np.ndarray, group: Any, op: str) -> np.ndarray:
        return _all_reduce_np(packed, group, op)

    def reduce(self, idx: Sequence[int], group: Any, op: str) -> None:
        """Reduce the gradients of parameters ``idx`` over ``group``, in place (one message)."""
        if idx and not group.is_trivial:
            self.unpack(idx, self.all_reduce(self.pack(idx), group, op))

    def reduce_all(self, group: Any, op: str) -> None:
        from mftk.engine.parallel.comm import all_reduce_numpy

        self.result = all_reduce_numpy(self.result, group, op)  # in the buffer's own memory: no copy


class _TensorGrads(_FlatGrads):
    """The same for the device path's list of per-parameter gradient tensors: packs are device tensors."""

    def __init__(self, grads: list[Any]) -> None:
        self.result = grads

    def pack(self, idx: Sequence[int]) -> Any:
        from mindspore import ops

        return ops.concat([self.result[i].reshape(-1) for i in idx]) if idx else None

    def unpack(self, idx: Sequence[int], packed: Any) -> None:
        off = 0
        for i in idx:
            shape = tuple(self.result[i].shape)
            n = int(np.prod(shape, dtype=np.int64))
            self.result[i] = packed[off:off + n].reshape(shape)
            off += n

    @staticmethod
    def all_reduce(packed: Any, group: Any, op: str) -> Any:
        from mftk.engine.parallel import comm

        return comm.all_reduce(packed, group, op)

    def reduce_all(self, group: Any, op: str) -> None:
        self.reduce(range(len(self.result)), group, op)


def _all_reduce_np(packed: np.ndarray, group: Any, op: str = "sum") -> np.ndarray:
    from mftk.engine.parallel import comm

    return comm.all_reduce_numpy(packed, group, op)


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


def make_context(groups: Any, table: Any, params: Sequence[Any], stage: Any = None, grad_sink: Any = None) -> DistContext:
    """The context of this rank: its trainable ``params`` (model order; FSDP Parameters already hold their rows,
    `parallel.fsdp`, so the flat layout is the local one) and which of them their FSDP units sync."""
    names = [p.name for p in params]
    sharded = tuple(i for i, n in enumerate(names) if table[n].split_over("fsdp"))
    return DistContext(groups=groups, table=table, names=names, stage=stage, presynced=sharded,
                       grad_sink=grad_sink)
