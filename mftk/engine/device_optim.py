"""The device-resident update: gradient accumulation, fp32 masters, AdamW moments, the global norm and the
clipping kept as MindSpore tensors on the run's device (``mftk.update_on_device``).

Why a second optimizer class: the host `optim.AdamW` copies every micro-batch's gradients to numpy and
writes the weights back from numpy, which is the fastest way on CPU (no MindSpore kernel per parameter) but
would move every gradient and weight across the bus each step on an accelerator. Here no weight, gradient
or moment leaves the device between checkpoints: the trainer (`device_path.DevicePath`) reads one small
batch of scalars per step (losses, aux terms, the squared norm) and the full tensors only when a checkpoint is
written or read. Token-sized data still crosses each micro-batch (the batch, MoE dispatch, V4's Sinkhorn,
CSA top-k and attention masks, FSDP's gathers): `config.runnable.DEVICE_HOST_TRAFFIC`, counted by
tests/engine/test_device_update.py.

The update is MindSpore's fused ``ops.AdamWeightDecay`` (one kernel per parameter on CPU, GPU and Ascend),
which has no bias correction; the reference's formula (`optim` module docstring) folds into its arguments
exactly, with ``bc1 = 1−β1^t`` and ``bc2 = 1−β2^t``::

    lr' = lr·sqrt(bc2)/bc1,   eps' = eps·sqrt(bc2),   wd' = wd·bc1/sqrt(bc2)
    p ← p − lr'·(m/(sqrt(v)+eps') + wd'·p)  =  p·(1−lr·wd) − (lr/bc1)·m/(sqrt(v/bc2)+eps)

The two paths round differently in float32 (tests/engine/test_device_update.py holds them to 1e-6 per step).
State names, shapes and the flat layout (``slices``, which the multi-process norm weights and the monitors
use) are the host class's, so a checkpoint of either path resumes on the other.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import numpy as np

from mftk.ckpt import names as opt_names
from mftk.engine.optim import AdamW, DecayDecision

log = logging.getLogger("mftk.train")


class DeviceAdamW(AdamW):
    """AdamW whose masters and moments are MindSpore Parameters on the device; ``step(grads, lr)`` takes the
    list of accumulated gradient tensors. An fp32 model parameter is its own master (the update writes it in
    place); a low-precision one gets an fp32 master that is cast into it after each update."""

    on_device = True

    def __init__(self, names: Sequence[str], params: Sequence[Any], decisions: Sequence[DecayDecision], *,
                 betas: Sequence[float] = (0.9, 0.95), eps: float = 1e-8) -> None:
        self.params = list(params)
        by_name = {d.name: d for d in decisions}
        self.decays = [float(by_name[n].weight_decay) for n in names]
        super().__init__(names, self.params, decisions, betas=betas, eps=eps)

    def _allocate(self, params: Sequence[Any]) -> None:
        import mindspore as ms
        from mindspore import Parameter, mint, ops

        f32 = ms.float32
        self.master = [p if p.dtype == f32 else Parameter(p.astype(f32), name=f"{opt_names.MASTER}.{p.name}",
                                                          requires_grad=False) for p in params]
        self.m = [Parameter(mint.zeros(tuple(p.shape), dtype=f32), name=f"adam_m.{n}", requires_grad=False)
                  for n, p in zip(self.names, params)]
        self.v = [Parameter(mint.zeros(tuple(p.shape), dtype=f32), name=f"adam_v.{n}", requires_grad=False)
                  for n, p in zip(self.names, params)]
        self._fused = ops.AdamWeightDecay()
        self.shares_weights = True  # the update writes the model parameters itself

    # ---------------------------------------------------------------------------------- gradients
    def grad_buffer(self) -> list[Any]:
        """The step's accumulation slots, one per parameter (filled by ``put_grads``)."""
        return [None] * len(self.names)

    def put_grads(self, acc: list[Any], grads: Sequence[Any], scale: float = 1.0) -> None:
        """``acc[i] = scale·g`` in fp32 (the first micro-batch)."""
        for i, g in enumerate(grads):
            g = _f32(g)
            acc[i] = g if scale == 1.0 else g * scale

    def add_grads(self, acc: list[Any], grads: Sequence[Any], scale: float = 1.0) -> None:
        """``acc[i] += scale·g`` in fp32 (every later micro-batch)."""
        for i, g in enumerate(grads):
            g = _f32(g)
            acc[i] = acc[i] + (g if scale == 1.0 else g * scale)

    def squared_norm(self, grads: Sequence[Any], weights: Sequence[float] | None = None) -> Any:
        """Σ wᵢ·Σ gᵢ² as a float32 scalar tensor on the device (``weights``: each parameter's share of the
        global norm under several processes, 1 alone)."""
        from mindspore import ops

        parts = [(g * g).sum() * float(w) if w != 1.0 else (g * g).sum()
                 for g, w in zip(grads, weights or [1.0] * len(grads)) if w != 0.0]
        return ops.addn(parts) if parts else ops.zeros((), _f32_type())

    @staticmethod
    def scale(grads: list[Any], factor: float) -> None:
        """``grads *= factor`` (the clip), as new tensors in the list: in-place ops are no-ops on CPU."""
        for i, g in enumerate(grads):
            grads[i] = g * float(np.float32(factor))

    # ---------------------------------------------------------------------------------- update
    def step(self, g: Sequence[Any], lr: float) -> None:
        """One AdamW update of every parameter, one fused kernel each (module docstring)."""
        self.global_step += 1
        t = self.global_step
        bc1, bc2 = 1.0 - self.beta1 ** t, 1.0 - self.beta2 ** t
        root = math.sqrt(bc2)
        lr_t, eps_t = lr * root / bc1, self.eps * root
        for i, grad in enumerate(g):
            wd = self.decays[i] * bc1 / root if self.decays[i] > 0 else 0.0
            self._fused(self.master[i], self.m[i], self.v[i], lr_t, self.beta1, self.beta2, eps_t, wd, grad)
            if self.master[i] is not self.params[i]:
                self.params[i].copy_(self.master[i].astype(self.params[i].dtype))

    # ---------------------------------------------------------------------------------- state
    def view(self, buffer: Any, i: int) -> Any:
        raise TypeError("DeviceAdamW keeps one tensor per parameter: there is no flat host buffer to view")

    def masters(self) -> list[np.ndarray]:
        return [m.asnumpy() for m in self.master]

    def set_masters(self, arrays: Sequence[Any]) -> None:
        """Masters (and the model parameters) from weights: host arrays or tensors of each parameter's shape."""
        from mindspore import Tensor, ops

        for i, a in enumerate(arrays):
            if a is self.params[i] or a is self.master[i]:
                continue
            ops.assign(self.master[i], Tensor(np.asarray(a, np.float32).reshape(self.shapes[i])))

    def state_buffers(self, i: int) -> dict[str, Any]:
        return {"adam_m": self.m[i], "adam_v": self.v[i]}

    def read_state(self, state: str, i: int) -> np.ndarray:
        t = self.master[i] if state == opt_names.MASTER else self.state_buffers(i)[state]
        return np.array(t.asnumpy(), np.float32)

    def write_state(self, state: str, i: int, array: np.ndarray) -> None:
        from mindspore import Tensor, ops

        t = self.master[i] if state == opt_names.MASTER else self.state_buffers(i)[state]
        ops.assign(t, Tensor(np.ascontiguousarray(np.asarray(array, np.float32).reshape(self.shapes[i]))))
        if state == opt_names.MASTER and self.master[i] is not self.params[i]:
            self.params[i].copy_(self.master[i].astype(self.params[i].dtype))


class HostGrads:
    """The accumulated device gradients seen as the host path's flat buffer by a monitor that asks for a
    parameter's slice (``monitor.train_state.local_norm``): each slice copies one tensor, only when read."""

    def __init__(self, grads: Sequence[Any], optimizer: AdamW) -> None:
        self.grads = grads
        self.index = {sl.start: i for i, sl in enumerate(optimizer.slices)}

    def __getitem__(self, sl: slice) -> np.ndarray:
        return self.grads[self.index[sl.start]].asnumpy().reshape(-1)


def _f32(g: Any) -> Any:
    import mindspore as ms

    return g if g.dtype == ms.float32 else g.astype(ms.float32)


def _f32_type() -> Any:
    import mindspore as ms

    return ms.float32


def chosen(config: Any, layout: Any) -> bool:
    """Whether this run updates on the device: ``mftk.update_on_device`` when written (true was checked by the
    rules, `config.runnable.device_update_gaps`); null: on a GPU/Ascend device unless one of those gaps
    applies (then the host update, with a log line saying why), off on CPU."""
    import mindspore as ms

    from mftk.config.runnable import device_update_gaps, settings_of

    setting = config.mftk.update_on_device
    device = ms.get_context("device_target")
    if setting is None:
        gaps = device_update_gaps(layout, settings_of(config)) if device != "CPU" else []
        for g in gaps:
            log.info("Update on the host (mftk.update_on_device: null): %s", g.message)
        setting = device != "CPU" and not gaps
    log.info("Optimizer update: %s", f"on the {device} device (gradients, masters and moments stay there)"
             if setting else "on the host (numpy AdamW)")
    return bool(setting)
