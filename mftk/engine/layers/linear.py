"""Linear layer storing ``weight [out, in]`` like the reference checkpoints.

``ops.MatMul(transpose_b=True)`` on a 2-D view is as fast as a pre-transposed ``mint.matmul`` on CPU
and avoids ``F.linear``'s slower path (mindspore-cpu.md §1.1). The sizes are read from the weight, so
the same cell computes this rank's block when tensor parallel cuts the weight (`parallel.tensor_parallel`).
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops


class Linear(nn.Cell):
    """y = x @ weightᵀ (+ bias); any leading dims."""

    def __init__(self, in_dim: int, out_dim: int, *, bias: bool = False) -> None:
        super().__init__()
        self.weight = Parameter(Tensor(np.zeros((out_dim, in_dim), np.float32)), name="weight")
        self.bias = Parameter(Tensor(np.zeros((out_dim,), np.float32)), name="bias") if bias else None
        self._mm = ops.MatMul(transpose_b=True)

    def construct(self, x):
        out_dim, in_dim = self.weight.shape
        lead = x.shape[:-1]
        y = self._mm(x.reshape(-1, in_dim), self.weight)  # (N, out)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, out_dim)
