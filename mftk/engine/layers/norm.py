"""RMSNorm in plain ops: ``ops.rms_norm`` has no CPU kernel (mindspore-cpu.md §1.2)."""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, mint, nn


class RMSNorm(nn.Cell):
    """y = x / sqrt(mean(x², -1) + eps) · weight, weight initialised to 1."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = float(eps)
        self.weight = Parameter(Tensor(np.ones((dim,), np.float32)), name="weight")

    def construct(self, x):
        return x * mint.rsqrt(mint.mean(x * x, -1, keepdim=True) + self.eps) * self.weight
