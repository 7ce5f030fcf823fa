"""Parts against hand references and finite differences (tiny shapes, fp32)."""
from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from mftk.engine.layers.attention import SelfAttention, causal_mask, core_attention
from mftk.engine.layers.loss import masked_mean_ce
from mftk.engine.layers.mla import MLASelfAttention
from mftk.engine.layers.mlp import MLP, swiglu_interleaved
from mftk.engine.layers.norm import RMSNorm
from mftk.engine.layers.rope import (apply_rope, deinterleave, rotary_table, yarn_correction_range,
                                     yarn_get_mscale, yarn_inv_freq)


pytestmark = pytest.mark.engine


def _randomize(cell, rng, std=0.3):
    for p in cell.get_parameters():
        p.set_data(Tensor(rng.normal(0, std, p.shape).astype(np.float32)))


def test_rmsnorm_matches_formula_and_gradient(rng, gradcheck):
    norm = RMSNorm(8, eps=1e-6)
    _randomize(norm, rng)
    x = rng.normal(0, 1, (3, 8)).astype(np.float32)
    ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * norm.weight.asnumpy()
    assert np.allclose(norm(Tensor(x)).asnumpy(), ref, atol=1e-5)
    xp = ms.Parameter(Tensor(x), name="x")
    gradcheck(lambda: (norm(xp) ** 2 * Tensor(np.arange(8, dtype=np.float32))).sum(),
                      [xp, norm.weight], rng)


def test_yarn_range_matches_reference_examples():
    assert yarn_correction_range(64, 10000, 163840) == (23, 36)  # models.md §2.4, example YAML
    assert yarn_correction_range(64, 10000, 4096) == (10, 23)  # HF DeepSeek-V3
    inv = yarn_inv_freq(64, 10000, 40.0, 4096)
    base = 1.0 / 10000 ** (np.arange(0, 64, 2) / 64)
    assert np.allclose(inv[:10], base[:10]) and np.allclose(inv[23:], base[23:] / 40.0)
    assert yarn_get_mscale(40.0, 1.0) == pytest.approx(0.1 * math.log(40) + 1)


def test_rope_rotates_pairs_by_position_angle():
    table = rotary_table(4, 10000.0)
    cos, sin = table(3)
    x = np.zeros((1, 3, 1, 4), np.float32)
    x[..., 0] = 1.0  # unit vector in the first rotated pair (lanes 0 and 2 in NeoX layout)
    out = apply_rope(Tensor(x), cos, sin).asnumpy()[0, :, 0]
    pos = np.arange(3)
    assert np.allclose(out[:, 0], np.cos(pos), atol=1e-6) and np.allclose(out[:, 2], np.sin(pos), atol=1e-6)
    assert np.allclose(deinterleave(Tensor(np.arange(6, dtype=np.float32).reshape(1, 6))).asnumpy(),
                       [[0, 2, 4, 1, 3, 5]])


def test_core_attention_matches_numpy_gqa(rng):
    b, nh, ng, s, d = 2, 4, 2, 5, 3
    q, k, v = (rng.normal(0, 1, shp).astype(np.float32) for shp in ((b, nh, s, d), (b, ng, s, d), (b, ng, s, d)))
    out = core_attention(Tensor(q), Tensor(k), Tensor(v), causal_mask(s), 0.5).asnumpy()
    kk, vv = np.repeat(k, nh // ng, 1), np.repeat(v, nh // ng, 1)  # query head h ↔ kv head h // r
    sc = q @ kk.transpose(0, 1, 3, 2) * 0.5 + np.triu(np.full((s, s), -np.inf), 1)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ vv
    assert np.allclose(out, ref.transpose(0, 2, 1, 3).reshape(b, s, nh * d), atol=1e-5)


def test_fully_masked_row_is_finite():
    s = 3
    mask = Tensor(np.ones((1, 1, s, s), bool))
    q = Tensor(np.ones((1, 1, s, 2), np.float32))
    assert np.isfinite(core_attention(q, q, q, mask, 1.0).asnumpy()).all()


def test_swiglu_uses_interleaved_rows():
    h = np.array([[1.0, 2.0, -1.0, 3.0]], np.float32)  # gate0, up0, gate1, up1
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    assert np.allclose(swiglu_interleaved(Tensor(h)).asnumpy(), [[silu(1.0) * 2.0, silu(-1.0) * 3.0]], atol=1e-6)


def _rope_and_mask(dim, s):
    return rotary_table(dim, 10000.0)(s), causal_mask(s)


@pytest.mark.parametrize("part", ["attention", "mla", "mlp"])
def test_gradients_of_parts_match_finite_differences(rng, part, gradcheck):
    s, h = 4, 8
    if part == "attention":
        cell = SelfAttention(h, 4, 2, 4)
        args = _rope_and_mask(4, s)
    elif part == "mla":
        cell = MLASelfAttention(h, 2, q_lora_rank=6, kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=4,
                                v_head_dim=3, softmax_scale=0.4)
        args = _rope_and_mask(4, s)
    else:
        cell, args = MLP(h, 6), ()
    _randomize(cell, rng)
    x = ms.Parameter(Tensor(rng.normal(0, 1, (2, s, h)).astype(np.float32)), name="x")
    w = Tensor(rng.normal(0, 1, (2, s, h)).astype(np.float32))
    gradcheck(lambda: (cell(x, *args) * w).sum(), [x, *cell.trainable_params()], rng)


def test_masked_mean_ce_matches_numpy_and_gradient(rng, gradcheck):
    z = rng.normal(0, 1, (6, 5)).astype(np.float32)
    labels = np.array([0, 4, -100, 2, 1, 3], np.int32)
    mask = np.array([1, 1, 1, 0, 1, 1], np.float32)
    lse = np.log(np.exp(z).sum(-1))
    m = mask * (labels != -100)
    ref = ((lse - z[np.arange(6), np.maximum(labels, 0)]) * m).sum() / m.sum()
    assert float(masked_mean_ce(Tensor(z), Tensor(labels), Tensor(mask)).asnumpy()) == pytest.approx(ref, rel=1e-5)
    zp = ms.Parameter(Tensor(z), name="z")
    gradcheck(lambda: masked_mean_ce(zp, Tensor(labels), Tensor(mask)), [zp], rng)
