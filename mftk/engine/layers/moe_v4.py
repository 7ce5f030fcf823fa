"""DeepSeek-V4's MoE (mindformers-2.1.md §5.6): `moe.MoELayer` plus hash routing and the clamped SwiGLU.

- Hash-routed layers (the first ``num_hash_layers``) take their experts from a fixed token-id table,
  ``router.tid2eid [V, K]`` int32 (a buffer; the real table comes from a checkpoint, a fresh model
  holds the reference's placeholder ``(token_id + j) mod E``). The router's scores still weight the
  chosen experts, always renormalised (as transformers), × ``routed_scaling_factor``; there is no
  expert bias. The aux loss (when on) uses the router's own top-k, so the router keeps training.
- Routed and shared experts clamp ``gate ≤ L`` and ``up ∈ [−L, L]`` before ``silu(gate)·up``
  (`kernels_v4.ClampedSiluMulFn`; transformers always does, the reference only with ``fusedswiglu``).
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, ops

from .kernels_v4 import ClampedSiluMulFn
from .moe import MoELayer, score


class DeepseekV4MoE(MoELayer):
    """``shared(x) + Σ_k w_k·Expert_{idx_k}(x)``; ``construct(x, input_ids)`` → (out, α-free aux or None, counts)."""

    def __init__(self, hidden_size: int, *, hash_routing: bool = False, vocab_size: int = 0,
                 clamp: float | None = None, **moe) -> None:
        super().__init__(hidden_size, **{**moe, "enable_expert_bias": moe.get("enable_expert_bias", False)
                                         and not hash_routing})
        self.hash_routing = hash_routing
        if clamp is not None:
            self.experts.act = self.experts.grouped.act = ClampedSiluMulFn(clamp)
            if self.shared_experts is not None:
                self.shared_experts.act = ClampedSiluMulFn(clamp)
        if hash_routing:
            table = (np.arange(vocab_size)[:, None] + np.arange(self.k)[None, :]) % self.e  # the reference's placeholder
            self.router.tid2eid = Parameter(Tensor(table.astype(np.int32)), name="tid2eid", requires_grad=False)

    def route(self, flat, input_ids=None):
        if not self.hash_routing:
            return super().route(flat, input_ids)
        r = self.router
        scores = score(r._mm(flat, r.weight), r.score_function)  # (T, E)
        idx = ops.gather(r.tid2eid, self.tokens.ids(input_ids).reshape(-1), 0)  # (T, K) in (b, s) token order
        probs = ops.gather_elements(scores, 1, idx)
        probs = probs / (probs.sum(-1, keepdims=True) + 1e-20)
        return probs * r.scaling, idx, scores
