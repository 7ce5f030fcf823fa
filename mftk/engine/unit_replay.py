"""A unit of the model whose forward is replayed in its backward: the one mechanism behind FSDP's per-unit
gather and activation recompute.

Why one custom-``bprop`` cell: in PyNative a cell with ``bprop`` is one node of the autograd graph, so its
inner activations are not kept for the backward (what recompute is for), and the parameters it uses can
be passed in as inputs whose gradients the ``bprop`` returns in any shape — FSDP returns the
reduce-scattered row block of a parameter gathered whole only for the unit's forward and its replay.
(A nested ``ms.vjp`` inside the forward, which would keep the activations instead, is refused by
MindSpore 2.10 under an outer ``value_and_grad``.)

`install(cell, kind, params, hooks)` swaps the cell's ``construct`` (an instance attribute: parameter names
and the cell tree stay as built, the layers carry no recompute or parallel code). The replayed forward sees
the very inputs, weights and buffer values of the first one (buffers a forward updates in place — MoE
expert counts, max attention logits — are put back before and after the replay), so its gradients are
those of the plain autograd run. The gradient of the unit's outputs is applied through ``Σ out·dout``
(one scalar), which gives the vector-Jacobian product MindSpore's own backward computes.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops


class UnitHooks:
    """What happens around the unit's two forwards (none: plain recompute). FSDP: gather the unit's
    sharded weights before each, free them after, reduce-scatter their gradients (`parallel.fsdp`)."""

    def gather(self) -> None:
        return None

    def free(self) -> None:
        return None

    def weights(self, params: list[Parameter]) -> list[Parameter]:
        """The Parameters the unit's cells read while gathered (those the replay differentiates)."""
        return params

    def reduce(self, grads: list[Tensor]) -> list[Tensor]:
        return grads


def _floating(x: Any) -> bool:
    return isinstance(x, Tensor) and x.dtype in (ms.float32, ms.float16, ms.bfloat16, ms.float64)


class ReplayedUnit(nn.Cell):
    """``fn(*tensors) -> tuple of tensors`` run once without keeping activations and replayed in ``bprop``.

    ``params``: every trainable parameter ``fn`` reads (passed in as trailing inputs, so their gradients
    flow); ``buffers``: non-trainable parameters it may update in place.
    """

    def __init__(self, fn: Callable, params: Sequence[Parameter], buffers: Sequence[Parameter], hooks: UnitHooks,
                 name: str) -> None:
        super().__init__()
        # plain attributes (object.__setattr__): a Cell would register and rename the parameters
        for key, value in (("_u_fn", [fn]), ("_u_params", list(params)), ("_u_buffers", list(buffers)), ("_u_hooks", hooks),
                           ("_u_saved", deque(maxlen=1024)), ("unit_name", name), ("replays", 0)):
            object.__setattr__(self, key, value)

    def _snapshot(self) -> list[np.ndarray]:
        return [b.asnumpy().copy() for b in self._u_buffers]

    def _restore(self, values: list[np.ndarray]) -> None:
        for b, v in zip(self._u_buffers, values):
            ops.assign(b, Tensor(v))

    def run(self, *inputs):
        """Call the unit; a forward that autograd records (its ``bprop`` will follow) saves the buffers' values
        for the replay — one that does not (a pipeline stage's plain forward) must not, or the replays of later
        micro-batches and steps would start from stale buffers."""
        from mindspore.common.api import _pynative_executor

        object.__setattr__(self, "_u_record", bool(_pynative_executor.requires_grad()))
        return self(*inputs)

    def construct(self, *inputs):
        n = len(inputs) - len(self._u_params)
        if self._u_buffers and getattr(self, "_u_record", True):
            self._u_saved.append(self._snapshot())
        self._u_hooks.gather()
        try:
            out = self._u_fn[0](*inputs[:n])
        finally:
            self._u_hooks.free()
        return out

    def bprop(self, *args):
        inputs, dout = args[:-2], args[-1]
        n = len(inputs) - len(self._u_params)
        xs = list(inputs[:n])
        diff = [i for i, x in enumerate(xs) if _floating(x)]
        before = self._u_saved.popleft() if self._u_saved else None
        after = self._snapshot() if before is not None else None
        if before is not None:
            self._restore(before)
        douts = dout if isinstance(dout, tuple) else (dout,)
        fn = self._u_fn[0]

        def objective(*d):
            full = list(xs)
            for i, v in zip(diff, d):
                full[i] = v
            outs = fn(*full)
            outs = outs if isinstance(outs, tuple) else (outs,)
            total = None
            for o, do in zip(outs, douts):
                if _floating(o) and do is not None:
                    term = (o * do.astype(o.dtype)).sum()
                    total = term if total is None else total + term
            return total if total is not None else ops.zeros((), ms.float32)

        self._u_hooks.gather()
        try:
            weights = self._u_hooks.weights(self._u_params)
            if diff:
                gx, gw = ms.grad(objective, grad_position=tuple(range(len(diff))), weights=weights)(
                    *[xs[i] for i in diff])
                gx = gx if isinstance(gx, tuple) else (gx,)
            else:
                gx, gw = (), ms.grad(objective, grad_position=None, weights=weights)()
        finally:
            self._u_hooks.free()
        if after is not None:
            self._restore(after)
        object.__setattr__(self, "replays", self.replays + 1)
        gw = self._u_hooks.reduce(list(gw))
        by_pos = dict(zip(diff, gx))
        grads_in = [by_pos[i] if i in by_pos else ops.zeros_like(x) if isinstance(x, Tensor) else x
                    for i, x in enumerate(xs)]
        return tuple(grads_in) + tuple(gw)


# ------------------------------------------------------------------------------------ installing
_NO_TABLE = Tensor(0, ms.int32)  # stands in for cos/sin when the rope is held by the adapter (not differentiated)


def _layer_adapter(cell: Any, unit: ReplayedUnit, params: list) -> Callable:
    """A transformer layer: ``(x, rope, mask, input_ids=None) -> (x, aux or None, counts or None)``."""
    original = cell.construct
    pattern: list = []
    # a rope that is not a (cos, sin) pair of tensors (DeepSeek-V4's (RopeSet, seq_len)) cannot pass through a
    # Cell call: it is held here for the forward and its replay (one model's rope is the same for every call)
    held: list = [None]
    # cells that leave a loss on themselves for GPTModel's objective (DeepSeek-V4's indexer loss): inside a
    # unit that loss is computed outside autograd, so it becomes an extra output of the unit (its gradient
    # then flows through the replay) and is set back on the cell from there
    from mftk.engine.layers.csa import indexer_cells

    side = indexer_cells(cell)
    side_set: list = []

    def fn(x, cos, sin, mask, *ids):
        rope = (cos, sin) if held[0] is None else held[0]
        out = original(x, rope, mask, ids[0] if ids else None)
        pattern[:] = [o is None for o in out]
        side_set[:] = [c.indexer_loss is not None for c in side]
        return tuple(o for o in out if o is not None) + tuple(c.indexer_loss for c in side if c.indexer_loss is not None)

    unit._u_fn[:] = [fn]

    def construct(x, rope, mask, input_ids=None):
        ids = () if input_ids is None else (input_ids,)
        if isinstance(rope[0], Tensor):
            held[0], cos, sin = None, rope[0], rope[1]
        else:
            held[0], cos, sin = rope, _NO_TABLE, _NO_TABLE
        outs = list(unit.run(x, cos, sin, mask, *ids, *params))
        extra = iter(outs[len(outs) - sum(side_set):])
        for c, on in zip(side, side_set):
            if on:
                c.indexer_loss = next(extra)
        main = iter(outs)
        return tuple(None if none else next(main) for none in pattern)

    return construct


def _embedding_adapter(cell: Any, unit: ReplayedUnit, params: list) -> Callable:
    """The embedding: ``ids -> h``."""
    original = cell.construct
    unit._u_fn[:] = [lambda ids: (original(ids),)]
    return lambda ids: unit.run(ids, *params)[0]


def _loss_adapter(cell: Any, unit: ReplayedUnit, params: list) -> Callable:
    """The head loss ``(h, weight, labels, weights)`` whose ``weight`` is the head Parameter the unit gathers."""
    original = cell.construct
    head = params[0]
    hooks = unit._u_hooks
    unit._u_fn[:] = [lambda h, labels, weights: (original(h, hooks.weights([head])[0], labels, weights),)]

    def construct(h, weight, labels, weights):
        if weight is not head:  # not the weight the unit gathers: the plain loss
            return original(h, weight, labels, weights)
        return unit.run(h, labels, weights, *params)[0]

    return construct


def _cell_adapter(cell: Any, unit: ReplayedUnit, params: list) -> Callable:
    """Any cell (recompute's ``select_module``): tensor or tuple-of-tensor arguments (flattened one level;
    ``None`` kept out), a tensor or a tuple of tensors and ``None`` as the result."""
    original = cell.construct
    shape: dict = {}

    def fn(*flat):
        it = iter(flat)
        args = [None if kind == "none" else tuple(next(it) for _ in range(kind)) if isinstance(kind, int) else next(it)
                for kind in shape["args"]]
        out = original(*args)
        single = not isinstance(out, tuple)
        shape["out"] = ("single",) if single else tuple(o is None for o in out)
        return (out,) if single else tuple(o for o in out if o is not None)

    unit._u_fn[:] = [fn]

    def construct(*args):
        shape["args"] = ["none" if a is None else len(a) if isinstance(a, tuple) else "tensor" for a in args]
        flat = [x for a in args if a is not None for x in (a if isinstance(a, tuple) else (a,))]
        outs = unit.run(*flat, *params)
        if shape["out"] == ("single",):
            return outs[0]
        it = iter(outs)
        return tuple(None if none else next(it) for none in shape["out"])

    return construct


ADAPTERS = {"layer": _layer_adapter, "embedding": _embedding_adapter, "loss": _loss_adapter, "cell": _cell_adapter}


def install(cell: Any, kind: str, params: Sequence[Parameter], hooks: UnitHooks | None = None,
            name: str = "") -> ReplayedUnit:
    """Make ``cell`` a replayed unit (``kind``: layer, embedding, loss or any cell) over ``params`` (every
    trainable parameter it reads; the loss: the head weight first)."""
    if getattr(cell, "_replayed_unit", None) is not None:
        raise ValueError(f"{name or type(cell).__name__} is already a replayed unit")
    params = list(params)
    buffers = [p for p in cell.get_parameters() if not p.requires_grad]
    unit = ReplayedUnit(lambda *a: a, params, buffers, hooks or UnitHooks(), name)
    construct = ADAPTERS[kind](cell, unit, params)
    object.__setattr__(cell, "_replayed_unit", unit)  # not a sub-cell: the cell's parameter names stay
    cell.construct = construct
    return unit


def owners(model: Any) -> list[Any]:
    """Every cell that may hold a parameter: the cell tree, and the plain cells whose bound forward a
    `parallel.tensor_parallel.Sharded` runs (out of the tree)."""
    cells, seen, todo = [], set(), [c for _, c in model.cells_and_names()]
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        cells.append(c)
        bound = getattr(getattr(c, "_forward", None), "__self__", None)
        if bound is not None and hasattr(bound, "cells_and_names"):
            todo.extend(sub for _, sub in bound.cells_and_names())
    return cells


def renew(cells: Sequence[Any], params: Sequence[Parameter], data: dict | None = None) -> list[Parameter]:
    """New Parameter objects (same names) in place of ``params`` in every cell of ``cells`` holding them, holding
    ``data[id(p)]`` or their current values. Why: MindSpore checks a custom ``bprop``'s gradient of a Parameter
    input against the shape the Parameter was *created* with, and TP/EP/FSDP cut parameters with ``set_data``."""
    out = []
    for old in params:
        value = (data or {}).get(id(old))
        new = Parameter(Tensor(np.ascontiguousarray(old.asnumpy() if value is None else value)), name=old.name,
                        requires_grad=old.requires_grad)
        for cell in cells:
            registry = cell._params  # noqa: SLF001 — MindSpore's registry of a cell's own parameters
            for key, value_ in list(registry.items()):
                if value_ is old:
                    registry[key] = new
        out.append(new)
    return out


def unit_of(cell: Any) -> ReplayedUnit | None:
    return getattr(cell, "_replayed_unit", None)
