"""DeepSeek-V4's new parts on tiny shapes: each forward against a float64 NumPy transcription of its formula
(mindformers-2.1.md §5.4–§5.6 / transformers' modules), each gradient against central finite differences;
the indexer loss trains only the indexer; a tiny V4 overfits one batch."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.models import make_dsv4

from mindspore import Parameter, Tensor  # noqa: E402

pytestmark = pytest.mark.engine


def P(a, name):
    return Parameter(Tensor(np.asarray(a, np.float32)), name=name)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# ------------------------------------------------------------------------------------------------ kernels
def test_sink_attention_forward_and_gradients(rng, gradcheck):
    from mftk.engine.layers.kernels_v4 import MASKED, SinkAttentionFn

    b, m, sk, d = 2, 6, 5, 4
    q, kv = rng.normal(0, 1, (b, 1, m, d)), rng.normal(0, 1, (b, 1, sk, d))
    mask = rng.random((b, 1, m, sk)) < 0.3
    mask[..., 0] = False
    bias = Tensor(np.concatenate([np.where(mask, MASKED, 0.0), np.zeros((b, 1, m, 1))], -1).astype(np.float32))
    sink = rng.normal(0, 1, (b, 1, m, 1))
    fn = SinkAttentionFn(0.7)
    out = fn(Tensor(q.astype(np.float32)), Tensor(kv.astype(np.float32)), bias, Tensor(sink.astype(np.float32)))[0]
    s = np.where(mask, -np.inf, 0.7 * q @ kv.swapaxes(-1, -2))  # transformers: cat the sink column, softmax, drop it
    e = np.exp(np.concatenate([s, sink], -1) - np.concatenate([s, sink], -1).max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    assert np.abs(out.asnumpy() - p[..., :-1] @ kv).max() < 1e-5
    params = [P(x, n) for x, n in ((q, "q"), (kv, "kv"), (sink, "sink"))]
    w = Tensor(rng.normal(0, 1, (b, 1, m, d)).astype(np.float32))
    gradcheck(lambda: (fn(params[0], params[1], bias, params[2])[0] * w).sum(), params, rng)


def test_pair_rope_forward_and_gradient(rng, gradcheck):
    from mftk.engine.layers.kernels_v4 import PairRopeFn

    x = rng.normal(0, 1, (2, 3, 2, 6))
    ang = rng.uniform(0, 3, (1, 3, 1, 3)).repeat(2, -1)
    out = PairRopeFn(6)(Tensor(x.astype(np.float32)), Tensor(np.cos(ang).astype(np.float32)),
                        Tensor(np.sin(ang).astype(np.float32))).asnumpy()
    rot = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)  # (x0, x1) → (−x1, x0)
    assert np.abs(out - (x * np.cos(ang) + rot * np.sin(ang))).max() < 1e-5
    px = P(x, "x")
    cos, sin = Tensor(np.cos(ang).astype(np.float32)), Tensor(np.sin(ang).astype(np.float32))
    w = Tensor(rng.normal(0, 1, x.shape).astype(np.float32))
    gradcheck(lambda: (PairRopeFn(6)(px, cos, sin) * w).sum(), [px], rng)


def test_clamped_swiglu_forward_and_gradient(rng, gradcheck):
    from mftk.engine.layers.kernels_v4 import ClampedSiluMulFn

    g = rng.normal(0, 1.5, (4, 8))
    u = rng.normal(0, 1.5, (4, 8))
    g[np.abs(g - 1.0) < 0.05] += 0.2  # keep finite differences away from the kink
    u[np.abs(np.abs(u) - 1.0) < 0.05] += 0.2
    out = ClampedSiluMulFn(1.0)(Tensor(g.astype(np.float32)), Tensor(u.astype(np.float32))).asnumpy()
    gc = np.minimum(g, 1.0)
    assert np.abs(out - gc * _sigmoid(gc) * np.clip(u, -1, 1)).max() < 1e-5
    assert (g > 1).any() and (np.abs(u) > 1).any()
    pg, pu = P(g, "g"), P(u, "u")
    gradcheck(lambda: (ClampedSiluMulFn(1.0)(pg, pu) ** 2).sum(), [pg, pu], rng)


# ------------------------------------------------------------------------------------------------ mHC
def _np_hyper(x, w, bias, alphas, n, iters, eps, rms_eps):
    """transformers' DeepseekV4HyperConnection in float64: (collapsed, post, comb)."""
    b, s = x.shape[:2]
    flat = x.reshape(b, s, -1)
    flat = flat / np.sqrt((flat ** 2).mean(-1, keepdims=True) + rms_eps)
    mix = flat @ w.T
    pre = _sigmoid(mix[..., :n] * alphas[0] + bias[:n]) + eps
    post = 2 * _sigmoid(mix[..., n:2 * n] * alphas[1] + bias[n:2 * n])
    c = (mix[..., 2 * n:] * alphas[2] + bias[2 * n:]).reshape(b, s, n, n)
    c = np.exp(c - c.max(-1, keepdims=True))
    c = c / c.sum(-1, keepdims=True) + eps
    c = c / (c.sum(-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdims=True) + eps)
        c = c / (c.sum(-2, keepdims=True) + eps)
    return (pre[..., None] * x).sum(2), post, c


def test_hyper_connection_forward_merge_and_gradients(rng, gradcheck):
    from mftk.engine.layers.hyper import HyperConnection

    n, h = 3, 4
    hc = HyperConnection(h, n, sinkhorn_iters=5, hc_eps=1e-6, rms_eps=1e-6)
    w, bias, alphas = rng.normal(0, 0.5, ((2 + n) * n, n * h)), rng.normal(0, 0.5, ((2 + n) * n,)), rng.normal(1, .3, 3)
    hc.mapping_proj.weight.set_data(Tensor(w.astype(np.float32)))
    hc.mapping_proj.bias.set_data(Tensor(bias.astype(np.float32)))
    for p, a in zip((hc.alpha_pre, hc.alpha_post, hc.alpha_res), alphas):
        p.set_data(Tensor(np.array([a], np.float32)))
    x = rng.normal(0, 1, (2, 3, n, h))
    collapsed, post, comb = hc(Tensor(x.astype(np.float32)))
    ref_c, ref_post, ref_comb = _np_hyper(x, w, bias, alphas, n, 5, 1e-6, 1e-6)
    assert np.abs(collapsed.asnumpy() - ref_c).max() < 1e-5
    assert np.abs(comb.asnumpy().reshape(ref_comb.shape) - ref_comb).max() < 1e-5
    assert np.abs(ref_comb.sum(-2) - 1).max() < 1e-5  # doubly stochastic
    out = rng.normal(0, 1, (2, 3, h))
    merged = HyperConnection.merge(Tensor(x.astype(np.float32)), post, comb, Tensor(out.astype(np.float32))).asnumpy()
    ref_m = np.einsum("bsjk,bsjh->bskh", ref_comb, x) + ref_post[..., None] * out[:, :, None, :]
    assert np.abs(merged - ref_m).max() < 1e-5
    px = P(x, "x")
    params = [px, hc.mapping_proj.weight, hc.mapping_proj.bias, hc.alpha_pre, hc.alpha_post, hc.alpha_res]
    wt = Tensor(rng.normal(0, 1, (2, 3, n, h)).astype(np.float32))

    def f():
        c, po, co = hc(px)
        return (HyperConnection.merge(px, po, co, c) * wt).sum()

    gradcheck(f, params, rng)


def test_hyper_head_forward_and_gradients(rng, gradcheck):
    from mftk.engine.layers.hyper import HyperHead

    n, h = 3, 4
    head = HyperHead(h, n, hc_eps=1e-6, rms_eps=1e-6)
    fn, base, scale = rng.normal(0, 0.5, (n, n * h)), rng.normal(0, 0.5, n), rng.normal(1, 0.2, 1)
    for p, a in ((head.hc_fn.weight, fn), (head.hc_base, base), (head.hc_scale, scale)):
        p.set_data(Tensor(a.astype(np.float32)))
    x = rng.normal(0, 1, (2, 3, n, h))
    flat = x.reshape(2, 3, -1)
    pre = _sigmoid((flat / np.sqrt((flat ** 2).mean(-1, keepdims=True) + 1e-6)) @ fn.T * scale + base) + 1e-6
    assert np.abs(head(Tensor(x.astype(np.float32))).asnumpy() - (pre[..., None] * x).sum(2)).max() < 1e-5
    px = P(x, "x")
    gradcheck(lambda: (head(px) ** 2).sum(), [px, head.hc_fn.weight, head.hc_base, head.hc_scale], rng)


# ------------------------------------------------------------------------------------------------ attention
def _np_compress(x, wkv, wgate, ape, norm_w, ratio, overlap, d, eps):
    """transformers' compressor (no cache), before RoPE, in float64: ``(B, n, d)``."""
    b, s, _ = x.shape
    n = s // ratio
    kv = (x[:, :n * ratio] @ wkv.T).reshape(b, n, ratio, -1)
    g = (x[:, :n * ratio] @ wgate.T).reshape(b, n, ratio, -1) + ape
    if overlap:
        nk, ng = np.zeros((b, n, 2 * ratio, d)), np.full((b, n, 2 * ratio, d), -np.inf)
        nk[:, :, ratio:], ng[:, :, ratio:] = kv[..., d:], g[..., d:]
        nk[:, 1:, :ratio], ng[:, 1:, :ratio] = kv[:, :-1, :, :d], g[:, :-1, :, :d]
        kv, g = nk, ng
    w = np.exp(g - g.max(2, keepdims=True))
    w = w / w.sum(2, keepdims=True)
    pooled = (kv * w).sum(2)
    return pooled / np.sqrt((pooled ** 2).mean(-1, keepdims=True) + eps) * norm_w


@pytest.mark.parametrize("ratio,overlap", [(4, True), (3, False)])
def test_compressor_forward_and_gradients(rng, gradcheck, ratio, overlap):
    from mftk.engine.layers.csa import Compressor
    from mftk.engine.layers.rope_pairs import PairRotaryTable

    h, d = 6, 4
    c = Compressor(h, d, ratio, 2, 1e-6, overlap=overlap)
    for p in (c.linear_wkv.weight, c.linear_wgate.weight, c.ape, c.norm.weight):
        p.set_data(Tensor(rng.normal(0, 0.5, p.shape).astype(np.float32)))
    table = PairRotaryTable(np.zeros(1))  # zero angles: RoPE is the identity, the pooling is what is checked
    x = rng.normal(0, 1, (2, 4 * ratio + 1, h))
    got = c(Tensor(x.astype(np.float32)), table).asnumpy()
    ref = _np_compress(x, *(p.asnumpy().astype(np.float64) for p in (c.linear_wkv.weight, c.linear_wgate.weight, c.ape,
                                                                     c.norm.weight)), ratio, overlap, d, 1e-6)
    assert got.shape == (2, 4, d) and np.abs(got - ref).max() < 1e-5
    px = P(x, "x")
    wt = Tensor(rng.normal(0, 1, got.shape).astype(np.float32))
    table = PairRotaryTable(np.array([0.3]))
    gradcheck(lambda: (c(px, table) * wt).sum(), [px, c.linear_wkv.weight, c.linear_wgate.weight, c.ape], rng)


@pytest.mark.parametrize("s,window", [(512, 128), (32, 6), (24, 6), (64, 16), (40, 3), (30, 30), (7, 4)])
def test_local_blocks_cover_every_window_key(s, window):
    """Each block's key span holds every key its queries may see (``p − window < k ≤ p``), fewer than S."""
    from mftk.engine.layers.csa import local_blocks

    blocks = local_blocks(s, window)
    if blocks is None:  # no block of >= window - 1 queries divides S with fewer than S keys
        assert (s, window) in {(30, 30), (7, 4)}
        return
    c, m = blocks
    assert s % c == 0 and (m + 1) * c < s
    p = np.arange(s)
    first_key = (p // c - m) * c  # the span of query p's block: [(i − m)·c, (i + 1)·c)
    assert np.all(first_key <= p - window + 1) and np.all((p // c + 1) * c > p)
    if s >= 128:
        assert (m + 1) * c <= 2 * window  # on real shapes the span is near the window, not S


def _attention(cfg, layer_id):
    from mftk.engine.models.deepseek_v4.spec import _attention as spec

    return spec(cfg, layer_id).build()


def _init(cell, rng, std=0.3):
    for p in cell.trainable_params():
        p.set_data(Tensor((rng.normal(0, std, p.shape) + (1.0 if "norm" in p.name else 0.0)).astype(np.float32)))


@pytest.mark.parametrize("layer_id", [0, 1, 2], ids=["sliding", "csa", "hca"])
def test_attention_gradients(rng, gradcheck, layer_id):
    """The whole ``self_attention`` (Q/KV paths, RoPE, compressor, sink attention, inverse RoPE, grouped out)."""
    from mftk.engine.layers.attention import causal_mask

    cfg = make_dsv4()
    att = _attention(cfg, layer_id)
    _init(att, rng)
    att.set_train(False)  # no indexer loss here: this checks the attention output's gradients
    rope = __import__("mftk.engine.models.deepseek_v4.spec", fromlist=["x"]).deepseek_v4_spec(cfg).rope()(24)
    x = P(rng.normal(0, 1, (2, 24, cfg.hidden_size)), "x")
    wt = Tensor(rng.normal(0, 1, (2, 24, cfg.hidden_size)).astype(np.float32))
    params = [x] + [p for p in att.trainable_params() if "indexer" not in p.name]
    gradcheck(lambda: (att(x, rope, causal_mask(24)) * wt).sum(), params, rng)


def test_indexer_loss_trains_only_the_indexer_and_matches_finite_differences(rng, gradcheck):
    import mindspore as ms
    from mftk.engine.layers.attention import causal_mask
    from mftk.engine.models.deepseek_v4.spec import deepseek_v4_spec

    cfg = make_dsv4()
    att = _attention(cfg, 1)  # CSA
    _init(att, rng)
    att.set_train(True)
    rope = deepseek_v4_spec(cfg).rope()(24)
    x = Tensor(rng.normal(0, 1, (2, 24, cfg.hidden_size)).astype(np.float32))

    def loss():
        att(x, rope, causal_mask(24))
        return att.core_attention.indexer_loss

    assert float(loss().asnumpy()) > 0
    params = list(att.trainable_params())
    grads = dict(zip((p.name for p in params), ms.grad(loss, None, params)()))
    for name, g in grads.items():
        nonzero = float(np.abs(g.asnumpy()).max()) > 0
        assert nonzero == ("indexer" in name), name  # detached inputs: the loss reaches the indexer only
    # a small step: a larger one moves some index scores across the top-k boundary (the loss jumps there)
    gradcheck(loss, [p for p in params if "indexer" in p.name], rng, eps=1e-4)


# ------------------------------------------------------------------------------------------------ MoE
def test_hash_routed_moe_forward_and_gradients(rng, gradcheck):
    from mftk.engine.models.deepseek_v4.spec import _moe

    cfg = make_dsv4()
    moe = _moe(cfg, hash_routing=True).build()
    _init(moe, rng, 0.4)
    tid = np.stack([rng.permutation(4)[:2] for _ in range(cfg.vocab_size)]).astype(np.int32)
    moe.router.tid2eid.set_data(Tensor(tid))
    x = rng.normal(0, 1, (2, 5, cfg.hidden_size))
    ids = rng.integers(0, cfg.vocab_size, (2, 5))
    out, _, counts = moe(Tensor(x.astype(np.float32)), Tensor(ids.astype(np.int32)))
    # float64 transcription: experts from the table, sqrt(softplus) weights renormalised × 1.5, clamped SwiGLU
    flat, sel = x.reshape(-1, cfg.hidden_size), tid[ids.reshape(-1)]
    sc = np.sqrt(np.log1p(np.exp(flat @ moe.router.weight.asnumpy().T)))
    w = np.take_along_axis(sc, sel, 1)
    w = w / w.sum(-1, keepdims=True) * 1.5
    w1, w2, L, f = moe.experts.weight1.asnumpy(), moe.experts.weight2.asnumpy(), 0.5, cfg.moe_intermediate_size

    def swiglu(a):
        g, u = np.minimum(a[..., :f], L), np.clip(a[..., f:], -L, L)
        return g * _sigmoid(g) * u

    routed = np.stack([sum(w[t, j] * swiglu(flat[t] @ w1[sel[t, j]]) @ w2[sel[t, j]] for j in range(2))
                       for t in range(len(flat))])
    fc1 = moe.shared_experts.linear_fc1.weight.asnumpy()
    hs = flat @ fc1.T
    g, u = np.minimum(hs[:, 0::2], L), np.clip(hs[:, 1::2], -L, L)
    shared = (g * _sigmoid(g) * u) @ moe.shared_experts.linear_fc2.weight.asnumpy().T
    assert np.abs(out.asnumpy().reshape(-1, cfg.hidden_size) - (routed + shared)).max() < 1e-5
    assert counts.asnumpy().tolist() == np.bincount(sel.reshape(-1), minlength=4).tolist()
    px = P(x, "x")
    ids_t = Tensor(ids.astype(np.int32))
    # a small step: the clamp's kinks (L = 0.5 is crossed by many lanes) bend larger differences
    gradcheck(lambda: (moe(px, ids_t)[0] ** 2).sum(), [px, moe.router.weight, moe.experts.weight1,
                                                        moe.experts.weight2], rng, eps=1e-4)


# ------------------------------------------------------------------------------------------------ the model
def test_model_objective_gradients(rng, gradcheck, tiny_dsv4):
    """The whole objective (main + MTP losses) through every part. Routers and indexer scores are zeroed so
    the expert and top-k choices are ties broken by index, which no step of the check can flip."""
    from mftk.engine import build_model

    cfg = tiny_dsv4(activation_func_clamp_value=3.0)
    model = build_model(cfg, seed=7)
    for p in model.trainable_params():
        if p.name.endswith(("router.weight", "indexer.linear_weights_proj.weight")):
            p.set_data(Tensor(np.zeros(p.shape, np.float32)))
        elif p.name.endswith("hc_scale"):
            p.set_data(Tensor(np.ones(p.shape, np.float32)))  # the reference's init (0) would stop hc_fn's gradient
    ids = rng.integers(1, cfg.vocab_size, (1, 24))
    labels = np.roll(ids, -1, 1)
    names = ("decoder.layers.1.attn_hc.mapping_proj.weight", "decoder.layers.2.ffn_hc.alpha_res",
             "decoder.hc_head.hc_fn.weight", "decoder.layers.2.self_attention.core_attention.attn_sink",
             "mtp.layers.0.eh_proj.weight", "decoder.layers.1.self_attention.core_attention.compressor.ape",
             "decoder.layers.0.mlp.experts.weight1", "mtp.layers.0.hc_head.hc_base",
             "decoder.layers.1.self_attention.linear_o_group_proj")
    params = [p for p in model.trainable_params() if p.name in names]
    assert len(params) == len(names)
    model.set_train(False)  # the indexer loss is checked on its own above
    gradcheck(lambda: model(Tensor(ids.astype(np.int32)), Tensor(labels.astype(np.int32)))[0], params, rng)


@pytest.mark.slow
def test_tiny_deepseek_v4_overfits_one_batch(rng, tiny_dsv4):
    import mindspore as ms
    from mftk.engine import build_model
    from mftk.engine.optim import AdamW, decide_weight_decay

    cfg = tiny_dsv4(initializer_range=0.02)
    model = build_model(cfg, seed=8)
    params = list(model.trainable_params())
    opt = AdamW([p.name for p in params], [p.asnumpy() for p in params],
                decide_weight_decay([(p.name, tuple(p.shape)) for p in params], 0.0), betas=(0.9, 0.95))
    grad_fn = ms.value_and_grad(model, None, params, has_aux=True)
    ids = rng.integers(1, cfg.vocab_size, (2, 32))
    batch = (Tensor(ids.astype(np.int32)), Tensor(np.roll(ids, -1, 1).astype(np.int32)))
    losses = []
    for _ in range(40):
        out, grads = grad_fn(*batch)
        losses.append(float(out[1].asnumpy()))
        flat = opt.grad_buffer()
        opt.put_grads(flat, [g.asnumpy() for g in grads])
        opt.step(flat, 1e-2)
        for p, m in zip(params, opt.masters()):
            p.set_data(Tensor(m))
    assert losses[0] > 4.0 and losses[-1] < 0.5, losses[::5]
