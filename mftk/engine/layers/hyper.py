"""Manifold-constrained hyper-connections (mHC; mindformers-2.1.md §5.4), with transformers' numerics.

The residual is ``n`` streams ``X (B, S, n, H)``. Before a sub-block, `HyperConnection` reads
the streams and makes three things from one projection of their RMS-normalised concatenation:

    pre  = σ(α_pre·h_pre + b_pre) + ε               (B, S, n)   collapses X into the block input Σ pre_i·X_i
    post = 2·σ(α_post·h_post + b_post)              (B, S, n)   spreads the block output over the streams
    comb = Sinkhorn(softmax(α_res·h_res + b_res))   (B, S, n, n) mixes the streams (doubly stochastic)

and after it ``X' = combᵀ·X + post ⊗ out``. `HyperHead` collapses the streams once at the end of
the decoder (and of each MTP layer). Parameter names are the reference's
(``attn_hc.mapping_proj.weight``, ``…bias``, ``alpha_pre``/``alpha_post``/``alpha_res``, frozen
``rms_weight``; ``hc_head.hc_fn.weight``, ``hc_base``, ``hc_scale``); init as the reference's:
mapping ~ N(0, 1e-4), alphas = ``mhc_init_gating_factor``, b_pre = −ln 3, b_post = 0,
b_res = −5·(1 − I), so a fresh layer starts near "average the streams, keep them apart".
"""
from __future__ import annotations

import math

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, mint, nn, ops

from .kernels_v4 import SinkhornFn
from .linear import Linear
from .ops_cpu import split_last

_bmm = ops.BatchMatMul()
_bmm_tn = ops.BatchMatMul(transpose_a=True)
_mm = ops.MatMul()
_mm_nt = ops.MatMul(transpose_b=True)


_ONES: dict = {}


def _ones_column(k: int, dtype):
    """A cached ``(k, 1)`` column of ones (row sums as a GEMV; a fresh ``ones`` per call costs a launch)."""
    if (k, dtype) not in _ONES:
        _ONES[(k, dtype)] = Tensor(np.ones((k, 1), np.float32)).astype(dtype)
    return _ONES[(k, dtype)]


def normed_matmul(x, w, norm_weight, eps: float):
    """``RMSNorm(x; norm_weight) · wᵀ`` for ``x (N, K)``, ``w (m, K)`` with m small, as ``r ⊙ (x · (w ⊙ g)ᵀ)``:
    the norm is a per-row factor ``r = rsqrt(mean(x²) + eps)``, so the normalised ``x`` is never built."""
    if norm_weight is not None:
        w = w * ops.tile(norm_weight.reshape(1, -1), (w.shape[0], 1))
    r = mint.rsqrt(_mm(x * x, _ones_column(x.shape[1], x.dtype)) / x.shape[1] + eps)  # (N, 1)
    return _mm_nt(x, w) * ops.tile(r, (1, w.shape[0]))


def _scalar(value: float, name: str) -> Parameter:
    return Parameter(Tensor(np.full((1,), value, np.float32)), name=name)


def mix_streams(x, weight, bias, rms_weight, alpha_pre, alpha_post, alpha_res, eps: float, rms_eps: float):
    """A `HyperConnection` but its Sinkhorn: ``(collapsed (B, S, H), post (B·S, n, 1), comb's logits (B·S, n, n))``
    from the streams ``x (B, S, n, H)`` and the connection's weights."""
    b, s, n, h = x.shape
    mix = normed_matmul(x.reshape(b * s, n * h), weight, rms_weight, rms_eps)
    w_pre, w_post, w_res = split_last(mix, (n, n, n * n))  # (B·S, ·); the bias comes after the alphas
    b_pre, b_post, b_res = split_last(bias, (n, n, n * n))
    pre = mint.sigmoid(w_pre * alpha_pre + b_pre) + eps  # (B·S, n)
    post = 2.0 * mint.sigmoid(w_post * alpha_post + b_post)
    collapsed = _bmm(pre.reshape(b * s, 1, n), x.reshape(b * s, n, h)).reshape(b, s, h)
    return collapsed, post.reshape(b * s, n, 1), (w_res * alpha_res + b_res).reshape(b * s, n, n)


_MIX_COMPILED = ms.jit(mix_streams)


class HyperConnection(nn.Cell):
    """``(pre-collapsed input (B, S, H), post (B, S, n), comb (B, S, n, n))`` from the streams ``(B, S, n, H)``."""

    def __init__(self, hidden_size: int, streams: int, *, sinkhorn_iters: int, hc_eps: float, rms_eps: float,
                 init_alpha: float = 0.01) -> None:
        super().__init__()
        self.n, self.h, self.iters, self.eps, self.init_alpha = streams, hidden_size, sinkhorn_iters, hc_eps, init_alpha
        self.mapping_proj = Linear(streams * hidden_size, (2 + streams) * streams, bias=True)
        self.alpha_pre, self.alpha_post, self.alpha_res = (_scalar(init_alpha, n) for n in
                                                           ("alpha_pre", "alpha_post", "alpha_res"))
        self.rms_weight = Parameter(Tensor(np.ones((streams * hidden_size,), np.float32)), name="rms_weight",
                                    requires_grad=False)
        self.rms_eps = float(rms_eps)
        self.sinkhorn = SinkhornFn(sinkhorn_iters, hc_eps)
        self.jit_mix = False  # `mix_streams` under mindspore.jit, once `compile` ran

    def init_overrides(self) -> dict:
        n, a = self.n, self.init_alpha
        bias = np.concatenate([np.full(n, -math.log(3.0)), np.zeros(n), (-5.0 * (1.0 - np.eye(n))).reshape(-1)])
        out = {self.mapping_proj.weight: lambda rng, shape, std: rng.normal(0.0, 1e-4, shape).astype(np.float32),
               self.mapping_proj.bias: lambda rng, shape, std: bias.astype(np.float32)}
        out.update({p: lambda rng, shape, std: np.full(shape, a, np.float32)
                    for p in (self.alpha_pre, self.alpha_post, self.alpha_res)})
        return out

    def construct(self, x):
        mix = _MIX_COMPILED if self.jit_mix else mix_streams
        collapsed, post, res = mix(x, self.mapping_proj.weight, self.mapping_proj.bias, self.rms_weight,
                                   self.alpha_pre, self.alpha_post, self.alpha_res, self.eps, self.rms_eps)
        return collapsed, post, self.sinkhorn(res)[0]

    def compile(self) -> None:
        """Run `mix_streams` under ``mindspore.jit`` (`GPTModel.jit_blocks`): its ~15 small ops and their
        backward as one graph, 1.2× fewer CPU-seconds per V4 bench step (bench/train_step.py ``mftk`` vs
        ``mftk_eager``). One compiled function for every hyper-connection of the model (their weights are
        its arguments), so it compiles once per shape. The Sinkhorn stays outside: it runs on the host."""
        self.jit_mix = True

    @staticmethod
    def merge(x, post, comb, out):
        """``X' = combᵀ·X + post ⊗ out``: stream k gets ``Σ_j comb[j, k]·X_j + post_k·out``."""
        b, s, n, h = x.shape
        mixed = _bmm_tn(comb, x.reshape(b * s, n, h))  # (B·S, n, H)
        return (mixed + _bmm(post, out.reshape(b * s, 1, h))).reshape(b, s, n, h)


class HyperHead(nn.Cell):
    """``Σ_i pre_i·X_i`` with ``pre = σ(hc_scale·hc_fn(rms(X)) + hc_base) + ε``; ``expand`` tiles one stream n times."""

    def __init__(self, hidden_size: int, streams: int, *, hc_eps: float, rms_eps: float) -> None:
        super().__init__()
        self.n, self.eps = streams, hc_eps
        self.hc_fn = Linear(streams * hidden_size, streams)
        self.hc_base = Parameter(Tensor(np.zeros((streams,), np.float32)), name="hc_base")
        self.hc_scale = Parameter(Tensor(np.zeros((1,), np.float32)), name="hc_scale")
        self.rms_eps = float(rms_eps)

    def init_overrides(self) -> dict:
        zero = lambda rng, shape, std: np.zeros(shape, np.float32)  # noqa: E731  (the reference's init)
        return {self.hc_base: zero, self.hc_scale: zero}

    def expand(self, h):
        """``(B, S, H)`` → ``(B, S, n, H)``: every stream starts as the embedding."""
        b, s, d = h.shape
        return ops.tile(h.reshape(b, s, 1, d), (1, 1, self.n, 1))

    def construct(self, x):
        b, s, n, h = x.shape
        mixes = normed_matmul(x.reshape(b * s, n * h), self.hc_fn.weight, None, self.rms_eps)  # (B·S, n)
        pre = mint.sigmoid(mixes * self.hc_scale + self.hc_base) + self.eps
        return _bmm(pre.reshape(b * s, 1, n), x.reshape(b * s, n, h)).reshape(b, s, h)


class HyperConnectionTransformerLayer(nn.Cell):
    """A decoder layer on ``n`` streams: ``attn_hc`` → attention → merge, ``ffn_hc`` → MLP (MoE) → merge.

    Same interface as `gpt.TransformerLayer`: ``(streams, rope, mask, input_ids) → (streams, aux, counts)``;
    ``input_ids`` reach the MoE (hash-routed layers select experts by token id)."""

    def __init__(self, spec, dropout: float = 0.0) -> None:
        super().__init__()
        self.attn_hc = spec.hyper.build()
        self.input_layernorm = spec.norm.build()
        self.self_attention = spec.attention.build()
        self.ffn_hc = spec.hyper.build()
        self.pre_mlp_layernorm = spec.norm.build()
        self.mlp = spec.mlp.build()
        self.is_moe, self.dropout = spec.is_moe, float(dropout)

    def _drop(self, x):
        return ops.dropout(x, p=self.dropout) if self.dropout > 0.0 and self.training else x

    def compile(self) -> None:
        """The hyper-connections' mixes (`HyperConnection.compile`), the attention's projections, compressors
        and indexer scores (`csa.DeepseekV4Attention.compile_projections`) where the attention has them and
        the MoE's shared expert (`moe.SharedExpertMLP.compile`): the rest of the core attention (host-built
        bias, top-k), the routed experts' dispatch and the Sinkhorn sync with the host every step."""
        self.attn_hc.compile()
        self.ffn_hc.compile()
        if hasattr(self.self_attention, "compile_projections"):
            self.self_attention.compile_projections()
        shared = getattr(self.mlp, "shared_experts", None)
        if hasattr(shared, "compile"):
            shared.compile()

    def construct(self, x, rope, mask, input_ids=None):
        h, post, comb = self.attn_hc(x)
        x = HyperConnection.merge(x, post, comb, self._drop(self.self_attention(self.input_layernorm(h), rope, mask)))
        h, post, comb = self.ffn_hc(x)
        m, aux, counts = self.mlp(self.pre_mlp_layernorm(h), input_ids)
        return HyperConnection.merge(x, post, comb, self._drop(m)), aux, counts
