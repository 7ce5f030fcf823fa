"""SwiGLU MLP with the reference's row-interleaved ``linear_fc1`` (lane 2j = gate_j, 2j+1 = up_j; §2.11)."""
from __future__ import annotations

from mindspore import mint, nn

from .linear import Linear
from .ops_cpu import split_last


def swiglu_interleaved(h):
    """``h (..., 2F)`` interleaved → ``silu(gate) · up`` ``(..., F)``."""
    f = h.shape[-1] // 2
    pair = h.reshape(*h.shape[:-1], f, 2)  # (..., F, 2)
    gate, up = split_last(pair, (1, 1))
    return (mint.nn.functional.silu(gate) * up).reshape(*h.shape[:-1], f)


class MLP(nn.Cell):
    """With a TP group: ``linear_fc1`` column-parallel, ``linear_fc2`` row-parallel, sequence-parallel.
    The interleaved (gate, up) rows make a contiguous row block of fc1 hold whole pairs, matching the
    column block of fc2."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, tp=None) -> None:
        super().__init__()
        if tp is not None and tp.size > 1:
            from mftk.engine.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear

            self.linear_fc1 = ColumnParallelLinear(hidden_size, 2 * ffn_hidden_size, tp, sequence_parallel=True)
            self.linear_fc2 = RowParallelLinear(ffn_hidden_size, hidden_size, tp, sequence_parallel=True)
            return
        self.linear_fc1 = Linear(hidden_size, 2 * ffn_hidden_size)
        self.linear_fc2 = Linear(ffn_hidden_size, hidden_size)

    def construct(self, x):
        return self.linear_fc2(swiglu_interleaved(self.linear_fc1(x)))
