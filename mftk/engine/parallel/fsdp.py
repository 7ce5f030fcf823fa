"""FSDP / HSDP with sharded parameters: between steps every rank holds only its row block (Shard(0) over the
``fsdp`` = dp_shard·cp group, replicated over dp_replicate) of each parameter of a unit, and so only that
block of its gradient, fp32 master and AdamW moments.

Units (torchtitan's ``fully_shard`` per block): every transformer layer this pipeline stage holds (MTP layers
included), the embedding, and the output layer (through the head loss). Two kinds:

- kept (the default, `FsdpHooks.gathered`): the unit's forward is differentiated as it is and keeps its
  activations. Its weights come from `_GatherRows`, an all-gather whose backward is the reduce-scatter, and
  shadow the row blocks in their cells; when the forward ends they are freed — saved-tensor hooks store a
  handle in place of each, and the unit's backward gathers them once more when it first needs one (torch
  FSDP2's ``reshard_after_forward``);
- replayed (the layers recompute selects, `recompute.replayed_layers`): a `unit_replay.ReplayedUnit` whose weights
  are gathered into full-shape Parameters standing in for the row blocks for its forward and again for its
  replay in the backward; it keeps no activations inside it. A layer recompute checkpoints because
  ``exclude_op`` lists it (`recompute.apply_exclusions`, installed before FSDP) is a kept unit, its
  checkpoints' replays gathering its weights again (`FsdpHooks.regathered`).

Either way the full gradients are reduced and cut to the row block at once — a reduce-scatter (on CPU an
in-place all-reduce of each gradient, or of a pack of small ones, and a slice, mindspore-cpu.md §4) — and
the blocks go straight into the trainer's flat gradient buffer (`GradSink`), so the model never holds more than one unit's full weights
and gradients.

Left whole (replicated, synchronised by `distributed.DistContext.sync_grads` as in plain DP): parameters
used outside every unit (final norm, MTP's ``eh_proj`` and norms, a tied embedding, the embedding copy two
pipeline stages hold), expert weights (their replicas are the EDP group), and tensors whose TP-local dim 0
does not divide by the FSDP degree.

Gradient of a sharded parameter, per micro-batch, in the unit's backward (the order `DistContext.sync_grads`
uses for the others): summed over TP when TP left it whole (sequence parallel: each TP rank saw its own
tokens), averaged over dp×cp, cut to this rank's rows.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Collection, Iterator, Sequence

import numpy as np
from mindspore import Parameter, Tensor, nn

from mftk.engine import activation_checkpoint, unit_replay
from mftk.engine.parallel import comm


class FsdpHooks(unit_replay.UnitHooks):
    """Gather / free / reduce-scatter of one unit's sharded parameters (``sharded`` is a subset of ``params``)."""

    def __init__(self, params: Sequence[Parameter], sharded: Sequence[Parameter], groups: Any,
                 tp_whole: Sequence[bool], owners: Sequence[Any] = (), sink: "GradSink | None" = None) -> None:
        self.params = list(params)
        self.sink = sink
        ids = {id(p) for p in sharded}
        self.mask = [id(p) in ids for p in self.params]
        self.sharded = [p for p, on in zip(self.params, self.mask) if on]
        self.tp_whole = [w for w, on in zip(tp_whole, self.mask) if on]
        self.groups = groups
        self.slots = [[(c, k) for c in owners for k, v in c._params.items() if v is p] for p in self.sharded]
        self.full: list[Parameter] = []  # one full-shape stand-in per sharded one (one row while not gathered)
        self.depth = 0  # nested gathers (a unit called inside another's replay) free only at the outermost
        # the kept-activations path (`gathered`): the gather cell, the live gathered weights by storage, and the
        # weights the backward gathered again
        self._gather_cell = _GatherRows(self)
        self._at_gather, self._live, self._live_full, self._again = False, {}, (), None

    # ------------------------------------------------------------------ weights
    def gather(self) -> None:
        """All-gather the unit's row blocks (one message) into the full-shape Parameters that stand in for them
        in their cells while the unit runs."""
        self.depth += 1
        if self.depth > 1 or not self.sharded:
            return
        if not self.full:
            self.full = [_placeholder(p, self.groups.fsdp.size) for p in self.sharded]
        gathered = comm.all_gather_rows_many([p.asnumpy() for p in self.sharded], self.groups.fsdp)
        for full, whole, slots in zip(self.full, gathered, self.slots):
            full.set_data(Tensor.from_numpy(whole))
            for cell, key in slots:
                cell._params[key] = full  # noqa: SLF001 — the cell's parameter registry

    def free(self) -> None:
        """The row blocks back in their cells; the full-shape Parameters keep one row (their memory is freed)."""
        self.depth -= 1
        if self.depth > 0 or not self.sharded:
            return
        for p, full, slots in zip(self.sharded, self.full, self.slots):
            for cell, key in slots:
                cell._params[key] = p  # noqa: SLF001
            full.set_data(_one_row(p))

    def weights(self, params: list[Parameter]) -> list[Parameter]:
        swap = {id(p): f for p, f in zip(self.sharded, self.full)}
        return [swap.get(id(p), p) for p in params]

    # ------------------------------------------------------------------ gradients
    def reduce(self, grads: list[Tensor]) -> list[Tensor]:
        """Full gradients of ``params`` → the sharded ones summed over TP where whole, averaged over dp×cp and
        cut to this rank's rows (`reduce_sharded`); the others unchanged (synchronised after the step)."""
        idx = [i for i, on in enumerate(self.mask) if on]
        if not idx:
            return grads
        out = list(grads)
        for i, t in zip(idx, self.reduce_sharded([grads[i] for i in idx])):
            out[i] = t
        return out

    def reduce_sharded(self, full: list) -> list[Tensor]:
        """Full gradients of the ``sharded`` parameters → this rank's rows (`reduce`): one tensor (or pack) at a time,
        reduced in its own memory (the framework's gradient, a numpy view) and its block copied out, so no
        concatenated copy of the unit's gradients exists beside them; tensors smaller than a message go
        together (`comm.packs`: at most one message of copies beside them)."""
        g = self.groups
        size, rank = g.fsdp.size, g.fsdp.rank
        out = []
        for pack in comm.packs(full):  # the small ones one message per pack, a large one alone
            arrays = []
            for k in pack:
                t, full[k] = full[k], None
                arrays.append(t.asnumpy() if isinstance(t, Tensor) else np.asarray(t))
                del t
            whole = [j for j, k in enumerate(pack) if self.tp_whole[k]]
            for j, a in zip(whole, comm.all_reduce_many([arrays[j] for j in whole], g.tp, "sum")):
                arrays[j] = a
            for k, a in zip(pack, comm.all_reduce_many(arrays, g.dp_cp, "avg")):
                block = a.shape[0] // size
                rows = a[rank * block:(rank + 1) * block]
                put = self.sink.put(self.sharded[k], rows) if self.sink is not None else None
                out.append(put if put is not None else Tensor(np.ascontiguousarray(rows)))  # own buffer: a view
                del a, rows                                                                  # keeps the full one
            del arrays
        return out

    # ------------------------------------------------------------------ kept activations (no replay)
    @contextmanager
    def gathered(self) -> Iterator[tuple]:
        """The unit's forward differentiated as it is (its activations kept for the backward) on its weights
        gathered by `_GatherRows` — a differentiable all-gather whose backward is `reduce_sharded` — and
        shadowing the row blocks in their cells. The gathered weights are freed when the forward ends:
        saved-tensor hooks store a handle in place of each of them, and the unit's backward gathers them once
        again when it first needs one (torch FSDP2's ``reshard_after_forward``)."""
        self.depth += 1
        if self.depth > 1:  # a unit called inside its own forward (nested): already gathered
            try:
                yield self._live_full
            finally:
                self.depth -= 1
            return
        import mindspore as ms

        try:
            with ms.saved_tensors_hooks(self._pack, self._unpack):
                self._at_gather = True
                full = self._gather_cell(*self.sharded)
                self._at_gather = False
                full = tuple(full) if isinstance(full, (tuple, list)) else (full,)
                self._live = {_key(t): k for k, t in enumerate(full)}
                self._live_full = full
                for t, slots in zip(full, self.slots):
                    for cell, key in slots:
                        object.__setattr__(cell, key, t)  # shadows the registry entry: read as cell.<key>
                yield full
        finally:
            for slots in self.slots:
                for cell, key in slots:
                    cell.__dict__.pop(key, None)
            self._at_gather, self._live, self._live_full = False, {}, ()
            self.depth -= 1

    def _pack(self, x: Tensor) -> Any:
        """A gathered weight is saved as its index (the gather cell's own output as a marker: its backward
        does not read it); every other tensor as itself."""
        key = _key(x)
        if self._at_gather and key in self._gather_cell.made:
            return (_GATHER_OUT,)
        k = self._live.get(key)
        return x if k is None else (_WEIGHT, k)

    def _unpack(self, packed: Any) -> Tensor:
        if not isinstance(packed, tuple):
            return packed
        if packed[0] == _GATHER_OUT:
            return _MARKER
        if self._again is None:  # the first saved weight the unit's backward reads: gather them all once
            self._again = [Tensor.from_numpy(a) for a in
                           comm.all_gather_rows_many([p.asnumpy() for p in self.sharded], self.groups.fsdp)]
        return self._again[packed[1]]

    @contextmanager
    def regathered(self) -> Iterator[tuple[list, Any]]:
        """The unit's weights gathered again, for the replay of a cell recompute checkpoints inside a kept unit
        (a layer ``exclude_op`` lists, `engine.activation_checkpoint`, in the backward), and ``bind(tensors)``, which makes
        them (or the replay's own inputs standing for them) shadow the row blocks in their cells until the
        replay ends."""
        full = [Tensor.from_numpy(a) for a in
                comm.all_gather_rows_many([p.asnumpy() for p in self.sharded], self.groups.fsdp)]

        def bind(tensors) -> None:
            for t, slots in zip(tensors, self.slots):
                for cell, key in slots:
                    object.__setattr__(cell, key, t)
        try:
            yield full, bind
        finally:
            for slots in self.slots:
                for cell, key in slots:
                    cell.__dict__.pop(key, None)


class GradSink:
    """The trainer's flat fp32 gradient buffer, for the units to put the row blocks they reduced straight in:
    the framework's gradient of a sharded parameter is then a view of its slot (`Tensor.from_numpy`), not a
    second copy beside the buffer (4 bytes per sharded parameter less at the end of every backward). Active
    between `begin` and `end` (one micro-batch of `trainer.Trainer`); elsewhere (the pipeline trainer) the
    units return their blocks as before. The arithmetic is the optimizer's (`AdamW.put_grad` / ``add_grad``)."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}
        self.optimizer: Any = None
        self.flat: np.ndarray | None = None
        self.scale, self.first = 1.0, True
        self.done: set[int] = set()  # indices (trainer order) put in this micro-batch

    def bind(self, params: Sequence[Parameter], optimizer: Any) -> None:
        """``params``: the trainer's (the optimizer's order)."""
        self.index = {id(p): i for i, p in enumerate(params)}
        self.optimizer = optimizer

    def begin(self, flat: np.ndarray, scale: float, first: bool) -> None:
        self.flat, self.scale, self.first, self.done = flat, scale, first, set()

    def end(self) -> set[int]:
        done, self.flat, self.done = self.done, None, set()
        return done

    def put(self, p: Parameter, rows: np.ndarray) -> Tensor | None:
        i = self.index.get(id(p)) if self.flat is not None else None
        if i is None:  # not active, or not trained here
            return None
        first = self.first and i not in self.done  # a unit used twice adds its second gradient
        fill = self.optimizer.put_grad if first else self.optimizer.add_grad
        slot = fill(self.flat, i, rows, self.scale)
        self.done.add(i)
        return Tensor.from_numpy(slot.reshape(rows.shape))


_GATHER_OUT, _WEIGHT = "gather-out", "weight"
_MARKER = Tensor(np.zeros(1, np.float32))


def _key(t: Tensor) -> tuple:
    """A tensor's storage and shape: the saved-tensor hooks see other Python objects for the same tensor."""
    return (t.data_ptr(), tuple(t.shape))


class _GatherRows(nn.Cell):
    """``(*row blocks) -> full weights`` (all-gathered); backward: their full gradients reduce-scattered
    (`FsdpHooks.reduce_sharded`), after which the weights the unit's backward gathered again are dropped."""

    def __init__(self, hooks: FsdpHooks) -> None:
        super().__init__()
        object.__setattr__(self, "hooks", hooks)  # plain attributes: not a sub-cell
        object.__setattr__(self, "made", set())

    def construct(self, *blocks):
        full = tuple(Tensor.from_numpy(a) for a in
                     comm.all_gather_rows_many([b.asnumpy() for b in blocks], self.hooks.groups.fsdp))
        object.__setattr__(self, "made", {_key(t) for t in full})
        return full

    def bprop(self, *args):
        n = len(self.hooks.sharded)
        douts = args[n + 1]
        douts = douts if isinstance(douts, tuple) else (douts,)
        grads = self.hooks.reduce_sharded(list(douts))
        self.hooks._again = None  # noqa: SLF001 — the unit's backward is over
        return tuple(grads)


def _placeholder(p: Parameter, size: int) -> Parameter:
    """The full-shape stand-in of row block ``p``: created with the full shape (MindSpore checks a gradient
    against the shape a Parameter was created with), then holding one row until a gather fills it."""
    full = Parameter(Tensor(np.zeros((p.shape[0] * size,) + tuple(p.shape[1:]), np.float32), dtype=p.dtype),
                     name=p.name)
    full.set_data(_one_row(p))
    return full


def _one_row(p: Parameter) -> Tensor:
    return Tensor(np.zeros((1,) + tuple(p.shape[1:]), np.float32), dtype=p.dtype)


# ------------------------------------------------------------------------------------ applying
def unit_cells(model: Any) -> list[tuple[str, Any, str, list]]:
    """``(name, cell, kind, params)`` of every FSDP unit of the model, on every rank alike (``params``: every
    parameter of the unit, buffers and tensors frozen on this pipeline stage included)."""
    def params_of(cell: Any) -> list:
        return list(cell.get_parameters())

    out = []
    if model.output_layer is not None:  # a tied embedding is read by the head outside every unit: whole
        out.append(("embedding", model.embedding, "embedding", params_of(model.embedding)))
        out.append(("output_layer", model.loss, "loss", [model.output_layer.weight]))
    for i, layer in enumerate(model.decoder.layers):
        out.append((f"decoder.layers.{i}", layer, "layer", params_of(layer)))
    for i, mtp in enumerate(model.mtp.layers if model.mtp is not None else []):
        layer = mtp.transformer_layer
        out.append((f"mtp.layers.{i}.transformer_layer", layer, "layer", params_of(layer)))
    return out


def shardable(model: Any, table: Any) -> set[str]:
    """Names of the parameters FSDP may shard, the same on every rank (``metadata.json`` describes every
    rank's shards from one table): the trainable ones of a unit that a single pipeline stage holds."""
    return {p.name for _, _, _, params in unit_cells(model) for p in params
            if p.name in table and table[p.name].trainable and len(table[p.name].stages) == 1}


def apply_fsdp(model: Any, groups: Any, table: Any, replay: Collection[str] = (),
               sink: GradSink | None = None) -> list[str]:
    """Cut every FSDP-split parameter (the table's ``fsdp`` rows) to this rank's block and make every unit
    this rank trains gather it for its forward and its backward: the units named in ``replay`` (the layers
    recompute selects, `recompute.replayed_layers`) replay their forward in the backward (`unit_replay.ReplayedUnit`),
    the others keep their activations (`FsdpHooks.gathered`), the checkpoints inside them (``exclude_op``'s)
    replaying with the weights gathered again (`FsdpHooks.regathered`). Returns the names of the units installed."""
    size, rank = groups.fsdp.size, groups.fsdp.rank
    installed = []
    for name, cell, kind, params in unit_cells(model):
        params = [p for p in params if p.requires_grad]  # what this rank trains (not buffers, not other stages')
        if not params:
            continue
        sharded = [p for p in params if table[p.name].split_over("fsdp")]
        if not sharded:  # nothing to gather: the unit runs as built
            continue
        owners = unit_replay.owners(model)
        rows = {id(p): p.asnumpy()[rank * (p.shape[0] // size):(rank + 1) * (p.shape[0] // size)] for p in sharded}
        params = unit_replay.renew(owners, params, rows)  # the row blocks, and every other one as it is now
        sharded = [p for p in params if table[p.name].split_over("fsdp")]
        tp_whole = [not table[p.name].split_over("tp") and not table[p.name].expert for p in params]
        hooks = FsdpHooks(params, sharded, groups, tp_whole, owners, sink)
        if name in replay and not activation_checkpoint.within(cell):
            unit_replay.install(cell, kind, params, hooks, name=name)
        else:
            _keep(cell, kind, hooks)
            for ck in activation_checkpoint.within(cell):  # exclude_op's checkpoints: replayed with the weights gathered again
                ck.around_replay = hooks.regathered
        installed.append(name)
    return installed


def _keep(cell: Any, kind: str, hooks: FsdpHooks) -> None:
    """``cell``'s forward run inside `FsdpHooks.gathered` (its activations kept). The head loss reads the
    head weight as an argument: the gathered one is passed in its place."""
    original = cell.construct
    if kind == "loss":
        head = hooks.sharded[0]

        def construct(h, weight, labels, weights):
            if weight is not head:  # not the weight the unit gathers: the plain loss
                return original(h, weight, labels, weights)
            with hooks.gathered() as full:
                return original(h, full[0], labels, weights)
    else:
        def construct(*args, **kwargs):
            with hooks.gathered():
                return original(*args, **kwargs)
    object.__setattr__(cell, "_fsdp_kept", hooks)  # not a sub-cell
    cell.construct = construct


def kept_hooks(cell: Any) -> FsdpHooks | None:
    """The hooks of an FSDP unit that keeps its activations (None: not one)."""
    return getattr(cell, "_fsdp_kept", None)
