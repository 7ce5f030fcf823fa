"""SwiGLU MLP with the reference's row-interleaved ``linear_fc1`` (lane 2j = gate_j, 2j+1 = up_j; §2.11)."""
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


class MLP(nn.Cell):
    """``linear_fc2(silu(gate) · up)`` with ``(gate, up) = linear_fc1(x)``."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int) -> None:
        super().__init__()
        self.act = kernel("silu_mul")()
        self.linear_fc1 = GateUpLinear(hidden_size, ffn_hidden_size)
        self.linear_fc2 = Linear(ffn_hidden_size, hidden_size)

    def construct(self, x):
        gate, up = self.linear_fc1(x)
        return self.linear_fc2(self.act(gate, up))
