"""Exported Hugging Face checkpoints against transformers: train a tiny template, export, compare logits."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from commands.app import app
from tests.helpers.cli import runner
from tests.helpers.tiny import load, tiny_raw

TOL = 1e-4  # max abs logit difference against transformers (fp32)


def train_template(tmp_path_factory, corpus, template: str):
    d = tmp_path_factory.mktemp(template.split("_tiny")[0])
    raw = tiny_raw(template, corpus, d / "ckpt", steps=2, gbs=1)
    (d / "cfg.yaml").write_text(yaml.safe_dump(raw))
    r = runner.invoke(app, ["train", str(d / "cfg.yaml"), "--output-dir", str(d / "out")])
    assert r.exit_code == 0, r.output
    return d, raw


def mftk_logits(raw: dict, step_dir, ids: np.ndarray) -> tuple[np.ndarray, dict]:
    from mftk.ckpt.load import load_global
    from mftk.engine import build_model, load_state_dict

    cfg = load(raw).config.model
    model = build_model(cfg, seed=123)  # a different init: every weight must come from the checkpoint
    weights = load_global(step_dir, kinds=("model",))
    load_state_dict(model, weights)
    return model.logits(ids)[0].asnumpy(), weights


def hf_model(out):
    torch, transformers = pytest.importorskip("torch"), pytest.importorskip("transformers")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    n_layers = model.config.num_hidden_layers
    assert not info["missing_keys"], info["missing_keys"]  # nothing silently random-initialised
    assert not [k for k in info["unexpected_keys"] if not k.startswith(f"model.layers.{n_layers}.")]  # MTP: HF skips it
    assert not info["mismatched_keys"]
    return model.eval()


def compare_with_hf(out, raw, step_dir, vocab: int) -> None:
    torch = pytest.importorskip("torch")
    ids = np.random.default_rng(0).integers(1, vocab, (2, 16))
    ours, weights = mftk_logits(raw, step_dir, ids)
    with torch.no_grad():
        ref = hf_model(out)(torch.tensor(ids)).logits.numpy()
    assert np.abs(ref).max() > 0.05  # real signal
    assert ref.shape == ours.shape and np.abs(ours - ref).max() <= TOL
