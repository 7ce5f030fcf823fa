"""DeepSeek-V4 settings as MindSpore Transformers 2.1.0 accepts them: a ``qk_nope_head_dim`` that does not add up to
``v_head_dim`` (the dsv4_hybrid attention sets the query head to ``v_head_dim``: its unrotated lanes are
``v_head_dim − qk_rope_head_dim``, deepseek_v4_hybrid_attention.py), and ``hc_sinkhorn_iters: 0`` (the softmax and
one column normalisation, no rounds after it: hyper_connection.py ``SinkhornKnopp``; transformers' DeepseekV4 loops
``range(hc_sinkhorn_iters - 1)`` the same way)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.models import make_dsv4

pytestmark = pytest.mark.engine


def test_qk_nope_head_dim_is_not_read_the_head_is_v_head_dim_wide(rng):
    """The tiny widths (8 + 8 = 16) and a config whose qk_nope_head_dim says 56 build the same tensors and
    the same logits: the head is v_head_dim = 16 wide either way, as in the reference."""
    from mftk.config.model_base import NOTE
    from mftk.config.model_deepseek_v4 import check_deepseek_v4
    from mftk.engine import build_model, state_dict

    wide = make_dsv4(qk_nope_head_dim=56)
    found = []
    check_deepseek_v4(wide, found)
    notes = [p for p in found if p.path != "model.compress_ratios"]  # the tiny ratio 8: a note of its own
    assert [(p.path, p.severity) for p in notes] == [("model.qk_nope_head_dim", NOTE)]
    assert "v_head_dim = 16, whose first 8 lanes" in notes[0].message
    a, b = build_model(make_dsv4(), seed=2), build_model(wide, seed=2)
    sa, sb = state_dict(a), state_dict(b)
    assert {k: v.shape for k, v in sa.items()} == {k: v.shape for k, v in sb.items()}
    ids = rng.integers(1, 96, (1, 32))
    np.testing.assert_array_equal(a.logits(ids)[0].asnumpy(), b.logits(ids)[0].asnumpy())


def _sinkhorn64(logits: np.ndarray, iters: int, eps: float) -> np.ndarray:
    """The reference's SinkhornKnopp in float64: softmax over the last axis + ε, a column normalisation, then
    ``iters − 1`` (row, column) rounds, each ``x / (Σ x + ε)``."""
    z = np.exp(logits - logits.max(-1, keepdims=True))
    m = z / z.sum(-1, keepdims=True) + eps
    m = m / (m.sum(-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(-1, keepdims=True) + eps)
        m = m / (m.sum(-2, keepdims=True) + eps)
    return m


def test_zero_sinkhorn_iterations_is_one_column_normalisation(rng):
    import mindspore as ms
    from mindspore import Tensor

    from mftk.engine.layers.kernels_v4 import SinkhornFn

    logits = rng.normal(0, 2, (5, 4, 4))
    got0 = SinkhornFn(0, 1e-6)(Tensor(logits.astype(np.float32)))[0].asnumpy()
    got1 = SinkhornFn(1, 1e-6)(Tensor(logits.astype(np.float32)))[0].asnumpy()
    np.testing.assert_allclose(got0, _sinkhorn64(logits, 0, 1e-6), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got0, got1)
    assert np.abs(got0.sum(-2) - 1).max() < 1e-5 and np.abs(got0.sum(-1) - 1).max() > 1e-3  # columns only
    g = rng.normal(0, 1, logits.shape).astype(np.float32)  # and it differentiates (its own backward, 0 rounds)
    grad = ms.grad(lambda t: (SinkhornFn(0, 1e-6)(t)[0] * Tensor(g)).sum())(Tensor(logits.astype(np.float32)))
    eps = 1e-3
    d = rng.normal(0, 1, logits.shape)
    num = ((_sinkhorn64(logits + eps * d, 0, 1e-6) - _sinkhorn64(logits - eps * d, 0, 1e-6)) * g).sum() / (2 * eps)
    assert float((grad.asnumpy() * d).sum()) == pytest.approx(num, rel=1e-3)


def test_zero_sinkhorn_iterations_validates_with_a_note_and_runs():
    from mftk.config.model_deepseek_v4 import check_deepseek_v4
    from mftk.engine import build_model

    cfg = make_dsv4(mhc_sinkhorn_iterations=0)
    ps = []
    check_deepseek_v4(cfg, ps)
    assert [(p.path, p.severity) for p in ps if p.path != "model.compress_ratios"] == \
        [("model.mhc_sinkhorn_iterations", "note")]
    ids = np.arange(1, 33, dtype=np.int32)[None] % 96
    out = build_model(cfg, seed=0).forward({"input_ids": ids, "labels": np.roll(ids, -1, 1)})
    assert np.isfinite(out.loss)


@pytest.mark.parametrize("template,severity", [("deepseek_v3_tiny.yaml", "note"), ("qwen3_tiny.yaml", "error")])
def test_legacy_mla_variant_is_plain_mla_attention(template, severity):
    """The reference's layer builder reads ``experimental_attention_variant: mla`` as no variant when
    multi_latent_attention is on (DeepSeek-V3's own attention) and raises otherwise (gpt_layer_specs.py)."""
    import copy
    from pathlib import Path

    import yaml

    from mftk.config.load import load_data
    from mftk.errors import ConfigError

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "templates" / template).read_text())
    data["model"]["experimental_attention_variant"] = "mla"
    try:
        found = load_data(copy.deepcopy(data), check_files=False).notes
    except ConfigError as exc:
        found = exc.problems
    assert {p.path: p.severity for p in found}.get("model.experimental_attention_variant") == severity
