"""Vocabulary embedding: a gather from ``weight [V, H]`` (``mint`` embedding has no CPU kernel)."""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops


class VocabEmbedding(nn.Cell):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = Parameter(Tensor(np.zeros((vocab_size, hidden_size), np.float32)), name="weight")

    def construct(self, ids):
        return ops.gather(self.weight, ids, 0)  # (B, S) -> (B, S, H)


class LanguageModelEmbedding(nn.Cell):
    """Holds ``word_embeddings`` so the checkpoint name is ``embedding.word_embeddings.weight``."""

    def __init__(self, vocab_size: int, hidden_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.word_embeddings = VocabEmbedding(vocab_size, hidden_size)
        self.dropout = float(dropout)

    def construct(self, ids):
        h = self.word_embeddings(ids)
        if self.dropout > 0.0 and self.training:
            h = ops.dropout(h, p=self.dropout)
        return h
