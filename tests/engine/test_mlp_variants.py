"""GELU and non-gated MLPs (``hidden_act: gelu``, ``gated_linear_unit: false``), as the reference builds them
(mindformers 2.1.0 pynative/transformers/mlp.py: gated ``act(gate)·up`` or plain ``act(fc1(x))``; its ``gelu`` is
``GELU(approximate='none')``, the exact erf GELU — pynative/layers/activation.py).

Checked against independent references: a float64 NumPy transcription of the MLP (forward and gradients), and
transformers' Qwen3 with ``hidden_act="gelu"`` (its ``gelu`` is the exact erf GELU too), whose MLP is swapped for
the textbook non-gated ``down(act(up(x)))`` for the non-gated case. Then the config side: a GPT-style model
validates, plans and trains; what the engine does not build (non-gated routed experts, a GELU DeepSeek-V4) is
refused naming the key."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from mftk.errors import ConfigError
from tests.helpers.activations import gelu64, gelu64_grad, silu64, silu64_grad

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
ACTS = {"gelu": (gelu64, gelu64_grad), "silu": (silu64, silu64_grad)}


def _mlp64(x, w1, w2, g, act: str, gated: bool):
    """Forward ``y = fc2(a)`` and the gradients of ``Σ y·g`` w.r.t. x, fc1 and fc2 (weights ``[out, in]``), float64.
    Gated: ``fc1`` rows interleaved (2j gate_j, 2j+1 up_j), ``a = act(gate)·up``."""
    f, df = ACTS[act]
    h = x @ w1.T
    if gated:
        gate, up = h[:, 0::2], h[:, 1::2]
        a = f(gate) * up
    else:
        a = f(h)
    y = a @ w2.T
    da = g @ w2
    dw2 = g.T @ a
    if gated:
        dh = np.empty_like(h)
        dh[:, 0::2], dh[:, 1::2] = da * up * df(gate), da * f(gate)
    else:
        dh = da * df(h)
    return y, dh @ w1, dh.T @ x, dw2


@pytest.mark.parametrize("act,gated", [("gelu", True), ("gelu", False), ("silu", False), ("silu", True)])
def test_mlp_forward_and_gradients_equal_float64_numpy(rng, act, gated):
    import mindspore as ms
    from mindspore import Tensor

    from mftk.engine.layers.mlp import MLP

    h, f, n = 8, 6, 10
    mlp = MLP(h, f, activation=act, gated_linear_unit=gated)
    w1 = rng.normal(0, 0.7, (2 * f if gated else f, h))
    w2 = rng.normal(0, 0.5, (h, f))
    assert tuple(mlp.linear_fc1.weight.shape) == w1.shape  # non-gated: fc1 is F wide, not 2F
    mlp.linear_fc1.weight.set_data(Tensor(w1.astype(np.float32)))
    mlp.linear_fc2.weight.set_data(Tensor(w2.astype(np.float32)))
    x, g = rng.normal(0, 1.5, (n, h)), rng.normal(0, 1, (n, h))
    want_y, want_dx, want_dw1, want_dw2 = _mlp64(x, w1, w2, g, act, gated)

    def loss(xt):
        return (mlp(xt) * Tensor(g.astype(np.float32))).sum()

    xt = Tensor(x.astype(np.float32))
    dx, (dw1, dw2) = ms.grad(loss, 0, mlp.trainable_params())(xt)
    np.testing.assert_allclose(mlp(xt).asnumpy(), want_y, rtol=1e-5, atol=1e-5)
    for got, want in ((dx, want_dx), (dw1, want_dw1), (dw2, want_dw2)):
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-4, atol=1e-5)


def test_gelu_is_the_exact_erf_one_not_the_tanh_approximation():
    """GELU(−1) = −0.158655 (erf); the tanh approximation gives −0.158808, a difference this test sees."""
    from mindspore import Tensor

    from mftk.engine.layers.kernels import GeluFn

    got = float(GeluFn()(Tensor(np.array([-1.0], np.float32))).asnumpy()[0])
    assert got == pytest.approx(-0.15865525393145707, abs=2e-7)


# ------------------------------------------------------------------------------- transformers parity


def _hf_qwen3(cfg, tensors: dict, gated: bool):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=False, max_position_embeddings=64, hidden_act="gelu",
        attn_implementation="eager")
    hf = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict({k: torch.tensor(v) for k, v in tensors.items()}, strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k], (missing, unexpected)
    if not gated:  # the textbook non-gated MLP: down(act(up(x))); gate_proj is unused
        for layer in hf.model.layers:
            m = layer.mlp
            m.forward = lambda x, m=m: m.down_proj(m.act_fn(m.up_proj(x)))
    return hf


@pytest.mark.torch
@pytest.mark.parametrize("gated", [True, False], ids=["geglu", "gelu_mlp"])
def test_qwen3_with_gelu_mlp_matches_transformers(rng, tiny_qwen3, gated):
    torch = pytest.importorskip("torch")
    from mftk.ckpt.hf import qwen3 as qwen3_sd
    from mftk.ckpt.hf.convert import interleave_rows
    from mftk.engine import build_model, state_dict
    from tests.helpers.models import torch_masked_ce

    cfg = tiny_qwen3(hidden_act="gelu", gated_linear_unit=gated)
    model = build_model(cfg, seed=1)
    sd = state_dict(model)
    if not gated:  # fc1 [F, H] is transformers' up_proj: carried through the gated mapping with a zero gate
        sd = {k: interleave_rows(np.zeros_like(v), v) if k.endswith("mlp.linear_fc1.weight") else v
              for k, v in sd.items()}
    hf = _hf_qwen3(cfg, qwen3_sd.mf_to_hf(sd, cfg), gated)
    ids = rng.integers(1, cfg.vocab_size, (2, 12))
    labels, mask = np.roll(ids, -1, 1), np.ones_like(ids, np.float32)
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    ours = model.logits(ids)[0].asnumpy()
    assert np.abs(ref).max() > 0.05
    assert np.abs(ours - ref).max() <= 1e-4
    out = model.forward({"input_ids": ids, "labels": labels, "loss_mask": mask})
    assert out.loss == pytest.approx(torch_masked_ce(ref, labels, mask), abs=1e-4)


# ------------------------------------------------------------------------------- config and runs
def _template(name: str = "qwen3_tiny.yaml", **model) -> dict:
    data = yaml.safe_load((ROOT / "templates" / name).read_text())
    data["model"].update(model)
    return data


def test_gpt_style_model_validates_and_builds_a_plain_mlp():
    from mftk.config.load import load_data
    from mftk.engine import build_model

    loaded = load_data(_template(hidden_act="gelu", gated_linear_unit=False), check_files=False)
    assert not [p for p in loaded.notes if p.path in ("model.hidden_act", "model.gated_linear_unit")]
    model = build_model(loaded.config.model, seed=0)
    fc1 = model.decoder.layers[0].mlp.linear_fc1.weight
    assert tuple(fc1.shape) == (loaded.config.model.intermediate_size, loaded.config.model.hidden_size)


@pytest.mark.parametrize("name,key,value,words", [
    ("qwen3_moe_tiny.yaml", "gated_linear_unit", False, "routed experts are gated"),
    ("deepseek_v3_tiny.yaml", "gated_linear_unit", False, "routed experts are gated"),
    ("deepseek_v4_tiny.yaml", "hidden_act", "gelu", "clamped SwiGLU"),
])
def test_what_the_engine_does_not_build_is_refused_naming_the_key(name, key, value, words):
    from mftk.config.load import load_data

    with pytest.raises(ConfigError) as info:
        load_data(_template(name, **{key: value}), check_files=False)
    errs = {p.path: p.message for p in info.value.problems if p.severity == "error"}
    assert f"model.{key}" in errs and words in errs[f"model.{key}"]


def test_gelu_moe_models_are_accepted():
    from mftk.config.load import load_data

    for name in ("qwen3_moe_tiny.yaml", "deepseek_v3_tiny.yaml"):
        load_data(_template(name, hidden_act="gelu"), check_files=False)  # raises on any error


def test_fusedswiglu_without_gated_linear_unit_is_read_as_gated_with_a_warning():
    """mindformers 2.1.0 transformer_config.py: a SwiGLU with gated_linear_unit false is set gated, with a warning."""
    from mftk.config.load import load_data

    loaded = load_data(_template(hidden_act="fusedswiglu", gated_linear_unit=False), check_files=False)
    assert loaded.config.model.gated_linear_unit is True
    assert any(p.path == "model.gated_linear_unit" and p.severity == "warning" for p in loaded.notes)


def test_gelu_moe_experts_compute_gelu_gate_times_up(rng):
    """The routed experts' activation follows hidden_act (the shared kernel `GroupedExpertsFn` calls)."""
    from mindspore import Tensor

    from mftk.engine.layers.moe import GroupedMLP

    experts = GroupedMLP(2, 4, 3, activation="gelu")
    w1, w2 = rng.normal(0, 0.8, (2, 4, 6)), rng.normal(0, 0.8, (2, 3, 4))
    experts.weight1.set_data(Tensor(w1.astype(np.float32)))
    experts.weight2.set_data(Tensor(w2.astype(np.float32)))
    x = rng.normal(0, 1.5, (5, 4))
    idx, probs = np.array([[0], [1], [1], [0], [1]]), np.full((5, 1), 0.5)
    out, _ = experts(Tensor(x.astype(np.float32)), Tensor(probs.astype(np.float32)), Tensor(idx.astype(np.int32)))
    h = np.einsum("th,the->te", x, w1[idx[:, 0]])
    want = np.einsum("tf,tfh->th", gelu64(h[:, :3]) * h[:, 3:], w2[idx[:, 0]]) * 0.5
    np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-5, atol=1e-5)


def test_gpt_style_model_plans(tmp_path):
    from commands.app import app
    from tests.helpers.cli import runner

    path = tmp_path / "gpt.yaml"
    path.write_text(yaml.safe_dump(_template(hidden_act="gelu", gated_linear_unit=False)))
    r = runner.invoke(app, ["plan-parallel", str(path), "--world-size", "2", "--top", "1"])
    assert r.exit_code == 0, r.output


def test_gpt_style_model_trains(corpus, tmp_path):
    from mftk.engine.run import train
    from tests.helpers.tiny import load, tiny_raw

    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=3, gbs=1)
    raw["model"].update(hidden_act="gelu", gated_linear_unit=False)
    r = train(load(raw), output_dir=tmp_path / "out")
    assert r.final_step == 3 and all(np.isfinite(r.losses)) and r.losses[-1] < r.losses[0]


def test_hf_export_names_gelu_and_refuses_a_non_gated_mlp(tiny_qwen3):
    """transformers' Qwen3 reads ``hidden_act: gelu`` as the exact GELU; its MLP has no non-gated form."""
    from mftk.config.hf import hf_config_from_model_section

    assert hf_config_from_model_section(tiny_qwen3(hidden_act="gelu"))["hidden_act"] == "gelu"
    assert hf_config_from_model_section(tiny_qwen3())["hidden_act"] == "silu"
    with pytest.raises(ConfigError) as info:
        hf_config_from_model_section(tiny_qwen3(hidden_act="gelu", gated_linear_unit=False))
    assert "model.gated_linear_unit" in {p.path for p in info.value.problems}
