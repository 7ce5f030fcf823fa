"""Resume scenario 2 from a Hugging Face dir: `mftk resume CONFIG --from HF_DIR --weights-only`.

The HF dir is an `inspect-ckpt --export-hf` export of a trained mftk checkpoint, so the same
weights exist under both names. Checked: the run starts at step 0; the first step's loss and
grad norm equal a weights-only resume from the original mftk checkpoint (same weights, same
data, fresh optimizer: bit-exact); the optimizer really is fresh (after one AdamW step from zero
moments ``v = (1-β2)·(m/(1-β1))²``, which a continued optimizer would not satisfy); the loaded
weights equal the original tensors exactly, for both families (the DeepSeek-V3 expert bias too).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.tiny import tiny_raw, train_tiny_via_cli

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from mftk.ckpt.export import export_hf

    d = tmp_path_factory.mktemp("resume_hf")
    cfg = train_tiny_via_cli(d)
    export_hf(d / "ckpt", d / "hf")
    return d, cfg


def _resume(cfg, source, out, *extra: str):
    r = runner.invoke(app, ["resume", str(cfg), "--from", str(source), "--weights-only", "--set", "training.steps=1",
                            "--set", f"checkpoint.save_path={out / 'ckpt'}", "--set",
                            "checkpoint.save_interleaved_steps=1", "--output-dir", str(out / "run"), *extra])
    assert r.exit_code == 0, r.output
    return r


def _metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "run" / "log" / "rank_0" / "metrics.jsonl").read_text().splitlines()]


def test_weights_only_from_hf_dir_starts_fresh_at_step_zero(exported, tmp_path):
    from mftk.ckpt.load import load_rank

    d, cfg = exported
    r = _resume(cfg, d / "hf", tmp_path / "hf")
    steps = [line for line in r.stdout.splitlines() if "{ step:[" in line]
    assert len(steps) == 1 and "step:[    1/    1]" in steps[0]  # from step 0, not the saved step 2
    from_mf = tmp_path / "mf"
    _resume(cfg, d / "ckpt" / "iteration_00000002", from_mf)
    a, b = _metrics(tmp_path / "hf"), _metrics(from_mf)
    assert len(a) == len(b) == 1 and a[0]["step"] == 1
    assert a[0]["loss"] == b[0]["loss"] and a[0]["grad_norm"] == b[0]["grad_norm"]  # same weights, bit for bit

    saved = load_rank(tmp_path / "hf" / "ckpt")
    assert saved.common.step == 1 and int(saved.optimizer["global_step"][0]) == 1
    b1, b2 = 0.9, 0.95  # qwen3_tiny.yaml optimizer.betas
    ms = [k for k in saved.optimizer if k.startswith("adam_m.")]
    assert ms
    for k in ms:
        m, v = saved.optimizer[k], saved.optimizer["adam_v." + k[len("adam_m."):]]
        np.testing.assert_allclose(v, (1 - b2) * (m / (1 - b1)) ** 2, rtol=1e-4, atol=1e-30)
    old = load_rank(d / "ckpt").optimizer  # the saved optimizer really had history: the check can fail
    k = ms[0]
    assert not np.allclose(old["adam_v." + k[7:]], (1 - b2) * (old[k] / (1 - b1)) ** 2, rtol=1e-4, atol=1e-30)


def test_hf_dir_needs_weights_only_and_dry_run_says_so(exported, tmp_path):
    d, cfg = exported
    r = runner.invoke(app, ["resume", str(cfg), "--from", str(d / "hf"), "--output-dir", str(tmp_path / "o")])
    assert r.exit_code == 1 and "holds no optimizer state" in r.stderr and "--weights-only" in r.stderr
    r = runner.invoke(app, ["resume", str(cfg), "--from", str(d / "hf"), "--weights-only", "--dry-run", "--json",
                            "--set", f"checkpoint.save_path={tmp_path / 'fresh'}"])  # d/ckpt holds the run's own
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["kind"] == "hf" and plan["scenario"] == 2 and plan["start_step"] == 0
    assert plan["consumed_samples"] == 0 and plan["loads"] == ["model weights (HF names mapped)"]


@pytest.mark.parametrize("template", ["qwen3_tiny.yaml", "deepseek_v3_tiny.yaml"])
def test_weights_loaded_from_hf_equal_the_original(template, tmp_path):
    """Save a model with the ckpt library, export it, load the export into a differently seeded model."""
    from mftk.ckpt.common import CommonInfo
    from mftk.ckpt.export import export_hf
    from mftk.ckpt.save import save_checkpoint
    from mftk.engine import build_model, state_dict
    from mftk.ckpt.resume import plan_resume
    from mftk.engine.restore import param_shapes
    from mftk.engine.restore import load_checkpoint

    raw = tiny_raw(template, tmp_path / "unused", tmp_path / "ckpt")
    import mindspore as ms

    config = _config(raw)
    original = build_model(config.model, seed=1)
    for moe in original.moe_layers():  # a non-zero expert bias must survive e_score_correction_bias
        moe.expert_bias.set_data(ms.Tensor(np.linspace(-0.1, 0.1, config.model.n_routed_experts, dtype=np.float32)))
    want = state_dict(original)
    save_checkpoint(tmp_path / "ckpt", step=4, model=want, extra={"model": raw["model"]},
                    common=CommonInfo.for_step(step=4, max_steps=4, global_batch_size=2, consumed_samples=8))
    export_hf(tmp_path / "ckpt", tmp_path / "hf")

    model = build_model(config.model, seed=2)
    plan = plan_resume(config, str(tmp_path / "hf"), weights_only=True, params=param_shapes(model))
    assert plan.kind == "hf" and plan.scenario == 2 and plan.start_step == 0
    loaded = load_checkpoint(plan, model, config)
    assert loaded.optimizer is None and loaded.extra is None
    got = state_dict(model)
    assert set(got) == set(want)
    differ = [k for k in want if not np.array_equal(got[k], want[k])]
    assert differ == []
    assert any(np.abs(v).max() > 0 for k, v in got.items() if k.endswith("expert_bias")) or "qwen3" in template


def _config(raw: dict):
    """The config without data-file checks (this test never reads data)."""
    from mftk.config.load import load_data

    return load_data(raw, source="<test>", check_files=False).config
