"""Masked-mean cross-entropy (models.md §4), ``IGNORE_INDEX``, and `HeadLoss`, the training loss.

Training computes the LM head and the loss in one `HeadLoss` (`kernels.HeadCrossEntropyFn`; tensor
parallel swaps in the vocabulary-parallel one). `masked_mean_ce` over materialised logits is the plain
formula those are tested against (``log_softmax`` + ``gather_elements``; ``mint`` CE has no CPU kernel,
mindspore-cpu.md §1.3).
"""
from __future__ import annotations

from mindspore import nn, ops

IGNORE_INDEX = -100


def token_cross_entropy(logits, labels):
    """Per-token ``logsumexp(z) − z_label``; ``logits (N, V)``, ``labels (N,)`` → ``(N,)``.

    Ignored labels (−100) are clamped to 0 here; the caller masks them out.
    """
    logp = ops.log_softmax(logits, -1)  # (N, V)
    safe = ops.maximum(labels, 0).astype(labels.dtype).reshape(-1, 1)  # (N, 1)
    return -ops.gather_elements(logp, 1, safe).reshape(-1)


def masked_mean_ce(logits, labels, loss_mask, eps: float = 1e-8):
    """``Σ ce·m / (Σ m + eps)`` with ``m = loss_mask · (labels ≠ −100)``, flattened in (b, s) order."""
    labels = labels.reshape(-1)
    m = loss_mask.reshape(-1).astype(logits.dtype) * (labels != IGNORE_INDEX).astype(logits.dtype)
    ce = token_cross_entropy(logits.reshape(-1, logits.shape[-1]), labels)
    return (ce * m).sum() / (m.sum() + eps)


class HeadLoss(nn.Cell):
    """``Σᵢ wᵢ·CE(h·Wᵀ, yᵢ)``: the LM head and the weighted token losses in one kernel
    (`kernels.HeadCrossEntropyFn`; ``softmax − one-hot`` is never built). ``h (..., H)``, ``weight (V, H)``,
    ``labels (N,)`` int32 in range (ignored ones clamped, their weight 0), ``weights (N,)``.
    Tensor parallel swaps in `parallel.tensor_parallel.VocabParallelHeadLoss`."""

    def __init__(self) -> None:
        super().__init__()
        from .registry import kernel

        self.fn = kernel("head_cross_entropy")()

    def construct(self, h, weight, labels, weights):
        return self.fn(h.reshape(-1, h.shape[-1]), weight, labels, weights)[0]
