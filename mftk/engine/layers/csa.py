"""DeepSeek-V4 hybrid attention (mindformers-2.1.md §5.3–§5.5), with transformers' numerics.

One cell per layer, `DeepseekV4Attention` (``self_attention``), whatever its compression ratio r:

    cq = q_layernorm(linear_q_down_proj(x))                     (B, S, r_q)
    q  = rms(linear_q_up_proj(cq) per head) → RoPE (trailing lanes)   (B, S, nh, d)
    kv = kv_layernorm(linear_kv_proj(x)) → RoPE                 (B, S, d): one head, both K and V (MQA)
    out = core_attention(q, kv, x, cq)                          (B, S, nh, d)
    out = RoPE⁻¹(out) → grouped linear_o_group_proj → linear_proj

`CompressedSparseAttention` (``core_attention``) attends over ``[window KV (S) ; compressed KV (S/r)]``:
the last ``csa_window_size`` raw positions of each query, itself included, plus the compressed
entries it may see — every complete window before it (HCA, r ≠ 4), or the indexer's top-k of those
(CSA, r = 4). The softmax has a learned per-head sink. The sparse part is computed densely with a
mask (as transformers does), so the numbers are the same and CPU needs no gather kernel.

Where the sequence splits into blocks of ``c ≥ window − 1`` queries (`local_blocks`), the window part is
computed per block over the block's own keys and the ``m`` blocks before it, ``(m + 1)·c`` keys instead of
``S``: every key a query may see is there, the others are masked either way, so the numbers are the same
(on the bench shapes, S = 512 and window 128, the core attention does 0.4–0.5× the work).

The indexer's top-k is chosen on the host (a stable sort: ties go to the lower entry; `Indexer.select` says
why it is not in ops). Its KL loss (training only; inputs detached, so it trains only the indexer) is kept
on the cell as ``indexer_loss`` for `GPTModel` to add to the differentiated objective.
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from .kernels import RMSNormFn
from .kernels_v4 import MASKED, SinkAttentionFn
from .linear import Linear
from .norm import RMSNorm
from .rope_pairs import PartialPairRope

_bmm = ops.BatchMatMul()
_bmm_nt = ops.BatchMatMul(transpose_b=True)
EPS_LOSS = 1e-9
MIN_BLOCK = 64  # fewest queries of a `local_blocks` block (when the window allows)


def window_mask(s: int, window: int) -> np.ndarray:
    """``(S, S)`` True = masked: key k is visible to query p iff ``p − window < k ≤ p``."""
    p, k = np.arange(s)[:, None], np.arange(s)[None, :]
    return (k > p) | (k <= p - window)


def local_blocks(s: int, window: int, min_block: int = MIN_BLOCK) -> tuple[int, int] | None:
    """``(c, m)``: blocks of ``c`` queries (``c`` divides ``S``), each seeing its own keys and those of the ``m``
    blocks before it — every window key of its queries, ``m = ⌈(window − 1)/c⌉`` — for the ``c`` of the fewest
    keys per query, ``(m + 1)·c``, among blocks of at least ``min_block`` queries (or ``window − 1``, if
    less: tiny blocks make tiny GEMMs). None where no block beats the dense ``S`` keys."""
    best = None
    for c in range(max(1, min(min_block, window - 1)), s + 1):
        if s % c == 0:
            m = -(-(window - 1) // c)
            if (m + 1) * c < s and (best is None or (m + 1) * c < (best[1] + 1) * best[0]):
                best = (c, m)
    return best


def causal_compressed(s: int, n: int, ratio: int) -> np.ndarray:
    """``(S, n)`` True = masked: entry j (window ``[j·r, (j+1)·r)``) is visible to query p iff ``j < (p+1)//r``."""
    return np.arange(n)[None, :] >= ((np.arange(s) + 1) // ratio)[:, None]


class Compressor(nn.Cell):
    """Pools each window of ``ratio`` tokens into one entry (softmax-gated sum), then RMSNorm and RoPE.

    With ``overlap`` (CSA) the projections are ``2·dim`` wide: entry j pools window j's second half of
    the lanes (Cb) together with window j−1's first half (Ca), i.e. ``2·ratio`` rows."""

    def __init__(self, hidden_size: int, dim: int, ratio: int, rope_dim: int, eps: float, *, overlap: bool) -> None:
        super().__init__()
        self.dim, self.ratio, self.overlap = dim, ratio, overlap
        width = (2 if overlap else 1) * dim
        self.linear_wkv = Linear(hidden_size, width)
        self.linear_wgate = Linear(hidden_size, width)
        self.ape = Parameter(Tensor(np.zeros((ratio, width), np.float32)), name="ape")
        self.norm = RMSNorm(dim, eps)
        self.rope = PartialPairRope(rope_dim)
        self.rope_fn = self.rope.fn(dim)
        self._consts: dict[tuple, Tensor] = {}  # the overlap's row index and fill rows, per shape
        self._pool = self.pool  # compiled by `compile`

    def construct(self, x, rope_table):
        b, s, _ = x.shape
        n = s // self.ratio
        if n == 0:
            return None
        return self._pool(x, *self.inputs(x, rope_table))

    def inputs(self, x, rope_table) -> tuple:
        """`pool`'s arguments after ``x``, built (and cached) on the host: the RoPE tables of the entries and,
        with ``overlap``, the row index and fill rows of `_overlap`."""
        b, n = x.shape[0], x.shape[1] // self.ratio
        cos, sin = self.rope.tables(*rope_table(n, self.ratio), self.dim, b, 1)
        if not self.overlap:
            return cos, sin
        return cos, sin, self._overlap_index(n), self._fill_row(b, 0.0, x.dtype), self._fill_row(b, MASKED, x.dtype)

    def pool(self, x, cos, sin, index=None, kv_fill=None, gate_fill=None):
        """The entries ``(B, n, d)`` of ``x (B, S, H)``: tensors only (`compile` runs it under ``mindspore.jit``)."""
        b, s, _ = x.shape
        r, d, n = self.ratio, self.dim, s // self.ratio
        kv = self.linear_wkv(x)[:, :n * r].reshape(b, n, r, -1)  # (B, n, r, c·d)
        g = self.linear_wgate(x)[:, :n * r].reshape(b, n, r, -1) + ops.tile(self.ape.reshape(1, 1, r, -1), (b, n, 1, 1))
        if self.overlap:
            kv, g = self._overlap(kv, index, kv_fill, b, n), self._overlap(g, index, gate_fill, b, n)
        w = ops.softmax(ops.swapaxes(g, 2, 3), -1)  # (B, n, d, rows): weights over the window's rows
        pooled = (ops.swapaxes(kv, 2, 3) * w).sum(-1)  # (B, n, d)
        return self.rope_fn(self.norm(pooled).reshape(b, n, 1, d), cos, sin).reshape(b, n, d)

    def compile(self) -> None:
        """`pool` under ``mindspore.jit`` (`DeepseekV4Attention.compile_projections`): its ~25 ops and their
        backward as one graph; the host-built tables and index are its arguments."""
        import mindspore as ms

        cell = self  # a plain function over the cell, as `DeepseekV4Attention.compile_projections` does
        if self.overlap:
            def pool(x, cos, sin, index, kv_fill, gate_fill):
                return cell.pool(x, cos, sin, index, kv_fill, gate_fill)
        else:
            def pool(x, cos, sin):
                return cell.pool(x, cos, sin)
        self._pool = ms.jit(pool)

    def _overlap(self, t, index, fill, b: int, n: int):
        """``(B, n, r, 2d)`` → ``(B, n, 2r, d)``: rows ``[Ca of window j−1 ; Cb of window j]`` (window 0: ``fill``),
        as one row gather: viewed ``(B, 2·n·r, d)``, token i's lanes ``[Ca | Cb]`` are rows 2i and 2i+1, and
        the fill is one more row (2 ops and a scatter-add backward instead of ~6 slices and concats);
        ``index`` is `_overlap_index`."""
        r, d = self.ratio, self.dim
        rows = mint.cat((t.reshape(b, 2 * n * r, d), fill), 1)  # (B, 2nr + 1, d)
        return ops.gather(rows, index, 1).reshape(b, n, 2 * r, d)

    def _overlap_index(self, n: int) -> Tensor:
        if ("index", n) not in self._consts:
            r = self.ratio
            tok = np.arange(n)[:, None] * r + np.arange(r)[None, :]  # (n, r) token ids of window j
            prev = np.where(tok >= r, 2 * (tok - r), 2 * n * r)  # Ca of window j−1, or the fill row
            self._consts[("index", n)] = Tensor(np.concatenate([prev, 2 * tok + 1], 1).reshape(-1).astype(np.int32))
        return self._consts[("index", n)]

    def _fill_row(self, b: int, fill: float, dtype) -> Tensor:
        if ("fill", b, fill, dtype) not in self._consts:
            row = Tensor(np.full((b, 1, self.dim), fill, np.float32)).astype(dtype)
            self._consts[("fill", b, fill, dtype)] = row
        return self._consts[("fill", b, fill, dtype)]


class Indexer(nn.Cell):
    """Lightning indexer: ``score[p, j] = Σ_h w_h(p)·ReLU(q_h(p)·k_j)·dI^-½``, ``w = weights_proj(x)·nI^-½``,
    with its own overlapping compressor for the keys; returns the per-query top-k entry ids (−1: none)."""

    def __init__(self, hidden_size: int, q_lora_rank: int, heads: int, dim: int, topk: int, ratio: int,
                 rope_dim: int, eps: float) -> None:
        super().__init__()
        self.heads, self.dim, self.topk, self.ratio = heads, dim, topk, ratio
        self.linear_wq_b = Linear(q_lora_rank, heads * dim)
        self.linear_weights_proj = Linear(hidden_size, heads)
        self.compressor = Compressor(hidden_size, dim, ratio, rope_dim, eps, overlap=True)
        self.rope = PartialPairRope(rope_dim)
        self.rope_fn = self.rope.fn(dim)
        self._score = self.score  # compiled by `compile`

    def scores(self, x, cq, rope_table):
        """Index scores ``(B, S, n)`` (no mask) from detached inputs, or None before the first full window."""
        x, cq = ops.stop_gradient(x), ops.stop_gradient(cq)
        b, s, _ = x.shape
        if s // self.ratio == 0:
            return None
        cos, sin = self.rope.tables(*rope_table(s), self.dim, b, self.heads)
        return self._score(x, cq, cos, sin, *self.compressor.inputs(x, rope_table))

    def score(self, x, cq, cos, sin, *pool_inputs):
        """`scores` on tensors only (`compile` runs it under ``mindspore.jit``); ``pool_inputs``: the keys'
        `Compressor.inputs`."""
        b, s, _ = x.shape
        k = self.compressor.pool(x, *pool_inputs)  # (B, n, dI)
        q = self.rope_fn(self.linear_wq_b(cq).reshape(b, s, self.heads, self.dim), cos, sin)  # (B, S, nI, dI)
        dots = ops.relu(_bmm_nt(q.reshape(b, s * self.heads, self.dim), k)) * (self.dim ** -0.5)  # (B, S·nI, n)
        w = self.linear_weights_proj(x) * (self.heads ** -0.5)  # (B, S, nI)
        n = k.shape[1]
        return _bmm(w.reshape(b * s, 1, self.heads), dots.reshape(b * s, self.heads, n)).reshape(b, s, n)

    def compile(self) -> None:
        """`score` (the keys' compressor with it) under ``mindspore.jit``: ~40 ops as one call; the top-k
        stays on the host."""
        import mindspore as ms

        cell = self  # a plain function over the cell, as `DeepseekV4Attention.compile_projections` does

        def score(x, cq, cos, sin, k_cos, k_sin, index, kv_fill, gate_fill):
            return cell.score(x, cq, cos, sin, k_cos, k_sin, index, kv_fill, gate_fill)

        self._score = ms.jit(score)

    def select(self, scores, s: int) -> np.ndarray:
        """Top-``min(topk, n)`` visible entries per query, ``(B, S, k)`` int, −1 where fewer are visible.

        On host NumPy (a read of the scores, and the mask written back by `CompressedSparseAttention._bias`)
        because it is faster there on CPU: the same selection in MindSpore ops (a stable ``ops.sort`` —
        ``ops.topk`` picks arbitrary entries among ties, which ReLU makes common — then a scatter into the
        mask) took 4.5× the host version's time (bench/host_roundtrips.py ``csa_select``, B 2 × S 512 ×
        n 128, top-16, loaded machine; ``one_hot`` + sum instead of the scatter: 8×)."""
        sc = scores.asnumpy()
        n = sc.shape[-1]
        hidden = causal_compressed(s, n, self.ratio)[None]  # (1, S, n)
        sc = np.where(hidden, -np.inf, sc)
        k = min(self.topk, n)
        idx = np.argsort(-sc, axis=-1, kind="stable")[..., :k]
        return np.where(np.take_along_axis(hidden.repeat(sc.shape[0], 0), idx, -1), -1, idx)


class CompressedSparseAttention(nn.Cell):
    """Core attention of every DeepSeek-V4 layer (``core_attention``): sliding window, compressed entries
    (ratio > 0) chosen by the indexer (ratio 4, unless ``dense``), per-head sink ``attn_sink``."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, rope_dim: int, *, ratio: int, window: int,
                 q_lora_rank: int, index_heads: int, index_dim: int, index_topk: int, dense: bool, eps: float,
                 indexer_loss: bool) -> None:
        super().__init__()
        self.nh, self.d, self.ratio, self.window = num_heads, head_dim, ratio, window
        self.attn_sink = Parameter(Tensor(np.zeros((num_heads,), np.float32)), name="attn_sink")
        self.compressor = (Compressor(hidden_size, head_dim, ratio, rope_dim, eps, overlap=ratio == 4)
                           if ratio > 0 else None)
        self.indexer = (Indexer(hidden_size, q_lora_rank, index_heads, index_dim, index_topk, ratio, rope_dim, eps)
                        if ratio == 4 and not dense else None)
        self.fn = SinkAttentionFn(head_dim ** -0.5)
        self.with_indexer_loss = indexer_loss and self.indexer is not None
        self.indexer_loss = None  # set by each training forward of an indexer layer
        self._masks: dict[int, np.ndarray] = {}
        self._bias_cache: tuple | None = None  # ((B, S, n), mask, bias) of the last forward (no indexer)
        self._blocks: dict[tuple, tuple] = {}  # per (B, S, d, dtype): `local_blocks`, its key rows and fill rows

    def init_overrides(self) -> dict:
        return {self.attn_sink: lambda rng, shape, std: np.zeros(shape, np.float32)}  # as both references

    def construct(self, q, kv, x, cq, mask, rope_table):
        """``q (B, S, nh, d)``, ``kv (B, S, d)``, ``mask (B|1, 1, S, S)`` bool (causal + padding) → ``(B, S, nh, d)``."""
        b, s = q.shape[0], q.shape[1]
        self.indexer_loss = None
        comp = self.compressor(x, rope_table) if self.compressor is not None else None
        blocks, keys = self._local_keys(kv)  # (B, G, keys, d): G = 1 (dense) or the `local_blocks` blocks
        g = keys.shape[1]
        if comp is not None:
            n = comp.shape[1]
            keys = mint.cat((keys, comp.reshape(b, 1, n, self.d) if g == 1 else
                             ops.tile(comp.reshape(b, 1, n, self.d), (1, g, 1, 1))), 2)  # (B, G, keys + n, d)
        bias = self._bias(mask.asnumpy(), q, comp, x, cq, rope_table, b, s, blocks)
        sink = ops.tile(self.attn_sink.reshape(1, 1, 1, self.nh, 1), (b, 1, s, 1, 1)).reshape(b, g, -1, 1)
        out = self.fn(q.reshape(b, g, -1, self.d), keys, bias, sink)[0]
        return out.reshape(b, s, self.nh, self.d)

    def _local_keys(self, kv):
        """``(blocks, keys)``: ``blocks = (c, m)`` of `local_blocks` and each block's window keys ``(B, s/c, (m+1)·c, d)``
        (the ``m·c`` rows before the sequence are zeros, masked), or ``(None, kv (B, 1, S, d))``."""
        b, s, d = kv.shape
        key = (b, s, d, kv.dtype)
        if key not in self._blocks:
            blocks = local_blocks(s, self.window)
            if blocks is None:
                self._blocks[key] = (None, None, None)
            else:
                c, m = blocks
                rows = (np.arange(s // c)[:, None] * c + np.arange((m + 1) * c)[None, :]).reshape(-1)  # in padded rows
                fill = Tensor(np.zeros((b, m * c, d), np.float32)).astype(kv.dtype)
                self._blocks[key] = (blocks, Tensor(rows.astype(np.int32)), fill)
        blocks, rows, fill = self._blocks[key]
        if blocks is None:
            return None, kv.reshape(b, 1, s, d)
        c, m = blocks
        return blocks, ops.gather(mint.cat((fill, kv), 1), rows, 1).reshape(b, s // c, (m + 1) * c, d)

    def _bias(self, mask: np.ndarray, q, comp, x, cq, rope_table, b: int, s: int, blocks=None):
        """`SinkAttentionFn`'s additive bias ``(B, G, S·nh/G, keys + n + 1)``: 0 where visible, MASKED where not,
        the last column (the sink's) 0; rows query-major (row = p·nh + h), so q, the output and the per-row
        mask need no transpose. ``G = 1`` and the keys are all ``S`` positions, or (``blocks = (c, m)``) ``G``
        blocks of ``c`` queries whose keys are the ``(m + 1)·c`` positions ending with the block's own (before
        the sequence: masked). Without an indexer it depends only on the mask and the shapes: the last one is
        reused while the mask is the same (the causal one of every step), saving its host build and tile."""
        n = 0 if comp is None else comp.shape[1]
        cached = self._bias_cache
        if self.indexer is None and cached is not None and cached[0] == (b, s, n) and np.array_equal(cached[1], mask):
            return cached[2]
        hidden = np.broadcast_to(mask.reshape(-1, s, s) | self._window(s), (b, s, s))  # (B, S, S) True = masked
        g = 1
        if blocks is not None:  # (B, G, c, (m+1)·c): query p = i·c + r, key column j is position (i − m)·c + j
            c, m = blocks
            g = s // c
            padded = np.concatenate([np.ones((b, s, m * c), bool), hidden], 2).reshape(b, g, c, m * c + s)
            cols = (np.arange(g)[:, None] * c + np.arange((m + 1) * c)[None, :])[None, :, None, :]
            hidden = np.take_along_axis(padded, cols, 3).reshape(b, s, (m + 1) * c)
        if comp is not None:
            hidden = np.concatenate([hidden, self._compressed_mask(q, comp, x, cq, rope_table, b, s, n)], 2)
        bias = np.zeros((b, s, hidden.shape[2] + 1), np.float32)
        bias[..., :-1][hidden] = MASKED
        bias = ops.tile(Tensor(bias).reshape(b, g, s // g, 1, -1), (1, 1, 1, self.nh, 1)).reshape(b, g, -1,
                                                                                                  bias.shape[-1])
        if self.indexer is None:
            self._bias_cache = ((b, s, n), mask.copy(), bias)
        return bias

    def _window(self, s: int) -> np.ndarray:
        if s not in self._masks:
            self._masks[s] = window_mask(s, self.window)[None]
        return self._masks[s]

    def _compressed_mask(self, q, comp, x, cq, rope_table, b: int, s: int, n: int) -> np.ndarray:
        """``(B, S, n)`` True = masked: causal windows (HCA, dense CSA) or the indexer's valid top-k (CSA)."""
        causal = causal_compressed(s, n, self.ratio)[None].repeat(b, 0)
        if self.indexer is None:
            return causal
        scores = self.indexer.scores(x, cq, rope_table)
        idx = self.indexer.select(scores, s)  # (B, S, k), −1 = none
        keep = np.zeros((b, s, n + 1), bool)
        np.put_along_axis(keep, np.where(idx < 0, n, idx), True, -1)
        if self.with_indexer_loss and self.training:
            self.indexer_loss = self._indexer_loss(q, comp, scores, idx)
        return ~keep[..., :n]

    def _indexer_loss(self, q, comp, scores, idx: np.ndarray):
        """KL of the indexer's top-k distribution to the main attention's (detached), mean over (b, p)."""
        b, s, k = idx.shape
        valid = Tensor(idx >= 0)
        safe = Tensor(np.maximum(idx, 0).astype(np.int32))
        q, comp = ops.stop_gradient(q), ops.stop_gradient(comp)
        sel = ops.gather(comp, safe.reshape(b, s * k), 1, batch_dims=1).reshape(b * s, k, self.d)  # (B·S, k, d)
        logits = _bmm_nt(q.reshape(b * s, self.nh, self.d), sel) * (self.d ** -0.5)  # (B·S, nh, k)
        hide = ops.tile(~valid.reshape(b * s, 1, k), (1, self.nh, 1))
        target = ops.softmax(ops.masked_fill(logits, hide, MASKED), -1).sum(1)  # (B·S, k)
        target = ops.stop_gradient(target / (target.sum(-1, keepdims=True) + EPS_LOSS))
        picked = ops.gather_elements(scores.reshape(b * s, -1), 1, safe.reshape(b * s, k))
        pred = ops.softmax(ops.masked_fill(picked, ~valid.reshape(b * s, k), MASKED), -1)
        ratio = ops.maximum(target / (target.sum(-1, keepdims=True) + EPS_LOSS), EPS_LOSS)
        return (target * (ops.log(ratio) - ops.log(pred + EPS_LOSS))).sum(-1).mean()


class DeepseekV4Attention(nn.Cell):
    """``self_attention`` of a DeepSeek-V4 layer: low-rank Q, one shared KV head, partial interleaved RoPE,
    `CompressedSparseAttention`, inverse RoPE on the output, grouped low-rank output projection."""

    def __init__(self, hidden_size: int, num_heads: int, *, q_lora_rank: int, head_dim: int, rope_dim: int,
                 o_groups: int, o_lora_rank: int, ratio: int, window: int, index_heads: int, index_dim: int,
                 index_topk: int, dense: bool = False, eps: float = 1e-6, indexer_loss: bool = True) -> None:
        super().__init__()
        self.nh, self.d, self.g, self.r_o = num_heads, head_dim, o_groups, o_lora_rank
        self.compressed = ratio > 0
        self.linear_q_down_proj = Linear(hidden_size, q_lora_rank)
        self.q_layernorm = RMSNorm(q_lora_rank, eps)
        self.linear_q_up_proj = Linear(q_lora_rank, num_heads * head_dim)
        self.q_rms_gamma = Parameter(Tensor(np.ones((head_dim,), np.float32)), name="q_rms_gamma", requires_grad=False)
        self.linear_kv_proj = Linear(hidden_size, head_dim)
        self.kv_layernorm = RMSNorm(head_dim, eps)
        group_in = num_heads * head_dim // o_groups
        self.linear_o_group_proj = Parameter(Tensor(np.zeros((o_groups * o_lora_rank, group_in), np.float32)),
                                             name="linear_o_group_proj")
        self.linear_proj = Linear(o_groups * o_lora_rank, hidden_size)
        self.core_attention = CompressedSparseAttention(
            hidden_size, num_heads, head_dim, rope_dim, ratio=ratio, window=window, q_lora_rank=q_lora_rank,
            index_heads=index_heads, index_dim=index_dim, index_topk=index_topk, dense=dense, eps=eps,
            indexer_loss=indexer_loss)
        self.q_norm = RMSNormFn(eps)  # the weightless per-head RMS of q (weight: the frozen ones q_rms_gamma)
        self.rope = PartialPairRope(rope_dim)
        self.rope_fn = self.rope.fn(head_dim)
        self._project, self._output = self.project, self.output  # compiled by `compile_projections`

    def construct(self, x, rope, mask):
        table_set, _ = rope
        table = table_set.compress if self.compressed else table_set.main
        b, s, _ = x.shape
        cos, sin = table(s)
        tables = self.rope.tables
        q, kv, cq = self._project(x, *tables(cos, sin, self.d, b, self.nh), *tables(cos, sin, self.d, b, 1))
        out = self.core_attention(q, kv, x, cq, mask, table_set.compress)
        return self._output(out, *tables(cos, sin, self.d, b, self.nh, inverse=True))

    def project(self, x, q_cos, q_sin, kv_cos, kv_sin):
        """``(q (B, S, nh, d), kv (B, S, d), cq (B, S, r_q))``; the RoPE tables as `PartialPairRope.tables` makes them."""
        b, s, _ = x.shape
        cq = self.q_layernorm(self.linear_q_down_proj(x))  # (B, S, r_q)
        q = self.q_norm(self.linear_q_up_proj(cq).reshape(b, s, self.nh, self.d), self.q_rms_gamma)
        q = self.rope_fn(q, q_cos, q_sin)  # (B, S, nh, d)
        kv = self.rope_fn(self.kv_layernorm(self.linear_kv_proj(x)).reshape(b, s, 1, self.d), kv_cos, kv_sin)
        return q, kv.reshape(b, s, self.d), cq

    def output(self, out, cos, sin):
        """The core attention's ``out (B, S, nh, d)`` → ``(B, S, H)``; ``cos``/``sin``: the inverse tables."""
        b, s = out.shape[0], out.shape[1]
        out = self.rope_fn(out, cos, sin).reshape(b * s, self.g, -1)  # V carried RoPE: rotate it back
        w = self.linear_o_group_proj.reshape(self.g, self.r_o, -1)  # (g, r_o, nh·d/g)
        y = _bmm_nt(ops.swapaxes(out, 0, 1), w)  # (g, B·S, r_o)
        return self.linear_proj(ops.swapaxes(y, 0, 1).reshape(b, s, self.g * self.r_o))

    def compile_projections(self) -> None:
        """`project` and `output` under ``mindspore.jit`` (`GPTModel.jit_blocks`), and the core attention's
        compressor and indexer scores (`Compressor.compile`, `Indexer.compile`); the rest of the core attention
        stays eager: its mask bias and the indexer's top-k are built on the host."""
        import mindspore as ms

        cell = self  # plain functions over the cell, as `gpt.TransformerLayer.compile` does

        def project(x, q_cos, q_sin, kv_cos, kv_sin):
            return cell.project(x, q_cos, q_sin, kv_cos, kv_sin)

        def output(out, cos, sin):
            return cell.output(out, cos, sin)

        self._project, self._output = ms.jit(project), ms.jit(output)
        for part in (self.core_attention.compressor, self.core_attention.indexer):
            if part is not None:
                part.compile()


def indexer_cells(cell) -> list:
    """The cells under ``cell`` that leave an indexer loss on themselves for `GPTModel`'s objective."""
    return [c for _, c in cell.cells_and_names() if hasattr(c, "with_indexer_loss")]
