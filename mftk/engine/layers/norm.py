"""RMSNorm in plain ops: ``ops.rms_norm`` has no CPU kernel (mindspore-cpu.md §1.2); the math and its
hand-written backward are `kernels.RMSNormFn`."""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn

from .registry import kernel


class RMSNorm(nn.Cell):
    """y = x / sqrt(mean(x², -1) + eps) · weight, weight initialised to 1."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = float(eps)
        self.weight = Parameter(Tensor(np.ones((dim,), np.float32)), name="weight")
        self.fn = kernel("rms_norm")(self.eps)

    def construct(self, x):
        return self.fn(x, self.weight)
