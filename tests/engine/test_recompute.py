"""Activation recompute (`engine.recompute`): the replayed layers and cells give the gradients of the run without
recompute (1e-6), on both families (GQA, MLA, MoE with its in-place counters, MTP), full and select modes, and
the replayed units really are replayed (each once per backward)."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.engine.models.build import build_model
from tests.helpers.models import RecomputeSection as Section
from tests.helpers.models import lm_args as _args
from tests.helpers.models import make_dsv3, make_dsv4, make_qwen3
from tests.helpers.models import value_and_grads as _grads

pytestmark = pytest.mark.engine


CASES = [
    ("qwen3", Section(mode="full", full_recompute_layer=["0-1"]), ["decoder.layers.0", "decoder.layers.1"]),
    ("qwen3", Section(mode="select", select_module={"self_attention": ["1"], "mlp": ["0-1"]}),
     ["decoder.layers.1.self_attention", "decoder.layers.0.mlp", "decoder.layers.1.mlp"]),
    ("deepseek_v3", Section(mode="full", full_recompute_layer=["0-2"]),  # id 2: the MTP layer
     ["decoder.layers.0", "decoder.layers.1", "mtp.layers.0.transformer_layer"]),
    ("deepseek_v3", Section(mode="select", full_recompute_layer=["0"], select_module={"*mlp": ["1"]}),
     ["decoder.layers.0", "decoder.layers.1.mlp"]),
    ("deepseek_v4", Section(mode="full", full_recompute_layer=["0-3"]),  # sliding+hash, CSA, HCA; MTP id 3
     ["decoder.layers.0", "decoder.layers.1", "decoder.layers.2", "mtp.layers.0.transformer_layer"]),
]


def _config(family):
    if family == "qwen3":
        return make_qwen3()
    if family == "deepseek_v4":  # hyper-connections, hash routing, compressed attention with its indexer loss
        return make_dsv4()
    return make_dsv3(moe_router_load_balancing_type="global_aux_loss")


def _batch(cfg, rng):
    """lm_args' (2, 8) batch; DeepSeek-V4's compressed attention needs its seq_length (32) to select entries."""
    if getattr(cfg, "compress_ratios", None) is None:
        return _args(cfg, rng)
    ids = rng.integers(1, cfg.vocab_size, (2, cfg.seq_length))
    return ids, np.roll(ids, -1, 1), np.ones(ids.shape, np.float32)


@pytest.mark.parametrize("family,section,paths", CASES)
def test_recompute_gives_the_gradients_of_the_plain_run(rng, family, section, paths):
    from mftk.engine import checkpoint
    from mftk.engine.recompute import apply_recompute

    cfg = _config(family)
    plain, replayed = build_model(cfg, seed=0), build_model(cfg, seed=0)
    assert apply_recompute(replayed, section).checkpointed == paths
    args = _batch(cfg, rng)
    (la, ga), (lb, gb) = _grads(plain, args), _grads(replayed, args)
    assert la == lb
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    cells = {name: cell for name, cell in replayed.cells_and_names()}
    assert all(checkpoint.of(cells[p]).replays == 1 for p in paths)  # replayed once in the one backward
    for pa, pb in zip(plain.get_parameters(), replayed.get_parameters()):  # in-place counters counted once
        np.testing.assert_array_equal(pa.asnumpy(), pb.asnumpy(), err_msg=pa.name)


def test_nothing_is_replayed_without_a_mode():
    from mftk.engine.recompute import apply_recompute

    model = build_model(make_qwen3(), seed=0)
    assert apply_recompute(model, Section(full_recompute_layer=["0-1"])).checkpointed == []


EXCLUDED = [
    ("qwen3", Section(mode="full", full_recompute_layer=["0-1"], exclude_op={"*self_attention.linear_proj": ["0"]}),
     ["decoder.layers.0.self_attention.linear_proj"]),
    ("qwen3", Section(mode="select", select_module={"mlp": ["0-1"]}, exclude_op={"mlp.linear_fc2": ["1"]}),
     ["decoder.layers.1.mlp.linear_fc2"]),
    ("deepseek_v3", Section(mode="full", full_recompute_layer=["0-2"],  # the MoE layer's router and shared
                            exclude_op={"mlp.router": ["1"], "*shared_experts": ["1-2"]}),  # experts; MTP id 2
     ["decoder.layers.1.mlp.router", "decoder.layers.1.mlp.shared_experts",
      "mtp.layers.0.transformer_layer.mlp.shared_experts"]),
]


@pytest.mark.parametrize("family,section,excluded", EXCLUDED)
def test_excluded_cells_keep_their_outputs_and_the_gradients_stay_the_plain_runs(rng, family, section, excluded):
    from mftk.engine.recompute import apply_recompute

    cfg = _config(family)
    plain, model = build_model(cfg, seed=0), build_model(cfg, seed=0)
    cells = dict(model.cells_and_names())
    calls = {p: 0 for p in excluded}
    for p in excluded:  # count the cells' own forwards (beneath the exclusion installed next)
        original = cells[p].construct

        def counting(*a, p=p, original=original, **k):
            calls[p] += 1
            return original(*a, **k)
        cells[p].construct = counting
    assert apply_recompute(model, section).excluded == excluded
    args = _args(cfg, rng)
    (la, ga), (lb, gb) = _grads(plain, args), _grads(model, args)
    assert la == lb
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert calls == {p: 1 for p in excluded}  # not replayed: their outputs were kept
    for pa, pb in zip(plain.get_parameters(), model.get_parameters()):  # in-place counters counted once
        np.testing.assert_array_equal(pa.asnumpy(), pb.asnumpy(), err_msg=pa.name)


def _saved_for_backward(model, args) -> list[tuple[tuple, int]]:
    """(shape, bytes) of each tensor autograd keeps for the backward outside the checkpoints' own handles."""
    import mindspore as ms

    saved = []

    def pack(x):
        saved.append((tuple(x.shape), x.nbytes))
        return x

    def loss(*a):
        with ms.saved_tensors_hooks(pack, lambda x: x):
            return model(*a)
    ms.value_and_grad(loss, None, model.trainable_params(), has_aux=True)(*args)
    return saved


def test_recompute_keeps_only_the_layer_inputs_and_what_exclude_op_names(rng):
    """What the checkpoints save for the backward, by hand: a fully recomputed layer keeps nothing but its
    inputs (held by the checkpoint, not saved by autograd); excluding ``linear_proj`` of layer 0 adds exactly
    what its matmul keeps — its input (batch·seq × heads·head_dim) and its weight (hidden × heads·head_dim)."""
    from mftk.engine.recompute import apply_recompute

    cfg = make_qwen3()
    args = _args(cfg, rng)
    plain, full, excl = (build_model(cfg, seed=0) for _ in range(3))
    apply_recompute(full, Section(mode="full", full_recompute_layer=["0-1"]))
    apply_recompute(excl, Section(mode="full", full_recompute_layer=["0-1"],
                                  exclude_op={"self_attention.linear_proj": ["0"]}))
    s_plain, s_full, s_excl = (_saved_for_backward(m, args) for m in (plain, full, excl))
    tokens, q_dim, h = 2 * 8, cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size
    assert not any(shape[-1:] in ((q_dim,), (cfg.intermediate_size,)) for shape, _ in s_full)  # none from inside
    assert sum(b for _, b in s_full) < sum(b for _, b in s_plain) / 5
    extra = list(s_excl)
    for item in s_full:
        extra.remove(item)
    assert sorted(extra) == sorted([((tokens, q_dim), 4 * tokens * q_dim), ((h, q_dim), 4 * h * q_dim)])


def test_exclude_op_that_matches_nothing_recomputed_names_its_path():
    from mftk.engine.recompute import apply_recompute
    from mftk.errors import ConfigError

    model = build_model(make_qwen3(), seed=0)
    section = Section(mode="select", select_module={"mlp": ["0-1"]}, exclude_op={"*linear_proj": ["1"]})
    with pytest.raises(ConfigError) as err:  # linear_proj is in the attention, which select does not replay
        apply_recompute(model, section)
    problem = err.value.problems[0]
    assert problem.path == "recompute.exclude_op.*linear_proj" and "layer 1" in problem.message
