"""Mixture of experts: top-k router, grouped gated experts (SwiGLU, or GeGLU with ``hidden_act: gelu``), shared
experts (models.md §2.12).

Dispatch is dropless: the flat expert ids are stably sorted on the host, tokens are gathered into
per-expert rows (padded to the busiest expert, `grouped.padded_layout`; padding weighs 0), all experts
run as batched matmuls (`grouped.GroupedExpertsFn`), and the weighted results are scattered back with
``ops.unsorted_segment_sum`` — every (token, choice) pair is computed, none is dropped. One host sync
per MoE layer is the price; on CPU PyNative it is small next to the GEMMs. (Expert parallel keeps the
per-expert loop over the rows each rank receives.)

Aux losses are returned α-free; the model adds ``α·L`` to the differentiated objective, which
gives the same gradients as the reference's autoscaler (models.md §6).
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from .grouped import GroupedExpertsFn, WeightedCombineFn, padded_layout
from .linear import Linear
from .mlp import MLP, gated_kernel
from .ops_cpu import split_last

def _buffer(shape, name: str) -> Parameter:
    return Parameter(Tensor(np.zeros(shape, np.float32)), name=name, requires_grad=False)


def score(logits, fn: str):
    if fn == "sigmoid":
        return mint.sigmoid(logits)
    if fn == "softmax":
        return ops.softmax(logits, -1)
    return mint.sqrt(ops.softplus(logits))


def group_limited(sc, n_group: int, topk_group: int):
    """Keep the ``topk_group`` groups with the largest top-2 sums; other experts get −inf (reference §2.12.3)."""
    t, e = sc.shape
    grouped = sc.reshape(t, n_group, e // n_group)  # (T, G, E/G)
    group_score = ops.topk(grouped, 2)[0].sum(-1)  # (T, G)
    keep = ops.one_hot(ops.topk(group_score, topk_group)[1], n_group,
                       Tensor(1.0, sc.dtype), Tensor(0.0, sc.dtype)).sum(1)  # (T, G)
    keep = ops.broadcast_to(keep.reshape(t, n_group, 1), grouped.shape).reshape(t, e)
    return mint.where(keep > 0, sc, float("-inf"))


class TopKRouter(nn.Cell):
    """``weight [E, H]``; returns (probs ``(T, K)``, expert ids ``(T, K)``, scores ``(T, E)``)."""

    def __init__(self, hidden_size: int, num_experts: int, topk: int, *, score_function: str = "sigmoid",
                 n_group: int = 0, topk_group: int = 0, norm_topk_prob: bool = True,
                 scaling_factor: float = 1.0, global_aux: bool = False) -> None:
        super().__init__()
        self.e, self.k = num_experts, topk
        self.score_function, self.norm_topk_prob = score_function, norm_topk_prob
        self.n_group, self.topk_group, self.scaling = n_group or 0, topk_group or 0, float(scaling_factor or 1.0)
        self.weight = Parameter(Tensor(np.zeros((num_experts, hidden_size), np.float32)), name="weight")
        self._mm = ops.MatMul(transpose_b=True)
        if global_aux:
            self.global_tokens_per_expert = _buffer((num_experts,), "global_tokens_per_expert")
            self.ga_steps = _buffer((1,), "ga_steps")

    def construct(self, x, expert_bias=None):
        scores = score(self._mm(x, self.weight), self.score_function)  # (T, E) fp32
        sc = scores if expert_bias is None else scores + expert_bias
        if self.n_group > 1:
            sc = group_limited(sc, self.n_group, self.topk_group)
        idx = ops.topk(sc, self.k)[1]  # (T, K)
        probs = ops.gather_elements(scores, 1, idx)  # bias shifts selection, never the weights
        if self.norm_topk_prob:
            probs = probs / (probs.sum(-1, keepdims=True) + 1e-20)
        return probs * self.scaling, idx, scores


class LocalTokens(nn.Cell):
    """Where the tokens of each sequence are: all on this rank, so the load-balancing sums are local.

    Layouts that cut sequences over ranks (sequence parallel under TP, context parallel) swap in
    `parallel.context_parallel.SequenceShards`, whose sums cover the whole sequences; ``shards`` is the
    number of ranks holding a part of each sequence.
    """

    shards = 1

    def construct(self, x):
        """Differentiable sum over the ranks holding the other parts of the sequences."""
        return x

    def total(self, x):
        """The same sum for statistics that carry no gradient (selection counts)."""
        return x

    def ids(self, input_ids):
        """The token ids of this rank's hidden states (hash routing), from the model's ``(B, S)`` ids."""
        return input_ids


def aux_loss(scores, k: int, kind: str, batch: int, router: TopKRouter | None = None,
             tokens: LocalTokens | None = None):
    """α-free load-balancing loss from un-biased, un-grouped top-K statistics (reference §2.12).

    ``scores (T, E)`` are this rank's tokens in (b, s) order; ``tokens`` sums the per-sequence (or per-batch)
    statistics over the ranks holding the rest of the sequences, so the loss is that of the whole batch."""
    tokens = tokens if tokens is not None else LocalTokens()
    t, e = scores.shape
    p = scores  # softmax scores already sum to 1; sigmoid/sqrtsoftplus are normalised per token
    if router is not None and router.score_function != "softmax":
        p = scores / (scores.sum(-1, keepdims=True) + 1e-20)
    sel = ops.stop_gradient(ops.one_hot(ops.topk(p, k)[1], e, Tensor(1.0, p.dtype), Tensor(0.0, p.dtype)).sum(1))
    if kind == "seq_aux_loss":
        s = t // batch
        n = s * tokens.shards  # whole sequence length
        per_seq = (tokens(p.reshape(batch, s, e).sum(1)) * tokens.total(sel.reshape(batch, s, e).sum(1))).sum(-1)
        return (per_seq * (e / (k * n * n))).mean()  # (B,) -> scalar
    count = tokens.total(sel.sum(0))  # (E,) over the whole batch
    n = t * tokens.shards
    if kind == "global_aux_loss" and router is not None:
        ops.assign_add(router.global_tokens_per_expert, count)
        ops.assign_add(router.ga_steps, Tensor(np.ones((1,), np.float32)))
        count = ops.stop_gradient(router.global_tokens_per_expert / router.ga_steps)
    return (tokens(p.sum(0)) * count).sum() * (e / (k * n * n))


class LocalExperts(nn.Cell):
    """Every expert is on this rank: the rows sorted by expert go to the experts as they are.

    Expert parallel swaps in `parallel.expert_parallel.ExpertParallelDispatch`, which sends each owner its
    rows and returns the results in the same sorted order."""

    all_local = True  # every expert here: `GroupedMLP` runs them at once as padded batched matmuls

    def dispatch(self, xs, counts: np.ndarray) -> tuple:
        """``(rows, [(local expert, row count), ...])`` in row order."""
        return xs, [(e, int(n)) for e, n in enumerate(counts)]

    def combine(self, ys):
        return ys


class GroupedMLP(nn.Cell):
    """Routed experts: ``weight1 [E, H, 2Fm]`` = [gate | up] halves, ``weight2 [E, Fm, H]``.

    The experts run are those of ``weight1`` (all of them, or this rank's block under expert parallel);
    ``dispatcher`` says where the rows of each expert are computed (`LocalExperts`: here, all experts at
    once; expert parallel: each owner loops over the rows it receives).
    """

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int, *, activation: str = "silu") -> None:
        super().__init__()
        self.e, self.f = num_experts, ffn_hidden_size
        self.act = gated_kernel(activation)  # silu(gate)·up, or gelu(gate)·up with hidden_act: gelu
        self.grouped = GroupedExpertsFn(self.act, ffn_hidden_size)
        self.combine = WeightedCombineFn()
        w1 = np.zeros((num_experts, hidden_size, 2 * ffn_hidden_size), np.float32)
        self.weight1 = Parameter(Tensor(w1), name="weight1")
        self.weight2 = Parameter(Tensor(np.zeros((num_experts, ffn_hidden_size, hidden_size), np.float32)),
                                 name="weight2")
        self.dispatcher = LocalExperts()

    def expert(self, e: int, x):
        gate, up = split_last(mint.matmul(x, self.weight1[e]), (self.f, self.f))  # (n, Fm) each
        return mint.matmul(self.act(gate, up), self.weight2[e])  # (n, H)

    def construct(self, x, probs, idx):
        """Dropless dispatch: ``x (T, H)``, ``probs/idx (T, K)`` → ``(T, H)`` and the per-expert counts."""
        t, k = idx.shape
        flat = idx.asnumpy().reshape(-1)  # host sort: `grouped.padded_layout_ops` in ops was 27× slower on CPU
        counts = np.bincount(flat, minlength=self.e)
        if self.dispatcher.all_local:
            return self._padded(x, probs, flat, k), counts
        order = np.argsort(flat, kind="stable")  # (T·K,) grouped by expert, token order kept
        token = Tensor((order // k).astype(np.int32))
        xs = ops.gather(x, token, 0)  # (T·K, H) sorted by expert
        rows, segments = self.dispatcher.dispatch(xs, counts)
        outs, start = [], 0
        for e, n in segments:
            if n:
                outs.append(self.expert(e, rows[start:start + n]))
            start += n
        ys = self.dispatcher.combine(mint.cat(outs, 0) if outs else rows)
        ys = ys * ops.gather(probs.reshape(-1), Tensor(order.astype(np.int32)), 0).reshape(-1, 1)
        return ops.unsorted_segment_sum(ys, token, t), counts

    def _padded(self, x, probs, flat: np.ndarray, k: int):
        """Every expert at once (`grouped.GroupedExpertsFn` on ``(E, n_max, H)``); padding slots weigh 0."""
        t, h = x.shape
        slot_pair, slot_token, _, n = padded_layout(flat, self.e, k)
        token = Tensor(slot_token.astype(np.int32))
        xs = ops.gather(x, token, 0).reshape(self.e, n, h)
        w = ops.gather(probs.reshape(-1), Tensor(np.maximum(slot_pair, 0).astype(np.int32)), 0)
        w = w * Tensor((slot_pair >= 0).astype(np.float32))
        return self.combine(self.grouped(xs, self.weight1, self.weight2)[0].reshape(-1, h), w.reshape(-1, 1), token, t)


class SharedExpertMLP(MLP):
    """Dense gated shared experts (SwiGLU, or GeGLU with ``hidden_act: gelu``), optionally gated by
    ``sigmoid(shared_experts_gate(x))``."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, *, gated: bool = False,
                 activation: str = "silu") -> None:
        super().__init__(hidden_size, ffn_hidden_size, activation=activation)
        self.shared_experts_gate = Linear(hidden_size, 1) if gated else None
        self._ffn = self.ffn  # compiled by `compile`

    def construct(self, x):
        return self._ffn(x)

    def ffn(self, x):
        y = MLP.construct(self, x)  # the plain MLP (not super(): it does not compile under jit)
        if self.shared_experts_gate is not None:
            y = y * mint.sigmoid(self.shared_experts_gate(x))
        return y

    def compile(self) -> None:
        """`ffn` under ``mindspore.jit`` (DeepSeek-V4's `hyper.HyperConnectionTransformerLayer.compile`): a dense
        SwiGLU, so nothing in it syncs with the host."""
        import mindspore as ms

        cell = self  # a plain function over the cell, as `csa.DeepseekV4Attention.compile_projections` does

        def ffn(x):
            return cell.ffn(x)

        self._ffn = ms.jit(ffn)


class MoELayer(nn.Cell):
    """``shared_experts(x) + Σ_k w_k·Expert_{idx_k}(x)``; returns (out, α-free aux loss or None, counts (E,))."""

    def __init__(self, hidden_size: int, *, num_experts: int, topk: int, ffn_hidden_size: int,
                 shared_ffn_hidden_size: int = 0, shared_gate: bool = False, score_function: str = "sigmoid",
                 n_group: int = 0, topk_group: int = 0, norm_topk_prob: bool = True, scaling_factor: float = 1.0,
                 enable_expert_bias: bool = False, aux_loss_type: str = "", aux_loss_coeff: float = 0.0,
                 activation: str = "silu") -> None:
        super().__init__()
        self.e, self.k = num_experts, topk
        self.aux_type = aux_loss_type if aux_loss_coeff > 0 else ""
        self.router = TopKRouter(hidden_size, num_experts, topk, score_function=score_function, n_group=n_group,
                                 topk_group=topk_group, norm_topk_prob=norm_topk_prob, scaling_factor=scaling_factor,
                                 global_aux=self.aux_type == "global_aux_loss")
        self.experts = GroupedMLP(num_experts, hidden_size, ffn_hidden_size, activation=activation)
        self.shared_experts = (SharedExpertMLP(hidden_size, shared_ffn_hidden_size, gated=shared_gate,
                                               activation=activation)
                               if shared_ffn_hidden_size else None)
        self.expert_bias = _buffer((num_experts,), "expert_bias") if enable_expert_bias else None
        self.tokens_per_expert = _buffer((num_experts,), "tokens_per_expert")
        self.tokens = LocalTokens()  # where the rest of each sequence is (sequence / context parallel)

    def route(self, flat, input_ids=None):
        """(probs ``(T, K)``, expert ids ``(T, K)``, scores ``(T, E)``); learned top-k here (hash routing: moe_v4)."""
        return self.router(flat, self.expert_bias)

    def construct(self, x, input_ids=None):
        b, s, h = x.shape
        flat = x.reshape(b * s, h)  # (T, H), tokens in (b, s) order
        probs, idx, scores = self.route(flat, input_ids)
        routed, counts = self.experts(flat, probs, idx)
        counts_t = Tensor(counts.astype(np.float32))
        ops.assign_add(self.tokens_per_expert, counts_t)
        out = routed.reshape(b, s, h)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        aux = aux_loss(scores, self.k, self.aux_type, b, self.router, self.tokens) if self.aux_type else None
        return out, aux, counts_t

    def update_expert_bias(self, counts: np.ndarray, rate: float) -> None:
        """``bias += γ·sign(mean(counts) − counts)`` then reset ``tokens_per_expert`` (reference §2.12)."""
        if self.expert_bias is not None:
            counts = np.asarray(counts, np.float32)
            step = rate * np.sign(counts.mean() - counts)
            self.expert_bias.set_data(Tensor(self.expert_bias.asnumpy() + step.astype(np.float32)))
        self.tokens_per_expert.set_data(Tensor(np.zeros((self.e,), np.float32)))
