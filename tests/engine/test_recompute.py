"""Activation recompute (`engine.recompute`): the replayed layers and cells give the gradients of the run without
recompute (1e-6), on both families (GQA, MLA, MoE with its in-place counters, MTP), full and select modes, and
the replayed units really are replayed (each once per backward)."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.engine.models.build import build_model
from tests.helpers.models import RecomputeSection as Section
from tests.helpers.models import lm_args as _args
from tests.helpers.models import count_forwards, make_dsv3, make_qwen3
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
]


@pytest.mark.parametrize("family,section,paths", CASES)
def test_recompute_gives_the_gradients_of_the_plain_run(rng, family, section, paths):
    from mftk.engine import unit_replay
    from mftk.engine.recompute import apply_recompute

    cfg = make_qwen3() if family == "qwen3" else make_dsv3(moe_router_load_balancing_type="global_aux_loss")
    plain, replayed = build_model(cfg, seed=0), build_model(cfg, seed=0)
    assert apply_recompute(replayed, section) == paths
    args = _args(cfg, rng)
    (la, ga), (lb, gb) = _grads(plain, args), _grads(replayed, args)
    assert la == lb
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    cells = {name: cell for name, cell in replayed.cells_and_names()}
    assert all(unit_replay.unit_of(cells[p]).replays == 1 for p in paths)  # replayed once in the one backward
    for pa, pb in zip(plain.get_parameters(), replayed.get_parameters()):  # in-place counters counted once
        np.testing.assert_array_equal(pa.asnumpy(), pb.asnumpy(), err_msg=pa.name)


def test_nothing_is_replayed_without_a_mode():
    from mftk.engine.recompute import apply_recompute

    model = build_model(make_qwen3(), seed=0)
    assert apply_recompute(model, Section(full_recompute_layer=["0-1"])) == []


# exclude_op: (family, section, excluded cells, cells of the same layers that are replayed)
EXCLUDED = [
    ("qwen3", Section(mode="full", full_recompute_layer=["0-1"], exclude_op={"*self_attention.linear_proj": ["0"]}),
     ["decoder.layers.0.self_attention.linear_proj"], ["decoder.layers.0.self_attention.linear_qkv",
                                                       "decoder.layers.0.mlp"]),
    ("qwen3", Section(mode="select", select_module={"mlp": ["0-1"]}, exclude_op={"mlp.linear_fc2": ["1"]}),
     ["decoder.layers.1.mlp.linear_fc2"], ["decoder.layers.1.mlp.linear_fc1"]),
    ("deepseek_v3", Section(mode="full", full_recompute_layer=["0-2"],  # the MoE layer's router and shared
                            exclude_op={"mlp.router": ["1"], "*shared_experts": ["1-2"]}),  # experts; MTP id 2
     ["decoder.layers.1.mlp.router", "decoder.layers.1.mlp.shared_experts",
      "mtp.layers.0.transformer_layer.mlp.shared_experts"],
     ["decoder.layers.1.self_attention", "mtp.layers.0.transformer_layer.self_attention"]),
]


@pytest.mark.parametrize("family,section,excluded,replayed", EXCLUDED)
def test_excluded_cells_run_once_the_others_are_replayed_and_the_gradients_are_the_plain_runs(
        rng, family, section, excluded, replayed):
    """The layers exclude_op lists are checkpointed (`engine.activation_checkpoint`), the other recomputed layers stay
    replayed units; an excluded cell's forward runs once (its outputs kept), its neighbours' twice (forward and
    replay), and the gradients and in-place counters are the plain run's."""
    from mftk.engine import activation_checkpoint, unit_replay
    from mftk.engine.recompute import apply_recompute, excluded_cells, excluding_layers

    cfg = make_qwen3() if family == "qwen3" else make_dsv3(moe_router_load_balancing_type="global_aux_loss")
    plain, model = build_model(cfg, seed=0), build_model(cfg, seed=0)
    calls = count_forwards(model, excluded + replayed)
    paths = apply_recompute(model, section)
    assert excluded_cells(model) == excluded
    cells = dict(model.cells_and_names())
    layers = excluding_layers(model, section)
    assert layers == {p.split(".mlp")[0].split(".self_attention")[0] for p in excluded}
    for p in paths:  # one mechanism per layer: hooks where exclude_op lists the layer, a replayed unit elsewhere
        hooked = any(p == layer or p.startswith(layer + ".") for layer in layers)
        assert (activation_checkpoint.of(cells[p]) is not None) == hooked and (unit_replay.unit_of(cells[p]) is not None) != hooked, p
    args = _args(cfg, rng)
    (la, ga), (lb, gb) = _grads(plain, args), _grads(model, args)
    assert la == lb
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert calls == {**{p: 1 for p in excluded}, **{p: 2 for p in replayed}}
    for p in paths:
        done = activation_checkpoint.of(cells[p]) or unit_replay.unit_of(cells[p])
        assert done.replays == 1, p
    for pa, pb in zip(plain.get_parameters(), model.get_parameters()):  # in-place counters counted once
        np.testing.assert_array_equal(pa.asnumpy(), pb.asnumpy(), err_msg=pa.name)


def test_exclude_op_that_matches_nothing_recomputed_names_its_path():
    from mftk.engine.recompute import apply_recompute
    from mftk.errors import ConfigError

    model = build_model(make_qwen3(), seed=0)
    section = Section(mode="select", select_module={"mlp": ["0-1"]}, exclude_op={"*linear_proj": ["1"]})
    with pytest.raises(ConfigError) as err:  # linear_proj is in the attention, which select does not replay
        apply_recompute(model, section)
    problem = err.value.problems[0]
    assert problem.path == "recompute.exclude_op.*linear_proj" and "layer 1" in problem.message


def test_exclude_op_is_ignored_without_a_mode_and_installs_once():
    from mftk.engine.recompute import apply_exclusions, apply_recompute, excluded_cells

    model = build_model(make_qwen3(), seed=0)
    assert apply_exclusions(model, Section(exclude_op={"*linear_proj": ["0"]})) == []  # mode None: as the reference
    section = Section(mode="full", full_recompute_layer=["0"], exclude_op={"*linear_proj": ["0"]})
    assert apply_exclusions(model, section) == ["decoder.layers.0.self_attention.linear_proj"]
    assert apply_recompute(model, section) == ["decoder.layers.0"]  # after parallelize's call: nothing twice
    assert excluded_cells(model) == ["decoder.layers.0.self_attention.linear_proj"]


def test_exclude_op_in_select_mode_checkpoints_every_selected_cell_of_its_layer(rng):
    """A layer exclude_op lists is one mechanism: each of its selected cells is checkpointed (the one without an
    exclusion too), the other layer's selected cell stays a replayed unit. A pattern naming a selected cell
    itself (not a cell inside it) is an error."""
    from mftk.engine import activation_checkpoint, unit_replay
    from mftk.engine.recompute import apply_recompute, excluded_cells
    from mftk.errors import ConfigError

    cfg = make_qwen3()
    select = {"mlp": ["0-1"], "self_attention": ["1"]}
    for bad in ({"mlp": ["0"]}, {"*self_attention": ["1"]}):
        with pytest.raises(ConfigError, match="matches no cell inside a recomputed one"):
            apply_recompute(build_model(cfg, seed=0), Section(mode="select", select_module=select, exclude_op=bad))
    section = Section(mode="select", select_module=select, exclude_op={"*linear_proj": ["1"], "*linear_qkv": ["1"]})
    plain, model = build_model(cfg, seed=0), build_model(cfg, seed=0)
    counted = ["decoder.layers.0.mlp.linear_fc1", "decoder.layers.1.mlp.linear_fc1",
               "decoder.layers.1.self_attention.linear_proj", "decoder.layers.1.self_attention.core_attention"]
    calls = count_forwards(model, counted)
    paths = apply_recompute(model, section)
    assert paths == ["decoder.layers.0.mlp", "decoder.layers.1.mlp", "decoder.layers.1.self_attention"]
    cells = dict(model.cells_and_names())
    assert [(bool(activation_checkpoint.of(cells[p])), bool(unit_replay.unit_of(cells[p]))) for p in paths] == [
        (False, True), (True, False), (True, False)]
    assert excluded_cells(model) == ["decoder.layers.1.self_attention.linear_qkv",
                                     "decoder.layers.1.self_attention.linear_proj"]
    args = _args(cfg, rng)
    (la, ga), (lb, gb) = _grads(plain, args), _grads(model, args)
    assert la == lb
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert calls == dict(zip(counted, [2, 2, 1, 2]))


def test_a_cell_inside_an_excluded_one_is_kept_with_it(rng):
    from mftk.engine.recompute import apply_recompute, excluded_cells

    cfg = make_qwen3()
    plain, model = build_model(cfg, seed=0), build_model(cfg, seed=0)
    calls = count_forwards(model, ["decoder.layers.0.self_attention.linear_proj", "decoder.layers.0.mlp"])
    apply_recompute(model, Section(mode="full", full_recompute_layer=["0-1"],
                                   exclude_op={"*linear_proj": ["0"], "self_attention": ["0"]}))
    assert excluded_cells(model) == ["decoder.layers.0.self_attention"]
    args = _args(cfg, rng)
    (la, ga), (lb, gb) = _grads(plain, args), _grads(model, args)
    assert la == lb
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert calls == {"decoder.layers.0.self_attention.linear_proj": 1, "decoder.layers.0.mlp": 2}


def test_exclude_op_on_deepseek_v4_keeps_the_core_attention_and_its_indexer_loss(rng):
    """DeepSeek-V4 (hyper-connections, hash routing, compressed attention whose indexer leaves a loss on its cell):
    the core attentions excluded in every layer (the common use: the attention kernel not run again) and layer
    2's attention hyper-connection too; the rest replayed; the plain run's loss, gradients and buffers."""
    from mftk.engine.recompute import apply_recompute, excluded_cells
    from tests.helpers.models import make_dsv4

    cfg = make_dsv4()
    plain, model = build_model(cfg, seed=0), build_model(cfg, seed=0)
    attn, proj = "decoder.layers.1.self_attention.core_attention", "decoder.layers.1.self_attention.linear_proj"
    calls = count_forwards(model, [attn, proj])
    apply_recompute(model, Section(mode="full", full_recompute_layer=["0-3"],
                                   exclude_op={"*core_attention": ["0-3"], "attn_hc": ["2"]}))
    assert attn in excluded_cells(model) and "decoder.layers.2.attn_hc" in excluded_cells(model)
    assert len(excluded_cells(model)) == 5
    ids = rng.integers(1, cfg.vocab_size, (2, cfg.seq_length))  # the compressed attention needs its seq_length
    args = ids, np.roll(ids, -1, 1), np.ones(ids.shape, np.float32)
    (la, ga), (lb, gb) = _grads(plain, args), _grads(model, args)
    assert la == lb
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert calls == {attn: 1, proj: 2}
    for pa, pb in zip(plain.get_parameters(), model.get_parameters()):
        np.testing.assert_array_equal(pa.asnumpy(), pb.asnumpy(), err_msg=pa.name)
