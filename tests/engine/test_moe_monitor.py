"""`monitor.moe_monitor`: tokens per expert and imbalance per MoE layer at its interval (log, metrics, TensorBoard).

Independent check: dropless routing sends every token to exactly top-K experts, so each logged layer's
counts sum to global_batch_size · seq_length · K (a hand count from the config), and the imbalance is
max/mean of the logged counts.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.tfevents import event_file, scalars
from tests.helpers.tiny import load, tiny_raw

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus):
    from mftk.engine.run import train

    d = tmp_path_factory.mktemp("moe_monitor")
    raw = tiny_raw("deepseek_v3_tiny.yaml", corpus, d / "ckpt", steps=4, gbs=2)
    raw["monitor"] = {"moe_monitor": {"save_tokens_per_expert_interval": 2, "target_layers": [1, 2]},
                      "tensorboard": {"output_dir": str(d / "tb")}}
    result = train(load(raw), output_dir=d / "out", install_signals=False)
    return d, raw, result


def test_metrics_hold_the_expert_load_at_the_interval(run):
    d, raw, result = run
    records = [json.loads(x) for x in open(result.metrics_file).read().splitlines()]
    k, seq, gbs = raw["model"]["num_experts_per_tok"], raw["model"]["seq_length"], raw["training"]["global_batch_size"]
    for r in records:
        keys = sorted(key for key in r if key.startswith(("tokens_per_expert/", "expert_imbalance/")))
        if r["step"] % 2:
            assert keys == []
            continue
        # layer 1 (MoE) and the MTP layer (id 2); layer 0 is dense
        assert keys == ["expert_imbalance/decoder.layers.1", "expert_imbalance/mtp.layers.0",
                        "tokens_per_expert/decoder.layers.1", "tokens_per_expert/mtp.layers.0"]
        for layer in ("decoder.layers.1", "mtp.layers.0"):
            counts = np.array(r[f"tokens_per_expert/{layer}"])
            assert len(counts) == raw["model"]["n_routed_experts"] and counts.sum() == gbs * seq * k
            assert r[f"expert_imbalance/{layer}"] == pytest.approx(counts.max() / counts.mean())


def test_log_lines_and_tensorboard_scalars(run):
    d, _, result = run
    text = open(result.log_file).read()
    assert text.count("moe_monitor/decoder.layers.1: tokens_per_expert [") == 2
    got, _ = scalars(event_file(d / "tb"))
    assert [s for s, _ in got["expert-imbalance/decoder.layers.1"]] == [2, 4]
    assert [s for s, _ in got["tokens-per-expert/decoder.layers.1/expert_0"]] == [2, 4]


def test_bad_target_layers_are_errors(corpus, tmp_path):
    from mftk.errors import ConfigError

    raw = tiny_raw("deepseek_v3_tiny.yaml", corpus, tmp_path / "ckpt")
    raw["monitor"] = {"moe_monitor": {"save_tokens_per_expert_interval": 1, "target_layers": [7]}}
    with pytest.raises(ConfigError) as info:
        load(raw)
    assert any(p.path == "monitor.moe_monitor.target_layers" for p in info.value.problems)
