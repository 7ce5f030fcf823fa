"""Activation checkpoint of one cell over saved-tensor hooks (torch's non-reentrant checkpoint): recompute of
the layers ``exclude_op`` lists (`recompute.apply_exclusions`), with and without FSDP. The other recomputed
layers are `unit_replay.ReplayedUnit` (a custom ``bprop``: it keeps less — the 220M fsdp2 run's peak fell to 0.59x
of the run without recompute where these hooks reached 0.89x — but cannot keep an inner cell's activations).

Why saved-tensor hooks: the cell's forward is recorded by autograd as it is (no custom ``bprop``, so any
arguments, any outputs, losses left on cells, in-place buffers), but every tensor autograd saves for the
backward is packed into a `_Handle` that holds nothing. The first time the backward unpacks one, the forward
is replayed once — recorded (``ms.vjp``, whose backward is never run) so that it saves the same tensors in
the same order — and each handle receives its tensor, which it drops again once read. So between the forward
and the backward the cell keeps only its inputs, and the backward is the plain one: gradients are those of
the run without recompute.

Excluded cells (``exclude_op``: a cell inside a checkpointed one) run in the first forward under the
enclosing hooks (their saved tensors are kept, FSDP's handles for gathered weights included), and their
outputs are kept; the replay does not run them, it reads those outputs. Buffers the forward updates in place
(MoE expert counts, max attention logits) are put back before and after the replay.

FSDP (`parallel.fsdp`): a checkpointed cell inside a unit replays inside ``around_replay`` (the unit's weights
gathered again and shadowing the row blocks); excluded cells pack with the unit's own hooks (this
checkpoint's are lifted while they run).
"""
from __future__ import annotations

import weakref
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops


_ONE = Tensor(np.ones((), np.float32))


class _Handle:
    """What autograd saves in place of a tensor: filled by the replay, emptied when read."""

    __slots__ = ("index", "value", "__weakref__")

    def __init__(self, index: int) -> None:
        self.index, self.value = index, None


def _identity(x: Any) -> Any:
    return x


def _floating(x: Any) -> bool:
    return isinstance(x, Tensor) and x.dtype in (ms.float32, ms.float16, ms.bfloat16, ms.float64)


class _Frame:
    """One recorded forward of a checkpointed cell (one micro-batch): its inputs, its handles (weakly: a
    handle autograd has released needs no tensor), the outputs of its excluded cells."""

    def __init__(self, checkpoint: "Checkpoint", args: tuple, kwargs: dict) -> None:
        self.checkpoint, self.args, self.kwargs = checkpoint, args, kwargs
        self.handles: list[weakref.ref] = []
        self.kept: list[Any] = []  # excluded cells' outputs, in call order
        self.before = _snapshot(checkpoint.buffers)
        self.replayed = False

    def pack(self, x: Tensor) -> _Handle:
        handle = _Handle(len(self.handles))
        self.handles.append(weakref.ref(handle))
        return handle

    def unpack(self, handle: Any) -> Tensor:
        if not isinstance(handle, _Handle):
            return handle
        if handle.value is None:
            if self.replayed:
                raise RuntimeError(f"recompute of {self.checkpoint.name}: a saved tensor was read twice in one "
                                   "backward (not supported by the replay)")
            self.replay()
        value, handle.value = handle.value, None
        return value

    def replay(self) -> None:
        """The forward once more, recorded so that it saves its tensors again; each handle still alive gets
        its own (same order: the same ops on the same values)."""
        ck = self.checkpoint
        after = _snapshot(ck.buffers)
        _restore(ck.buffers, self.before)
        saved: list[Tensor] = []
        kept = deque(self.kept)

        def keep(x: Tensor) -> int:  # the replay's own graph (never run backward) holds no tensor
            saved.append(x)
            return 0

        positions = [i for i, a in enumerate(self.args) if _floating(a)]
        ck.replaying.append(kept)
        try:
            with ck.around_replay() as (weights, bind), ms.saved_tensors_hooks(keep, _identity):
                def forward(*diff):
                    args = list(self.args)
                    for i, v in zip(positions, diff):
                        args[i] = v
                    bind(diff[len(positions):])  # the weights as the replay's inputs: ops on them alone saved too
                    ck.original(*args, **self.kwargs)
                    return ops.zeros((), ms.float32)  # an output no other recorded op reaches: the backward
                                                      # below runs no node of the replay

                inputs = [ops.stop_gradient(self.args[i]) for i in positions] + list(weights)  # as new leaves:
                _, release = ms.vjp(forward, *inputs)  # the outer graph's tensors fail an inner backward
            # a recorded graph whose backward never runs is kept by MindSpore, with its inputs, for good (a
            # 220M model's FSDP run grew by its gathered weights every step): the empty backward frees it
            release(_ONE)
        finally:
            ck.replaying.pop()
            _restore(ck.buffers, after)
        if len(saved) != len(self.handles) or kept:
            raise RuntimeError(f"recompute of {ck.name}: the replayed forward saved {len(saved)} tensors where the "
                               f"first saved {len(self.handles)} (a forward that is not deterministic?)")
        for ref, value in zip(self.handles, saved):
            handle = ref()
            if handle is not None:
                handle.value = value
        saved.clear()  # nothing the replay left behind holds them
        self.replayed, self.before = True, None
        ck.replays += 1


class Checkpoint:
    """The checkpoint installed on one cell (`install`): its original forward, its buffers, and how the replay
    gets its weights (``around_replay``; FSDP sets it)."""

    def __init__(self, cell: Any, name: str) -> None:
        self.name = name
        self.original: Callable = cell.construct
        self.cell = cell
        self.buffers: list[Parameter] = [p for p in cell.get_parameters() if not p.requires_grad]
        # the replay's weights that are not the cell's Parameters (FSDP: gathered again), and how to bind them
        self.around_replay: Callable[[], Any] = _own_weights
        self.frames: list[_Frame] = []  # the forward running now (nested calls: innermost last)
        self.replaying: list[deque] = []  # the excluded outputs a running replay reads
        self.replays = 0

    def params(self) -> list[Parameter]:
        """The trainable parameters the cell holds now (FSDP renews them after recompute is installed)."""
        return [p for p in self.cell.get_parameters() if p.requires_grad]

    def __call__(self, *args, **kwargs):
        from mindspore.common.api import _pynative_executor

        if self.replaying or not _pynative_executor.requires_grad():  # inside a replay, or nothing to save for
            return self.original(*args, **kwargs)
        frame = _Frame(self, args, kwargs)
        self.frames.append(frame)
        try:
            with ms.saved_tensors_hooks(frame.pack, frame.unpack):
                return self.original(*args, **kwargs)
        finally:
            self.frames.pop()

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """An excluded cell's first forward: this checkpoint's hooks lifted, so that its saved tensors are
        packed by the enclosing hooks (an FSDP unit's handles for its gathered weights) or kept as they are."""
        from mindspore.common.api import _pynative_executor

        frame = self.frames[-1]
        _pynative_executor.pop_saved_tensor_hook()
        try:
            yield
        finally:
            _pynative_executor.push_saved_tensor_hook(frame.pack, frame.unpack)


def install(cell: Any, name: str) -> Checkpoint:
    """Checkpoint ``cell`` (its ``construct`` swapped as an instance attribute: names and tree stay)."""
    if of(cell) is not None:
        raise ValueError(f"{name} is already checkpointed")
    ck = Checkpoint(cell, name)
    object.__setattr__(cell, "_checkpoint", ck)  # not a sub-cell
    cell.construct = ck
    return ck


def exclude(cell: Any, owner: Checkpoint) -> None:
    """Keep ``cell``'s outputs (and its saved tensors) in ``owner``'s forward instead of replaying it."""
    original = cell.construct

    def construct(*args, **kwargs):
        if owner.replaying:
            return owner.replaying[-1].popleft()
        if not owner.frames:
            return original(*args, **kwargs)
        with owner.excluded():
            out = original(*args, **kwargs)
        owner.frames[-1].kept.append(out)
        return out

    object.__setattr__(cell, "_excluded_from", owner)
    cell.construct = construct


def of(cell: Any) -> Checkpoint | None:
    return getattr(cell, "__dict__", {}).get("_checkpoint")


def within(cell: Any) -> list[Checkpoint]:
    """Every checkpoint installed on ``cell`` or a cell inside it."""
    return [ck for _, c in cell.cells_and_names() if (ck := of(c)) is not None]


@contextmanager
def _own_weights() -> Iterator[tuple[tuple, Callable]]:
    """The cell reads its own Parameters: nothing to gather or bind."""
    yield (), lambda tensors: None


def _snapshot(buffers: Sequence[Parameter]) -> list[np.ndarray] | None:
    return [b.asnumpy().copy() for b in buffers] if buffers else None


def _restore(buffers: Sequence[Parameter], values: list[np.ndarray] | None) -> None:
    for b, v in zip(buffers, values or ()):
        ops.assign(b, Tensor(v))
