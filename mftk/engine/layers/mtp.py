"""Multi-token prediction layer (DeepSeek-V3/V4, depth 1; models.md §2.13, mindformers-2.1.md §5.7).

``h' = final_layernorm(layer(eh_proj([enorm(embed(ids shifted by 1)) | hnorm(h)])))``; the
embedding and the output layer are the main model's (shared weights), so they are passed in.
"""
from __future__ import annotations

from mindspore import mint, nn

from .linear import Linear
from .norm import RMSNorm


class MultiTokenPredictionLayer(nn.Cell):
    def __init__(self, hidden_size: int, transformer_layer: nn.Cell, eps: float = 1e-6, hc_head: nn.Cell = None) -> None:
        super().__init__()
        self.enorm = RMSNorm(hidden_size, eps)
        self.hnorm = RMSNorm(hidden_size, eps)
        self.eh_proj = Linear(2 * hidden_size, hidden_size)  # input: [embedding half | hidden half]
        self.transformer_layer = transformer_layer
        self.hc_head = hc_head  # multi-stream layers (DeepSeek-V4): expand before the layer, collapse after
        self.final_layernorm = RMSNorm(hidden_size, eps)

    def construct(self, emb, hidden, rope, mask):
        h = self.eh_proj(mint.cat((self.enorm(emb), self.hnorm(hidden)), -1))  # (B, S, 2H) -> (B, S, H)
        if self.hc_head is not None:
            h = self.hc_head.expand(h)
        h, aux, counts = self.transformer_layer(h, rope, mask)
        if self.hc_head is not None:
            h = self.hc_head(h)
        return self.final_layernorm(h), aux, counts
