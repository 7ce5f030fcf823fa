"""Max attention logit tracking (``core_attention.max_logits_val``) and the `MaxLogitsMonitor` lines."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from mindspore import Tensor
from safetensors.numpy import load_file

import mftk.engine.layers.attention as attention_mod
from mftk.engine.layers.attention import CoreAttention, SelfAttention, causal_mask
from mftk.engine.layers.mla import MLASelfAttention
from mftk.engine.layers.rope import rotary_table
from mftk.errors import ConfigError
from tests.helpers.tiny import load, tiny_raw

pytestmark = pytest.mark.engine
PARAM = "decoder.layers.0.self_attention.core_attention.max_logits_val"
NH = 4  # templates/qwen3_tiny.yaml num_attention_heads


def _numpy_head_max(q, k, mask, scale):
    """Per-head max of scale·q·kᵀ over (batch, query, key), masked positions left out; GQA head h → group h//r."""
    nh, ng = q.shape[1], k.shape[1]
    k_full = np.repeat(k, nh // ng, axis=1)
    scores = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k_full.astype(np.float64)) * scale
    scores = np.where(np.broadcast_to(mask, scores.shape), -np.inf, scores)
    return np.maximum(scores.max(axis=(0, 2, 3)), 0.0)  # the buffer starts at 0, as the reference's


def _mask(rng, b, s):
    pad = np.zeros((b, 1, 1, s), bool)
    pad[0, ..., 1] = True  # one padded key in the first sequence
    return causal_mask(s).asnumpy() | pad


def test_core_attention_running_max_matches_numpy_and_resets():
    rng = np.random.default_rng(0)
    b, nh, ng, s, d, scale = 2, 4, 2, 5, 8, 0.35
    cell = CoreAttention(nh, scale, track_max_logits=True)
    assert cell.max_logits_val.requires_grad is False
    expected = np.zeros(nh)
    for shift in (3.0, -1.0):  # the second call's maxima are lower for some heads: the max keeps the first
        q = rng.normal(shift, 1.0, (b, nh, s, d)).astype(np.float32)
        k = rng.normal(1.0, 1.0, (b, ng, s, d)).astype(np.float32)
        v = rng.normal(0, 1, (b, ng, s, d)).astype(np.float32)
        mask = _mask(rng, b, s)
        cell(Tensor(q), Tensor(k), Tensor(v), Tensor(mask))
        expected = np.maximum(expected, _numpy_head_max(q, k, mask, scale))
        np.testing.assert_allclose(cell.max_logits_val.asnumpy(), expected, rtol=1e-5)
    assert expected.min() > 0
    cell.reset_max_logits()
    assert not cell.max_logits_val.asnumpy().any()
    assert CoreAttention(nh, scale).max_logits_val is None  # off: no parameter at all


class _Recorder:
    """Records the q, k and mask each core attention receives, then runs the real one."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, q, k, v, mask, scale, max_logits=None, fn=None):
        self.calls.append((q.asnumpy(), k.asnumpy(), mask.asnumpy(), scale))
        return self.real(q, k, v, mask, scale, max_logits, fn)


def _layer_check(layer, hidden, monkeypatch, rope):
    rng = np.random.default_rng(1)
    for p in layer.trainable_params():
        p.set_data(Tensor(rng.normal(0, 0.5, p.shape).astype(np.float32)))
    rec = _Recorder(attention_mod.core_attention)
    monkeypatch.setattr(attention_mod, "core_attention", rec)
    b, s = 2, 6
    x = Tensor(rng.normal(0, 1, (b, s, hidden)).astype(np.float32))
    layer(x, rope(s), Tensor(_mask(rng, b, s)))
    (q, k, mask, scale), = rec.calls
    got = layer.core_attention.max_logits_val.asnumpy()
    np.testing.assert_allclose(got, _numpy_head_max(q, k, mask, scale), rtol=1e-5, atol=1e-6)
    assert got.max() > 0.1
    names = [p.name for p in layer.get_parameters()]
    assert "core_attention.max_logits_val" in names and "core_attention.max_logits_val" not in \
        [p.name for p in layer.trainable_params()]


def test_gqa_layer_tracks_the_scaled_masked_max(monkeypatch):
    layer = SelfAttention(16, num_heads=4, num_groups=2, head_dim=8, track_max_logits=True)
    _layer_check(layer, 16, monkeypatch, rotary_table(8, 10000.0))
    assert layer.core_attention.max_logits_val.shape == (4,)


def test_mla_layer_tracks_the_scaled_masked_max(monkeypatch):
    layer = MLASelfAttention(16, 3, q_lora_rank=8, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
                             v_head_dim=4, softmax_scale=0.3, track_max_logits=True)
    _layer_check(layer, 16, monkeypatch, rotary_table(4, 10000.0))
    assert layer.core_attention.max_logits_val.shape == (3,)


def test_compiled_block_tracks_and_resets_like_eager():
    """``GPTModel.jit_blocks`` compiles the attention: the in-graph update and the reset must still land."""
    import mindspore as ms

    rng = np.random.default_rng(2)
    eager = SelfAttention(16, num_heads=4, num_groups=2, head_dim=8, track_max_logits=True)
    jitted = SelfAttention(16, num_heads=4, num_groups=2, head_dim=8, track_max_logits=True)
    for a, b in zip(eager.trainable_params(), jitted.trainable_params()):
        w = Tensor(rng.normal(0, 0.5, a.shape).astype(np.float32))
        a.set_data(w)
        b.set_data(w.copy())
    jitted.construct = ms.jit(jitted.construct)
    rope, mask = rotary_table(8, 10000.0)(6), causal_mask(6)
    x = Tensor(rng.normal(0, 1, (2, 6, 16)).astype(np.float32))
    eager(x, rope, mask)
    want = eager.core_attention.max_logits_val.asnumpy()
    for _ in range(2):
        jitted(x, rope, mask)
        np.testing.assert_allclose(jitted.core_attention.max_logits_val.asnumpy(), want, rtol=1e-5)
        jitted.core_attention.reset_max_logits()
        assert not jitted.core_attention.max_logits_val.asnumpy().any()


# --------------------------------------------------------------------------------------- training
def _run(tmp: Path, corpus, **edits):
    from mftk.engine.run import train

    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp / "ckpt", steps=3)
    for key, value in edits.items():
        if key == "model":
            raw["model"].update(value)
        else:
            raw[key] = value
    return train(load(raw), output_dir=tmp / "out", install_signals=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    d = tmp_path_factory.mktemp("max_logits")
    off = _run(d / "off", corpus)
    on = _run(d / "on", corpus, callbacks=[{"type": "MaxLogitsMonitor", "step_interval": 2}])
    return d, off, on


def test_tracking_changes_no_loss_and_no_gradient(runs):
    _, off, on = runs
    assert len(off.losses) == 3
    assert on.losses == off.losses and on.grad_norms == off.grad_norms


def test_monitor_logs_every_step_interval_steps(runs):
    _, _, on = runs
    text = Path(on.log_file).read_text()
    lines = [ln for ln in text.splitlines() if "max_attention_logit/" in ln]
    steps = sorted({int(m.group(1)) for ln in lines if (m := re.search(r"step:\[\s*(\d+)/\s*3\]", ln))})
    assert steps == [2]  # step_interval 2 over 3 steps
    per_head = [ln for ln in lines if f"max_attention_logit/{PARAM}: [" in ln]
    assert len(per_head) == 1
    values = [float(v) for v in per_head[0].split(": [")[1].rstrip("]").split(",")]
    assert len(values) == NH and max(values) > 0
    mean = next(ln for ln in lines if f"{PARAM}/mean: " in ln)
    peak = next(ln for ln in lines if f"{PARAM}/max: " in ln)
    assert float(mean.rsplit(": ", 1)[1]) == pytest.approx(np.mean(values), rel=2e-3)
    assert float(peak.rsplit(": ", 1)[1]) == pytest.approx(max(values), rel=1e-6)
    assert "max_attention_logit" not in Path(runs[1].log_file).read_text()


def test_checkpoint_holds_the_buffer_only_when_tracking(runs):
    d, _, _ = runs
    on = load_file(str(d / "on" / "ckpt" / "iteration_00000002" / "checkpoint-model-0000000-0000001.safetensors"))
    off = load_file(str(d / "off" / "ckpt" / "iteration_00000002" / "checkpoint-model-0000000-0000001.safetensors"))
    assert on[PARAM].shape == (NH,) and on[PARAM].dtype == np.float32
    assert not any("max_logits_val" in n for n in off)
    assert set(on) - set(off) == {f"decoder.layers.{i}.self_attention.core_attention.max_logits_val"
                                  for i in range(len(set(on) - set(off)))}


def test_export_hf_skips_the_buffer(runs, tmp_path):
    from mftk.ckpt.export import export_hf

    d, _, _ = runs
    export_hf(d / "on" / "ckpt", tmp_path / "hf")
    hf = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert not any("max_logits" in n for n in hf)
    assert "model.layers.0.self_attn.q_proj.weight" in hf


def test_checkpoints_load_with_tracking_switched_either_way(runs, corpus):
    from mftk.ckpt.resume import plan_resume
    from mftk.engine.builders import build_model
    from mftk.engine.restore import param_shapes
    from mftk.engine.restore import load_checkpoint

    d, _, _ = runs
    for saved, track in (("on", False), ("off", True)):
        raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "x", steps=3)
        raw["model"]["track_max_attention_logit"] = track
        config = load(raw).config
        model = build_model(config)
        plan = plan_resume(config, str(d / saved / "ckpt"), weights_only=False, params=param_shapes(model))
        assert not plan.missing and not plan.unexpected
        load_checkpoint(plan, model, config)
        has = [p.name for p in model.get_parameters() if p.name.endswith("max_logits_val")]
        assert bool(has) == track


# --------------------------------------------------------------------------------------- config
def test_model_flag_alone_adds_a_monitor_every_step(caplog, corpus):
    import logging

    from mftk.engine.models.build import build_model
    from mftk.engine.monitor import MaxLogitsMonitor, MonitorGroup, build_monitors

    raw = tiny_raw("qwen3_tiny.yaml", corpus, Path("unused"), steps=7)
    raw["model"]["track_max_attention_logit"] = True
    loaded = load(raw)
    model = build_model(loaded.config.model, seed=0)
    mon, _ = build_monitors(loaded, model=model)
    assert isinstance(mon, MonitorGroup)
    (ml,) = [m for m in mon.monitors if isinstance(m, MaxLogitsMonitor)]
    assert ml.step_interval == 1 and len(ml.cells) == loaded.config.model.num_hidden_layers
    ml.cells[0].max_logits_val.set_data(Tensor(np.array([1.23456, 20.0, 0.5, 3.0], np.float32)))
    with caplog.at_level(logging.INFO, logger="mftk.train"):
        mon.flush(3, None, None, None)
    assert f"step:[    3/    7] max_attention_logit/{PARAM}: [1.235, 20, 0.5, 3]" in caplog.text
    assert f"step:[    3/    7] max_attention_logit/{PARAM}/mean: 6.184" in caplog.text
    assert not ml.cells[0].max_logits_val.asnumpy().any()  # reset after the step


@pytest.mark.parametrize("callbacks,parallelism,path", [
    ([{"type": "EarlyStopping"}], {}, "callbacks[0].type"),
    ([{"type": "MaxLogitsMonitor", "step_interval": 0}], {}, "callbacks[0].step_interval"),
    ([{"type": "MaxLogitsMonitor"}, {"type": "MaxLogitsMonitor"}], {}, "callbacks"),
    ([{"type": "MaxLogitsMonitor"}], {"tensor_parallel": 2, "sequence_parallel": True},
     "model.track_max_attention_logit"),
])
def test_bad_callbacks_are_refused_before_a_run(callbacks, parallelism, path, corpus):
    from mftk.config.load import load_data

    raw = tiny_raw("qwen3_tiny.yaml", corpus, Path("unused"))
    raw["callbacks"] = callbacks
    raw.setdefault("parallelism", {}).update(parallelism)
    world = 2 if parallelism else 1
    with pytest.raises(ConfigError) as info:  # the loader's rules (what validate-config and train run)
        load_data(raw, source="<test>", world_size=world)
    assert path in {p.path for p in info.value.problems}


def test_support_table_accepts_tracking(corpus):
    from mftk.config.support import unsupported_model_settings

    raw = tiny_raw("qwen3_tiny.yaml", corpus, Path("unused"))
    raw["model"]["track_max_attention_logit"] = True
    assert not [p for p in unsupported_model_settings(load(raw).config.model) if "track" in p.path]
    assert json.dumps(raw["model"]["track_max_attention_logit"]) == "true"
