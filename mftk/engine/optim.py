"""AdamW with fp32 master weights and decoupled weight decay, as one vectorised numpy update.

Why numpy and not a MindSpore optimizer: on CPU, ``mint.optim.AdamW`` has no kernel, ``mint.optim.Adam``
silently never updates (in-place ops are no-ops there), ``nn.AdamWeightDecay`` has no bias
correction, and a per-tensor MindSpore loop costs 0.7–0.9 s on a 29 M model (mindspore-cpu.md §3).
Here the masters, ``m`` and ``v`` live in three flat fp32 buffers; parameters that get weight decay
come first, so decay is one slice multiply and the whole Adam update is a handful of array
operations over the flat buffers (`bench/optim_update.py` measures it against a per-parameter loop).

The update is the reference's non-fused AdamW (§2.7): with ``lr = schedule(global_step)`` taken
*before* the counter increments and ``t = global_step + 1``::

    p ← p·(1 − lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
    p ← p − (lr/(1−β1^t))·m / (sqrt(v/(1−β2^t)) + eps)

Speed (CPU, memory-bound): the update runs chunk by chunk (``CHUNK`` elements), so every temporary
stays in cache instead of streaming the 29 M-element buffers ten times; each element still sees the
same float32 operations in the same order, so results are bit-identical to the unchunked form. The
trainer fills one reused gradient buffer (``grad_buffer``/``put_grads``) instead of zero-filling a
fresh one and adding into it every step. The chunks are shared out to up to ``UPDATE_THREADS``
threads (1.4× on 2 cores; still bit-identical, each element's arithmetic is unchanged).

``enable_fused_opt``/``use_fused`` have no effect (a no-effect row in `config.status`: the reference's fused
kernel computes the same update; its fused counter starts at −1, which evaluates ``lr(−1)`` on the first
step, and mftk does not reproduce that).

Weight-decay groups (reference `trainer/utils.py:212-299`): priority include > exclude > defaults;
by default 1-D parameters and names ending in ``.bias`` get no decay. A pattern matches by exact
name, by substring or as an fnmatch glob. Each decision is logged in the reference's format.
"""
from __future__ import annotations

import fnmatch
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Sequence

import attrs
import numpy as np

from mftk.ckpt import names as opt_names
from mftk.errors import CheckpointError

log = logging.getLogger("mftk.train")

CHUNK = 1 << 16  # elements per update chunk: 7 fp32 arrays × 256 KiB stay in cache (bench: 1<<16 is fastest)
UPDATE_THREADS = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
NORM_BLOCK = 1 << 16
_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(n: int) -> ThreadPoolExecutor:
    if n not in _POOLS:
        _POOLS[n] = ThreadPoolExecutor(n, thread_name_prefix="mftk-adamw")
    return _POOLS[n]


@attrs.frozen
class DecayDecision:
    name: str
    weight_decay: float
    reason: str

    def log_line(self) -> str:
        """The reference's per-parameter line."""
        return f"param_name: {self.name:<60} | weight_decay: {self.weight_decay:>8.4f} | reason: {self.reason}"


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or pattern in name or fnmatch.fnmatchcase(name, pattern)


def _first_match(name: str, patterns: Iterable[str] | None) -> str | None:
    return next((p for p in (patterns or ()) if _matches(name, p)), None)


def decide_weight_decay(params: Sequence[tuple[str, tuple[int, ...]]], weight_decay: float, *,
                        include: Iterable[str] | None = None, exclude: Iterable[str] | None = None) -> list[DecayDecision]:
    """One decision per ``(name, shape)``: include > exclude > (1-D or ``.bias`` → 0) > the configured value."""
    include, exclude = list(include or ()), list(exclude or ())
    out = []
    for name, shape in params:
        if (p := _first_match(name, include)) is not None:
            out.append(DecayDecision(name, weight_decay, f"matches weight_decay_include {p!r}"))
        elif (p := _first_match(name, exclude)) is not None:
            out.append(DecayDecision(name, 0.0, f"matches weight_decay_exclude {p!r}"))
        elif len(shape) <= 1:
            out.append(DecayDecision(name, 0.0, "1-D parameter"))
        elif name.endswith(".bias"):
            out.append(DecayDecision(name, 0.0, "bias"))
        else:
            out.append(DecayDecision(name, weight_decay, "default"))
    return out


class AdamW:
    """fp32 AdamW over named parameters; ``step(flat_grad, lr)`` updates the masters in place.

    ``names``/``shapes`` are in the model's trainable-parameter order (the order gradients come
    in); ``flat_offsets`` place each one in the flat buffers, decayed parameters first.
    """

    def __init__(self, names: Sequence[str], arrays: Sequence[np.ndarray], decisions: Sequence[DecayDecision], *,
                 betas: Sequence[float] = (0.9, 0.95), eps: float = 1e-8) -> None:
        by_name = {d.name: d for d in decisions}
        self.names = list(names)
        self.shapes = [tuple(a.shape) for a in arrays]
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps = float(eps)
        decayed = [i for i, n in enumerate(self.names) if by_name[n].weight_decay > 0]
        plain = [i for i, n in enumerate(self.names) if by_name[n].weight_decay <= 0]
        wds = {by_name[self.names[i]].weight_decay for i in decayed}
        if len(wds) > 1:
            raise ValueError(f"one weight_decay value expected for the decayed group, got {sorted(wds)}")
        self.weight_decay = wds.pop() if wds else 0.0
        self.slices: list[slice] = [slice(0, 0)] * len(self.names)
        start = 0
        for i in decayed + plain:
            n = int(np.prod(self.shapes[i], dtype=np.int64))
            self.slices[i] = slice(start, start + n)
            start += n
        self.decay_end = sum(int(np.prod(self.shapes[i], dtype=np.int64)) for i in decayed)
        self.size = start
        self.global_step = 0
        self.shares_weights = False  # set by state.share_masters: the model parameters are views of `master`
        self._allocate(arrays)

    def _allocate(self, arrays: Sequence[np.ndarray]) -> None:
        """The state buffers (host: three flat fp32 numpy arrays), masters filled from ``arrays``."""
        start = self.size
        self.master = np.zeros(start, np.float32)
        self.m = np.zeros(start, np.float32)
        self.v = np.zeros(start, np.float32)
        threads = max(1, min(UPDATE_THREADS, -(-start // CHUNK)))
        self._scratch = [(np.empty(min(start, CHUNK), np.float32), np.empty(min(start, CHUNK), np.float32))
                         for _ in range(threads)]
        self._grads: np.ndarray | None = None
        self.set_masters(arrays)

    # ---------------------------------------------------------------------------------- views
    def view(self, buffer: np.ndarray, i: int) -> np.ndarray:
        return buffer[self.slices[i]].reshape(self.shapes[i])

    def masters(self) -> list[np.ndarray]:
        return [self.view(self.master, i) for i in range(len(self.names))]

    def set_masters(self, arrays: Sequence[np.ndarray]) -> None:
        """Refresh the fp32 masters from model weights (weights-only init, reference `reload_main_params`)."""
        for i, a in enumerate(arrays):
            self.master[self.slices[i]] = np.asarray(a, np.float32).reshape(-1)

    def zeros_like_flat(self) -> np.ndarray:
        return np.zeros(self.size, np.float32)

    def grad_buffer(self) -> np.ndarray:
        """A flat gradient buffer reused from step to step (contents undefined until ``put_grads``)."""
        if self._grads is None:
            self._grads = np.empty(self.size, np.float32)
        return self._grads

    def put_grads(self, flat: np.ndarray, grads: Sequence[np.ndarray | None], scale: float = 1.0) -> None:
        """``flat = scale·g`` for every gradient: the first micro-batch, with no zero-fill pass. ``None``: a
        gradient already in ``flat`` (an FSDP unit put it there, `parallel.fsdp.GradSink`)."""
        for i, g in enumerate(grads):
            if g is not None:
                self.put_grad(flat, i, g, scale)

    def add_grads(self, flat: np.ndarray, grads: Sequence[np.ndarray | None], scale: float = 1.0) -> None:
        """``flat += scale·g`` for every gradient (fp32 accumulation over micro-batches); ``None`` as in ``put_grads``."""
        for i, g in enumerate(grads):
            if g is not None:
                self.add_grad(flat, i, g, scale)

    def put_grad(self, flat: np.ndarray, i: int, g: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Parameter ``i``'s slot of ``flat`` = scale·g; returns the slot (a view)."""
        dst = flat[self.slices[i]]
        src = np.asarray(g, np.float32).reshape(-1)
        if scale == 1.0:
            np.copyto(dst, src)
        else:
            np.multiply(src, np.float32(scale), out=dst)
        return dst

    def add_grad(self, flat: np.ndarray, i: int, g: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Parameter ``i``'s slot of ``flat`` += scale·g; returns the slot (a view)."""
        dst = flat[self.slices[i]]
        src = np.asarray(g, np.float32).reshape(-1)
        if scale == 1.0:
            dst += src
        else:
            dst += src * np.float32(scale)
        return dst

    # ---------------------------------------------------------------------------------- update
    def step(self, g: np.ndarray, lr: float) -> None:
        """One AdamW update with gradient ``g`` (flat, fp32, already clipped) at learning rate ``lr``.

        The chunks are split between ``UPDATE_THREADS`` threads (numpy releases the GIL inside each
        array operation); every element still sees the same operations, so the result does not
        depend on the thread count."""
        self.global_step += 1
        t = self.global_step
        decay = np.float32(1.0 - lr * self.weight_decay) if self.weight_decay > 0 else None
        c = (np.float32(self.beta1), np.float32(1.0 - self.beta1), np.float32(self.beta2), np.float32(1.0 - self.beta2),
             np.float32(1.0 / (1.0 - self.beta2 ** t)), np.float32(self.eps), np.float32(lr / (1.0 - self.beta1 ** t)))
        starts = range(0, self.size, CHUNK)
        parts = [starts[k::len(self._scratch)] for k in range(len(self._scratch))]
        if len(parts) == 1:
            return self._update_chunks(parts[0], g, c, decay, self._scratch[0])
        for f in [_pool(len(parts)).submit(self._update_chunks, part, g, c, decay, tmp)
                  for part, tmp in zip(parts, self._scratch)]:
            f.result()

    def _update_chunks(self, starts: Sequence[int], g: np.ndarray, c: tuple, decay: np.float32 | None,
                       scratch: tuple[np.ndarray, np.ndarray]) -> None:
        for start in starts:
            stop = min(start + CHUNK, self.size)
            if decay is not None and start < self.decay_end:
                self.master[start:min(stop, self.decay_end)] *= decay
            self._update(slice(start, stop), g[start:stop], c, scratch)

    def _update(self, sl: slice, g: np.ndarray, c: tuple, scratch: tuple[np.ndarray, np.ndarray]) -> None:
        """``m``, ``v`` and the masters of one chunk, in the float32 order of the docstring's formula."""
        b1, one_b1, b2, one_b2, inv_bc2, eps, step_size = c
        n = sl.stop - sl.start
        tmp, tmp2 = scratch[0][:n], scratch[1][:n]
        m, v, p = self.m[sl], self.v[sl], self.master[sl]
        m *= b1
        np.multiply(g, one_b1, out=tmp)
        m += tmp
        v *= b2
        np.multiply(g, g, out=tmp)
        tmp *= one_b2
        v += tmp
        np.multiply(v, inv_bc2, out=tmp2)
        np.sqrt(tmp2, out=tmp2)
        tmp2 += eps
        np.divide(m, tmp2, out=tmp2)
        tmp2 *= step_size
        p -= tmp2

    # ---------------------------------------------------------------------------------- state
    def state_buffers(self, i: int) -> dict[str, np.ndarray]:
        """Checkpoint prefix → flat buffer of parameter ``i``'s optimizer state (Muon names some differently)."""
        return {"adam_m": self.m, "adam_v": self.v}

    def read_state(self, state: str, i: int) -> np.ndarray:
        """A host copy of parameter ``i``'s optimizer state ``state`` (``opt_names.MASTER``: its fp32 master)."""
        buf = self.master if state == opt_names.MASTER else self.state_buffers(i)[state]
        return self.view(buf, i).copy()

    def write_state(self, state: str, i: int, array: np.ndarray) -> None:
        """Parameter ``i``'s state ``state`` (or master) from a checkpoint's array of its shape."""
        buf = self.master if state == opt_names.MASTER else self.state_buffers(i)[state]
        buf[self.slices[i]] = np.asarray(array, np.float32).reshape(-1)

    def state_kinds(self, name: str, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The state prefixes a parameter of this name and global shape has, whichever rank holds it
        (``metadata.json`` lists the states of every stage's parameters)."""
        return ("adam_m", "adam_v")

    def state_dict(self, *, with_masters: bool = False) -> dict[str, np.ndarray]:
        """Reference names: ``adam_m.<p>``, ``adam_v.<p>`` (fp32), ``global_step`` ([1] int64).

        ``main_param.<p>`` is written only for low-precision model parameters (``with_masters``), as the
        reference does; on CPU every parameter is fp32, so the model file already holds the masters.
        """
        out: dict[str, np.ndarray] = {}
        for i, n in enumerate(self.names):
            for state in self.state_buffers(i):
                out[opt_names.state_name(state, n)] = self.read_state(state, i)
            if with_masters:
                out[opt_names.state_name(opt_names.MASTER, n)] = self.read_state(opt_names.MASTER, i)
        out[opt_names.STEP] = np.array([self.global_step], np.int64)
        return out

    def load_state_dict(self, tensors: dict[str, np.ndarray], *, where: str = "optimizer file") -> list[str]:
        """Restore moments, masters (when present) and the step; every name and shape must fit.

        States other optimizers write (AMSGrad's ``max_exp_avg_sq.*``, Muon's ``muon_m.*``:
        ``mftk.ckpt.names.UNUSED_STATES``) are skipped, logged and returned by name; a missing
        ``adam_m``/``adam_v`` is still an error, since the update could not continue without it.
        """
        problems, known = [], {opt_names.STEP}
        for i, n in enumerate(self.names):
            for state in (*self.state_buffers(i), opt_names.MASTER):
                key = opt_names.state_name(state, n)
                known.add(key)
                if state == opt_names.MASTER and key not in tensors:
                    continue
                if key not in tensors:
                    problems.append(f"missing tensor: {key}")
                elif tuple(tensors[key].shape) != self.shapes[i]:
                    problems.append(f"{key}: expected shape {self.shapes[i]}, found {tuple(tensors[key].shape)}")
        unused = opt_names.unused_states(k for k in tensors if k not in known)
        skipped = [k for group in unused.values() for k in group]
        problems += [f"unexpected tensor: {k}" for k in sorted(set(tensors) - known - set(skipped))]
        if opt_names.STEP not in tensors:
            problems.append(f"missing tensor: {opt_names.STEP}")
        if problems:
            raise CheckpointError(message=f"{where} does not fit this model's {type(self).__name__} optimizer "
                                  f"({len(problems)} problems){self._foreign_states(tensors)}", problems=problems[:50],
                                  path=where, hint="resume with --weights-only (no_load_optim: true) to start a fresh "
                                                   "optimizer")
        for line in opt_names.describe_unused(unused):
            log.warning("Optimizer states not used by mftk's %s, skipped: %s", type(self).__name__, line)
        for i, n in enumerate(self.names):
            for state in self.state_buffers(i):
                self.write_state(state, i, tensors[opt_names.state_name(state, n)])
            master = opt_names.state_name(opt_names.MASTER, n)
            if master in tensors:
                self.write_state(opt_names.MASTER, i, tensors[master])
        self.global_step = int(np.asarray(tensors[opt_names.STEP]).reshape(-1)[0])
        return skipped

    def _foreign_states(self, tensors: dict[str, np.ndarray]) -> str:
        """Why the file cannot continue here when another optimizer wrote it (Muon's momentum, say)."""
        muon = any((opt_names.split_state(k) or ("",))[0] == "muon_m" for k in tensors)
        return "; it holds Muon states (muon_m.*), which AdamW cannot continue" if muon else ""


def global_norm(flat: np.ndarray) -> float:
    """sqrt(Σ g²): a float32 BLAS dot per block of ``NORM_BLOCK`` elements, the block sums added in
    float64 — deterministic, no copy of the gradients, 7× faster than casting blocks to float64."""
    total = 0.0
    for start in range(0, flat.size, NORM_BLOCK):
        part = flat[start:start + NORM_BLOCK]
        total += float(np.dot(part, part))
    return float(np.sqrt(total))


def clip_factor(norm: float, max_norm: float) -> float:
    """The reference's ``max_norm / (norm + 1e-6)`` when below 1; 1.0 when clipping is off (max_norm ≤ 0).

    The reference has no ``> 0`` check: ``max_norm: 0`` zeroes every gradient and a negative value
    flips them. mftk treats ``max_norm <= 0`` as "no clipping", as the reference's docstring promises.
    """
    if max_norm <= 0:
        return 1.0
    c = max_norm / (norm + 1e-6)
    return c if c < 1.0 else 1.0
