"""Linear layer storing ``weight [out, in]`` like the reference checkpoints.

``ops.MatMul(transpose_b=True)`` on a 2-D view is as fast as a pre-transposed ``mint.matmul`` on CPU
and avoids ``F.linear``'s slower path (mindspore-cpu.md §1.1).
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops


class Linear(nn.Cell):
    """y = x @ weightᵀ (+ bias); any leading dims."""

    def __init__(self, in_dim: int, out_dim: int, *, bias: bool = False) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.weight = Parameter(Tensor(np.zeros((out_dim, in_dim), np.float32)), name="weight")
        self.bias = Parameter(Tensor(np.zeros((out_dim,), np.float32)), name="bias") if bias else None
        self._mm = ops.MatMul(transpose_b=True)

    def construct(self, x):
        lead = x.shape[:-1]
        y = self._mm(x.reshape(-1, self.in_dim), self.weight)  # (N, out)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_dim)
