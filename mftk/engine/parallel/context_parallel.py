"""Context parallel (the reference's ``colossal`` method): load-balanced sequence split, KV all-gathered.

The sequence is cut into ``2·cp`` chunks; CP rank ``i`` holds chunks ``i`` and ``2cp−1−i``, so under the
causal mask every rank has the same amount of attention work. Each rank embeds its own tokens, applies
RoPE at their global positions, and attends with its queries to the keys and values of the whole
sequence (all-gathered over the CP group; the gradient travels back as a reduce-scatter, `comm.GatherFromGroup`).
The mask is built on global positions, so the gathered key order does not matter.

The loss: rank ``i`` returns ``cp · Σ_local ce·m / Σ_global m`` (every rank holds the whole batch, so the
global count needs no message); the trainer's average over dp×cp then gives exactly the single-process
masked mean, for the logged loss and for the gradients.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from mindspore import Tensor, nn

from mftk.engine.layers.loss import IGNORE_INDEX


def colossal_positions(seq_length: int, cp: int, rank: int) -> np.ndarray:
    """Global token positions held by CP rank ``rank``: chunks ``rank`` and ``2cp−1−rank`` of ``2cp``."""
    if seq_length % (2 * cp):
        raise ValueError(f"seq_length {seq_length} does not split into 2·cp = {2 * cp} chunks")
    c = seq_length // (2 * cp)
    a, b = rank, 2 * cp - 1 - rank
    return np.concatenate([np.arange(a * c, (a + 1) * c), np.arange(b * c, (b + 1) * c)])


def context_parallel_problems(spec: Any, cp: int, seq_length: int) -> list[str]:
    """Why this model cannot run with context_parallel=cp (empty when it can)."""
    from mftk.engine.layers.attention import SelfAttention
    from mftk.engine.layers.mlp import MLP

    out = []
    if any(ls.attention.module is not SelfAttention for ls in spec.layers):
        out.append("context parallel supports GQA attention (Qwen3) only")
    if any(ls.is_moe or ls.mlp.module is not MLP for ls in spec.layers) or spec.mtp_layers:
        out.append("context parallel does not support MoE or MTP layers yet")
    if seq_length % (2 * cp):
        out.append(f"seq_length={seq_length} does not divide into 2·context_parallel = {2 * cp} chunks (colossal)")
    return out


class ContextParallelModel(nn.Cell):
    """Wraps a `GPTModel` (same parameters, same names) to run this CP rank's share of each sequence."""

    def __init__(self, model: Any, group: Any) -> None:
        super().__init__(auto_prefix=False)  # parameter names stay the model's own
        from mftk.engine.parallel.comm import GatherFromGroup

        self.model, self.group, self.spec = model, group, model.spec
        self.gather = GatherFromGroup(group, 2)  # (B, heads, S, hd): the sequence is dim 2
        for layer in model.decoder.layers:
            layer.self_attention.cp_gather = self.gather
        self._positions: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def positions(self, seq: int) -> tuple[np.ndarray, np.ndarray]:
        """(this rank's positions, the gathered key order: every rank's positions in group-rank order)."""
        if seq not in self._positions:
            cp = self.group.size
            mine = colossal_positions(seq, cp, self.group.rank)
            keys = np.concatenate([colossal_positions(seq, cp, r) for r in range(cp)])
            self._positions[seq] = (mine, keys)
        return self._positions[seq]

    def construct(self, input_ids, labels, loss_mask=None, position_ids=None, attention_mask=None):
        from mftk.engine.models.gpt import _np

        m = self.model
        ids, lab = _np(input_ids).astype(np.int32), _np(labels).astype(np.int32)
        lm = (ids != m.spec.pad_token_id) if loss_mask is None else _np(loss_mask)
        lm = lm.astype(np.float32) * (lab != IGNORE_INDEX)
        seq = ids.shape[1]
        mine, keys = self.positions(seq)
        cos, sin = m.rope(seq)
        rope = (cos[:, Tensor(mine)], sin[:, Tensor(mine)])  # (1, S_local, 1, D) at the global positions
        full_mask = m._mask(ids, attention_mask).asnumpy()
        mask = Tensor(np.ascontiguousarray(full_mask[:, :, mine][:, :, :, keys]))
        h = m.embedding(Tensor(np.ascontiguousarray(ids[:, mine])))
        for layer in m.decoder.layers:
            h, _, _ = layer(h, rope, mask)
        total = float(lm.sum()) + 1e-8  # the single-process denominator (Σ m + eps)
        weight = lm[:, mine] * np.float32(self.group.size / total)
        loss = m.head_loss(m.decoder.final_layernorm(h), lab[:, mine], weight)
        return loss, loss, (), (), ()

    def update_expert_bias(self, tokens_per_expert=None) -> None:
        self.model.update_expert_bias(tokens_per_expert)
