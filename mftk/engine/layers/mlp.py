"""The dense MLP: gated (SwiGLU / GeGLU) with the reference's row-interleaved ``linear_fc1`` (lane 2j = gate_j,
2j+1 = up_j; models.md §2.11), or non-gated ``linear_fc2(act(linear_fc1(x)))`` (``gated_linear_unit: false``).

The activation is the reference's ``hidden_act`` (mindformers 2.1.0 pynative/transformers/mlp.py and
pynative/layers/activation.py ``ACTIVATION_MAP``): ``silu`` / ``fusedswiglu`` (the same SwiGLU) or ``gelu``, the
exact erf GELU (its ``GELU`` defaults to ``approximate='none'`` and the MLP passes no other).
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops

from .kernels import SiluMulFn
from .registry import kernel
from .linear import Linear
from .ops_cpu import split_last


def swiglu_interleaved(h, act: SiluMulFn | None = None):
    """``h (..., 2F)`` interleaved → ``silu(gate) · up`` ``(..., F)``."""
    f = h.shape[-1] // 2
    pair = h.reshape(*h.shape[:-1], f, 2)  # (..., F, 2)
    gate, up = split_last(pair, (1, 1))
    return (act or kernel("silu_mul")())(gate, up).reshape(*h.shape[:-1], f)


class GateUpLinear(Linear):
    """``linear_fc1``: ``weight [2F, H]`` with interleaved (gate, up) rows; returns ``(gate, up)``, each ``(..., F)``.

    The gate and up rows are gathered from the weight (cheap: weight-sized) and multiplied separately,
    instead of de-interleaving the activations — a strided slice of the ``(N, 2F)`` output and its
    backward cost ~5× the gather on CPU (bench/train_step.py). The row indices follow the weight's
    size, so a contiguous row block (whole pairs, what tensor parallel keeps) works the same way.
    """

    def __init__(self, hidden_size: int, ffn_hidden_size: int) -> None:
        super().__init__(hidden_size, 2 * ffn_hidden_size)
        self._rows: dict[int, tuple[Tensor, Tensor]] = {}

    def rows(self, n: int) -> tuple[Tensor, Tensor]:
        if n not in self._rows:
            lanes = np.arange(n, dtype=np.int32)
            self._rows[n] = (Tensor(lanes[0::2]), Tensor(lanes[1::2]))
        return self._rows[n]

    def construct(self, x):
        w = self.weight
        gate_rows, up_rows = self.rows(w.shape[0])
        x2 = x.reshape(-1, x.shape[-1])
        gate = self._mm(x2, ops.gather(w, gate_rows, 0))
        up = self._mm(x2, ops.gather(w, up_rows, 0))
        lead = x.shape[:-1]
        return gate.reshape(*lead, gate.shape[-1]), up.reshape(*lead, up.shape[-1])


# hidden_act → (the gated kernel ``act(gate, up)``, the non-gated kernel ``act(h)``), by registry name
ACTIVATIONS: dict[str, tuple[str, str]] = {"silu": ("silu_mul", "silu"), "fusedswiglu": ("silu_mul", "silu"),
                                           "gelu": ("gelu_mul", "gelu")}


def gated_kernel(activation: str):
    """The ``act(gate, up)`` kernel of a gated MLP (dense, shared or routed experts) for ``hidden_act``."""
    return kernel(ACTIVATIONS[activation][0])()


class MLP(nn.Cell):
    """Gated: ``linear_fc2(act(gate) · up)`` with ``(gate, up) = linear_fc1(x)`` (``linear_fc1`` is ``2F`` wide);
    non-gated (``gated_linear_unit=False``): ``linear_fc2(act(linear_fc1(x)))`` with a plain ``F``-wide
    ``linear_fc1`` — tensor parallel cuts either by rows (whole gate/up pairs, or plain rows) the same way."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, *, activation: str = "silu",
                 gated_linear_unit: bool = True) -> None:
        super().__init__()
        self.glu = bool(gated_linear_unit)
        if self.glu:
            self.act = gated_kernel(activation)
            self.linear_fc1 = GateUpLinear(hidden_size, ffn_hidden_size)
        else:
            self.act = kernel(ACTIVATIONS[activation][1])()
            self.linear_fc1 = Linear(hidden_size, ffn_hidden_size)
        self.linear_fc2 = Linear(ffn_hidden_size, hidden_size)

    def construct(self, x):
        if not self.glu:
            return self.linear_fc2(self.act(self.linear_fc1(x)))
        gate, up = self.linear_fc1(x)
        return self.linear_fc2(self.act(gate, up))
