"""Op choices that are correct *and* differentiable on CPU PyNative.

``mint.split`` / ``mint.chunk`` return views whose backward is wrong on MindSpore 2.10 CPU once the
pieces are reshaped/transposed further (measured: attention input gradients off by 10–25 % while
the forward is exact). Slicing (StridedSlice) has a correct backward, so every split goes through
``split_last``.
"""
from __future__ import annotations


def split_last(x, sizes):
    """Split the last dim into consecutive pieces of the given sizes (tuple of tensors)."""
    out, start = [], 0
    for n in sizes:
        out.append(x[..., start:start + n])
        start += n
    return tuple(out)
