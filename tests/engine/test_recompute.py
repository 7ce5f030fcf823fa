"""Activation recompute (`engine.recompute`): the replayed layers and cells give the gradients of the run without
recompute (1e-6), on both families (GQA, MLA, MoE with its in-place counters, MTP), full and select modes, and
the replayed units really are replayed (each once per backward)."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.engine.models.build import build_model
from tests.helpers.models import RecomputeSection as Section
from tests.helpers.models import lm_args as _args
from tests.helpers.models import make_dsv3, make_qwen3
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
    from mftk.engine import units
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
    assert all(units.unit_of(cells[p]).replays == 1 for p in paths)  # replayed once in the one backward
    for pa, pb in zip(plain.get_parameters(), replayed.get_parameters()):  # in-place counters counted once
        np.testing.assert_array_equal(pa.asnumpy(), pb.asnumpy(), err_msg=pa.name)


def test_nothing_is_replayed_without_a_mode():
    from mftk.engine.recompute import apply_recompute

    model = build_model(make_qwen3(), seed=0)
    assert apply_recompute(model, Section(full_recompute_layer=["0-1"])) == []
