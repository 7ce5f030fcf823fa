"""SwiGLU MLP with the reference's row-interleaved ``linear_fc1`` (lane 2j = gate_j, 2j+1 = up_j; §2.11)."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops

from .kernels import SiluMulFn
from .linear import Linear
from .ops_cpu import split_last


def swiglu_interleaved(h, act: SiluMulFn | None = None):
    """``h (..., 2F)`` interleaved → ``silu(gate) · up`` ``(..., F)``."""
    f = h.shape[-1] // 2
    pair = h.reshape(*h.shape[:-1], f, 2)  # (..., F, 2)
    gate, up = split_last(pair, (1, 1))
    return (act or SiluMulFn())(gate, up).reshape(*h.shape[:-1], f)


class MLP(nn.Cell):
    """With a TP group: ``linear_fc1`` column-parallel, ``linear_fc2`` row-parallel, sequence-parallel.
    The interleaved (gate, up) rows make a contiguous row block of fc1 hold whole pairs, matching the
    column block of fc2.

    Without TP the gate and up rows of ``linear_fc1.weight`` are gathered (cheap: weight-sized) and
    multiplied separately, instead of de-interleaving the activations — a strided slice of the
    ``(N, 2F)`` output and its backward cost ~5× the gather on CPU (bench/train_step.py).
    """

    def __init__(self, hidden_size: int, ffn_hidden_size: int, tp=None) -> None:
        super().__init__()
        self.act = SiluMulFn()
        self.tp = tp is not None and tp.size > 1
        if self.tp:
            from mftk.engine.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear

            self.linear_fc1 = ColumnParallelLinear(hidden_size, 2 * ffn_hidden_size, tp, sequence_parallel=True)
            self.linear_fc2 = RowParallelLinear(ffn_hidden_size, hidden_size, tp, sequence_parallel=True)
            return
        self.linear_fc1 = Linear(hidden_size, 2 * ffn_hidden_size)
        self.linear_fc2 = Linear(ffn_hidden_size, hidden_size)
        lanes = np.arange(2 * ffn_hidden_size, dtype=np.int32)
        self._gate_rows, self._up_rows = Tensor(lanes[0::2]), Tensor(lanes[1::2])
        self._mm = ops.MatMul(transpose_b=True)

    def construct(self, x):
        if self.tp:
            return self.linear_fc2(swiglu_interleaved(self.linear_fc1(x), self.act))
        x2 = x.reshape(-1, x.shape[-1])
        w = self.linear_fc1.weight
        gate = self._mm(x2, ops.gather(w, self._gate_rows, 0))
        up = self._mm(x2, ops.gather(w, self._up_rows, 0))
        return self.linear_fc2(self.act(gate, up).reshape(*x.shape[:-1], gate.shape[-1]))
