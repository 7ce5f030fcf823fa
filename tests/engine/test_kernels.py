"""The hand-written backward kernels against MindSpore's own autodiff of the plain formula (an
independent reference: same math, no custom bprop), eagerly and compiled with ``ms.jit`` as
`GPTModel.jit_blocks` runs them; plus finite differences for the fused LM-head loss."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, mint, ops

from mftk.engine.layers.kernels import (CoreAttentionFn, GeluFn, GeluMulFn, HeadCrossEntropyFn, RMSNormFn, RopeFn,
                                       SiluFn, SiluMulFn)
from mftk.engine.layers.loss import masked_mean_ce
from mftk.engine.models.gpt import loss_weights


pytestmark = pytest.mark.engine


def _plain_rmsnorm(x, w):
    return x * mint.rsqrt(mint.mean(x * x, -1, keepdim=True) + 1e-6) * w


def _plain_rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + mint.cat((-x[..., h:], x[..., :h]), -1) * sin


def _plain_core(q, k, v, mask):
    s = ops.matmul(q, ops.swapaxes(k, -1, -2)) * 0.35
    return ops.matmul(ops.softmax(mint.where(mask, -1e9, s), -1), v)


def _plain_silu_mul(g, u):
    return g * mint.sigmoid(g) * u


def _plain_gelu(x):
    """The exact GELU ``x·Φ(x)``, ``Φ(x) = (1 + erf(x/√2))/2`` (Hendrycks & Gimpel 2016, eq. 1)."""
    return 0.5 * x * (1.0 + ops.erf(x * 0.7071067811865476))


def _mask(rng, shape, full_row: bool) -> np.ndarray:
    m = np.triu(np.ones(shape[-2:], bool), 1) | (rng.random(shape[-2:]) < 0.2)
    np.fill_diagonal(m, False)
    if full_row:
        m[0] = True  # a fully masked row: uniform probabilities, no gradient
    return np.ascontiguousarray(np.broadcast_to(m, shape))


def _cases(rng):
    r = lambda *s: Tensor(rng.normal(0, 1, s).astype(np.float32))  # noqa: E731
    table = Tensor(rng.normal(0, 1, (1, 5, 1, 6)).astype(np.float32))
    return {
        "rmsnorm": (RMSNormFn(1e-6), lambda x, w: _plain_rmsnorm(x, w), (r(2, 5, 8), r(8)), 2),
        "rope": (RopeFn(), _plain_rope, (r(2, 5, 3, 6), table, table * 0.5), 1),
        "core": (CoreAttentionFn(0.35), _plain_core,
                 (r(2, 3, 6, 4), r(2, 3, 6, 4), r(2, 3, 6, 5), Tensor(_mask(rng, (2, 3, 6, 6), True))), 3),
        "silu_mul": (SiluMulFn(), _plain_silu_mul, (r(4, 7), r(4, 7)), 2),
        "gelu_mul": (GeluMulFn(), lambda g, u: _plain_gelu(g) * u, (r(4, 7) * 2, r(4, 7)), 2),
        "gelu": (GeluFn(), _plain_gelu, (r(4, 7) * 2,), 1),
        "silu": (SiluFn(), lambda x: x * mint.sigmoid(x), (r(4, 7) * 2,), 1),
    }


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", ["rmsnorm", "rope", "core", "silu_mul", "gelu_mul", "gelu", "silu"])
def test_kernel_equals_autodiff_of_the_plain_formula(rng, name, compiled):
    kernel, plain, args, n_grad = _cases(rng)[name]

    def first(*a):  # the core returns (out, probs)
        out = kernel(*a)
        return out[0] if name == "core" else out

    weight = Tensor(rng.normal(0, 1, plain(*args).shape).astype(np.float32))

    def loss_kernel(*a):
        return (first(*a) * weight).sum()

    def loss_plain(*a):
        return (plain(*a) * weight).sum()

    fn = ms.jit(loss_kernel) if compiled else loss_kernel
    positions = tuple(range(n_grad))
    got_val, got = ms.value_and_grad(fn, positions)(*args)
    want_val, want = ms.value_and_grad(loss_plain, positions)(*args)
    got, want = (g if isinstance(g, tuple) else (g,) for g in (got, want))
    assert float(got_val.asnumpy()) == pytest.approx(float(want_val.asnumpy()), rel=1e-5, abs=1e-5)
    np.testing.assert_allclose(first(*args).asnumpy(), plain(*args).asnumpy(), rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-5)


def test_core_attention_fully_masked_row_is_uniform_and_gets_no_gradient(rng):
    q = Tensor(rng.normal(0, 1, (1, 1, 4, 3)).astype(np.float32))
    v = Tensor(rng.normal(0, 1, (1, 1, 4, 3)).astype(np.float32))
    mask = np.triu(np.ones((4, 4), bool), 1)
    mask[2] = True
    out, probs = CoreAttentionFn(1.0)(q, q, v, Tensor(mask[None, None]))
    np.testing.assert_allclose(probs.asnumpy()[0, 0, 2], np.full(4, 0.25), atol=1e-7)
    np.testing.assert_allclose(out.asnumpy()[0, 0, 2], v.asnumpy()[0, 0].mean(0), atol=1e-6)
    sel = np.zeros((1, 1, 4, 3), np.float32)
    sel[0, 0, 2] = 1.0  # only the masked row's output
    dq = ms.grad(lambda a: (CoreAttentionFn(1.0)(a, q, v, Tensor(mask[None, None]))[0] * Tensor(sel)).sum())(q)
    assert not dq.asnumpy().any()


def _head_case(rng, n=10, h=6, v=9):
    hid = rng.normal(0, 1, (n, h)).astype(np.float32)
    weight = rng.normal(0, 0.5, (v, h)).astype(np.float32)
    labels = rng.integers(0, v, n).astype(np.int32)
    labels[:3] = 4  # repeated labels: their weight-gradient rows must add up
    labels[5] = -100
    mask = (rng.random(n) > 0.2).astype(np.float32)
    return hid, weight, labels, mask


def test_fused_head_loss_equals_masked_mean_ce_of_the_logits(rng):
    hid, weight, labels, mask = _head_case(rng)
    w = Tensor(loss_weights(mask, labels))
    safe = Tensor(np.maximum(labels, 0))
    fused = HeadCrossEntropyFn()

    def via_kernel(h, wt):
        return fused(h, wt, safe, w)[0]

    def via_logits(h, wt):
        return masked_mean_ce(ops.matmul(h, wt.T), Tensor(labels), Tensor(mask))

    z = hid @ weight.T
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    m = mask * (labels != -100)
    ref = float(((lse - z[np.arange(len(z)), np.maximum(labels, 0)]) * m).sum() / m.sum())
    args = (Tensor(hid), Tensor(weight))
    (lk, gk), (lp, gp) = (ms.value_and_grad(f, (0, 1))(*args) for f in (via_kernel, via_logits))
    assert float(lk.asnumpy()) == pytest.approx(ref, rel=1e-5)
    assert float(lp.asnumpy()) == pytest.approx(ref, rel=1e-5)
    for a, b in zip(gk, gp):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-4, atol=1e-6)


def test_fused_head_loss_gradient_matches_finite_differences(rng, gradcheck):
    hid, weight, labels, mask = _head_case(rng)
    hp, wp = ms.Parameter(Tensor(hid), name="h"), ms.Parameter(Tensor(weight), name="w")
    fused, w, safe = HeadCrossEntropyFn(), Tensor(loss_weights(mask, labels)), Tensor(np.maximum(labels, 0))
    gradcheck(lambda: fused(hp, wp, safe, w)[0], [hp, wp], rng)


def test_fused_head_loss_is_exact_where_the_label_probability_underflows():
    """A label logit 150 below the row's best: P[y] is 0 in float32, so −log P[y] would be inf; the
    kernel must give the exact logsumexp(z) − z[y] (float64 reference). A weight-0 token with the
    same underflow adds exactly 0 (not inf·0 = NaN)."""
    v, hdim = 6, 3
    hid = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]], np.float32)
    weight = np.zeros((v, hdim), np.float32)
    weight[0, 0], weight[1, 1], weight[2, 2] = 150.0, 150.0, 0.5
    labels = np.array([3, 4, 2, 5], np.int32)  # rows 0, 1: label logit 0 vs best 150 -> P[y] = exp(-150) = 0
    wts = np.array([0.25, 0.0, 0.5, 0.25], np.float32)  # row 1 (underflowing) has weight 0
    z = hid.astype(np.float64) @ weight.T.astype(np.float64)
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    ce = lse - z[np.arange(4), labels]
    assert ce[0] > 140  # the case really underflows in float32
    loss, p = HeadCrossEntropyFn()(Tensor(hid), Tensor(weight), Tensor(labels), Tensor(wts))
    assert float(p.asnumpy()[0, 3]) == 0.0
    assert float(loss.asnumpy()) == pytest.approx(float((ce * wts).sum()), rel=1e-6)


def test_loss_weights_are_the_masked_mean_and_nan_without_targets():
    w = loss_weights(np.array([[1, 1, 0, 1]], np.float32), np.array([[3, -100, 2, 1]]))
    np.testing.assert_allclose(w, [[0.5, 0.0, 0.0, 0.5]])
    assert np.isnan(loss_weights(np.zeros((1, 3), np.float32), np.ones((1, 3)), eps=0.0)).all()


@pytest.mark.parametrize("tied", [True, False])
def test_model_head_loss_equals_plain_head_and_ce(rng, tiny_qwen3, tied):
    from mftk.engine import build_model

    model = build_model(tiny_qwen3(tie_word_embeddings=tied), seed=0)
    vocab = model.spec.vocab_size
    h = Tensor(rng.normal(0, 1, (2, 5, model.spec.hidden_size)).astype(np.float32))
    labels = rng.integers(0, vocab, (2, 5)).astype(np.int32)
    labels[0, 1] = -100
    mask = np.ones((2, 5), np.float32)
    from mftk.engine.models.gpt import Targets

    target = Targets(ids=None, labels=Tensor(np.maximum(labels, 0).reshape(-1)),
                     weights=Tensor(loss_weights(mask, labels).reshape(-1)))
    got = float(model.head_loss(h, target).asnumpy())
    want = float(masked_mean_ce(model.lm_head(h), Tensor(labels), Tensor(mask)).asnumpy())
    assert got == pytest.approx(want, rel=1e-5)


def test_kernel_registry_falls_back_to_the_cpu_reference_and_takes_one_registration(monkeypatch):
    from mftk.engine.layers import kernels, registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert registry.kernel("rms_norm", "CPU") is kernels.RMSNormFn
    assert registry.kernel("rms_norm", "Ascend") is kernels.RMSNormFn  # no Ascend entry: the reference kernel

    class Fused:
        def __init__(self, eps):
            self.eps = eps

    registry.register("rms_norm", "Ascend", Fused)
    assert registry.kernel("rms_norm", "Ascend") is Fused and registry.kernel("rms_norm", "CPU") is kernels.RMSNormFn
    monkeypatch.setattr(registry, "current_device", lambda: "Ascend")
    from mftk.engine.layers.norm import RMSNorm

    assert isinstance(RMSNorm(8).fn, Fused)  # the layer asks the registry, never names a device
    with pytest.raises(KeyError, match="unknown kernel"):
        registry.register("flash", "Ascend", Fused)


@pytest.mark.parametrize("iters", [0, 1, 20])
def test_sinkhorn_host_kernel_matches_ops_autodiff(rng, iters):
    """`SinkhornFn` (NumPy forward and hand-written backward, what the model runs) against `sinkhorn_ops`, the
    plain loop in MindSpore ops differentiated by MindSpore (bench/host_roundtrips.py ``sinkhorn``)."""
    from mftk.engine.layers.kernels_v4 import SinkhornFn, sinkhorn_ops

    logits = Tensor(rng.normal(0, 2, (48, 4, 4)).astype(np.float32))
    g = Tensor(rng.normal(0, 1, (48, 4, 4)).astype(np.float32))
    fn = SinkhornFn(iters, 1e-6)
    want = sinkhorn_ops(logits, iters, 1e-6).asnumpy()
    np.testing.assert_allclose(fn(logits)[0].asnumpy(), want, rtol=0, atol=1e-6)
    got = ms.grad(lambda t: (fn(t)[0] * g).sum())(logits).asnumpy()
    ref = ms.grad(lambda t: (sinkhorn_ops(t, iters, 1e-6) * g).sum())(logits).asnumpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
