"""`parallel.model_parallel` without processes: the TP/EP model's blocks are the right slices of the full
model's weights (checked against hand-written numpy slices), and the layouts mftk train cannot run are
refused with a ConfigError naming the YAML path (the msrun equality tests are in
tests/commands/test_train_model_parallel.py)."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.engine.parallel.groups import AxisGroup
from mftk.errors import ConfigError
from tests.helpers.models import make_dsv3, make_qwen3

pytestmark = pytest.mark.engine


class _Groups:
    """Just what `to_parallel` reads: a (fake) size-2 TP or EP group at rank 1; no collective is called."""

    def __init__(self, tp: int = 1, ep: int = 1) -> None:
        self.tp = AxisGroup(name="fake_tp", ranks=(0, 1), rank=1) if tp > 1 else AxisGroup("", (0,), 0)
        self.ep = AxisGroup(name="fake_ep", ranks=(0, 1), rank=1) if ep > 1 else AxisGroup("", (0,), 0)


def test_tp_blocks_are_the_full_weights_slices():
    from mftk.engine.models.build import build_model, state_dict
    from mftk.engine.parallel.model_parallel import param_splits, to_parallel

    full = build_model(make_qwen3(), seed=3)
    ref = state_dict(full)
    model = to_parallel(full, _Groups(tp=2))
    got = state_dict(model)
    splits = param_splits(model)
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    proj = "decoder.layers.0.self_attention.linear_proj.weight"
    fc1, emb = "decoder.layers.1.mlp.linear_fc1.weight", "embedding.word_embeddings.weight"
    half = ref[qkv].shape[0] // 2
    np.testing.assert_array_equal(got[qkv], ref[qkv][half:])  # rank 1: the second half of the groups
    np.testing.assert_array_equal(got[proj], ref[proj][:, ref[proj].shape[1] // 2:])
    np.testing.assert_array_equal(got[fc1], ref[fc1][ref[fc1].shape[0] // 2:])  # whole (gate, up) pairs
    np.testing.assert_array_equal(got[emb], ref[emb][ref[emb].shape[0] // 2:])
    assert (splits[qkv].dim, splits[proj].dim, splits[emb].axis) == (0, 1, "tp")
    norm = "decoder.layers.0.input_layernorm.weight"
    assert norm not in splits and np.array_equal(got[norm], ref[norm])
    assert set(got) == set(ref)  # the same names: checkpoints stay reference-named


def test_ep_blocks_hold_this_ranks_experts():
    from mftk.engine.models.build import build_model, state_dict
    from mftk.engine.parallel.model_parallel import cut, param_splits, to_parallel

    full = build_model(make_dsv3(), seed=3)
    ref = state_dict(full)
    model = to_parallel(full, _Groups(ep=2))
    got = state_dict(model)
    w1 = [n for n in got if n.endswith("experts.weight1")]
    assert w1
    for n in w1:
        e = ref[n].shape[0]
        np.testing.assert_array_equal(got[n], ref[n][e // 2:])
    splits = param_splits(model)
    assert {s.axis for s in splits.values()} == {"ep"}
    opt = cut({f"adam_m.{w1[0]}": ref[w1[0]], "global_step": np.array([5])}, splits)
    np.testing.assert_array_equal(opt[f"adam_m.{w1[0]}"], got[w1[0]])
    assert opt["global_step"].tolist() == [5]


def _loaded(corpus, template: str, **parallelism):
    from mftk.config.load import load_data
    from tests.helpers.tiny import tiny_raw

    raw = tiny_raw(template, corpus, corpus.parent / "ckpt")
    raw["parallelism"].update(parallelism)
    return load_data(raw, source="<test>", world_size=2)


@pytest.mark.parametrize("template, settings, path, words", [
    ("deepseek_v3_tiny.yaml", {"tensor_parallel": 2, "sequence_parallel": True}, "parallelism.tensor_parallel",
     "MLASelfAttention"),
    ("deepseek_v3_tiny.yaml", {"pipeline_parallel": 2}, "parallelism.pipeline_parallel", "MTP layers is not supported"),
    ("deepseek_v3_tiny.yaml", {"context_parallel": 2}, "parallelism.context_parallel", "GQA attention (Qwen3) only"),
    ("qwen3_tiny.yaml", {"context_parallel": 2, "context_parallel_method": "ulysses"}, "parallelism.context_parallel",
     "colossal only"),
])
def test_unsupported_layouts_are_refused(corpus, template, settings, path, words):
    from mftk.engine.runnable import check_supported_layout

    loaded = _loaded(corpus, template, **settings)
    with pytest.raises(ConfigError) as err:
        check_supported_layout(loaded, 2)
    assert any(p.path == path and words in p.message for p in err.value.problems), err.value.problems


def test_supported_model_parallel_layouts_pass(corpus):
    from mftk.engine.runnable import check_supported_layout

    lay = check_supported_layout(_loaded(corpus, "qwen3_tiny.yaml", tensor_parallel=2, sequence_parallel=True), 2)
    assert (lay.tp, lay.dp) == (2, 1)
    lay = check_supported_layout(_loaded(corpus, "deepseek_v3_tiny.yaml", expert_parallel=2), 2)
    assert (lay.ep, lay.dp_shard) == (2, 2)
    lay = check_supported_layout(_loaded(corpus, "qwen3_tiny.yaml", pipeline_parallel=2), 2)
    assert (lay.pp, lay.dp) == (2, 1)
    lay = check_supported_layout(_loaded(corpus, "qwen3_tiny.yaml", context_parallel=2), 2)
    assert (lay.cp, lay.dp) == (2, 1)
