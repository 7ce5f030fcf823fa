"""FSDP units in one process (`parallel.fsdp`, a trivial FSDP group: each row block is the whole tensor), so the
mechanism is checked without msrun: a unit that keeps its activations gives the gradients of the plain run
(1e-6), never replays its forward, stores its gathered weights as handles (gathered once more in its backward,
not kept), and puts its gradients straight into the trainer's flat buffer (`GradSink`); a unit recompute
selects replays instead (`recompute.replayed_layers`). The msrun equality tests (tests/commands) check the
same against one process with real shards."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.engine.models.build import build_model
from tests.helpers.models import RecomputeSection as Section
from tests.helpers.models import lm_args as _args
from tests.helpers.models import count_forwards, make_qwen3, ms
from tests.helpers.models import value_and_grads as _grads

pytestmark = pytest.mark.engine


class _Row:
    trainable, expert, stages = True, False, (0,)

    def split_over(self, axis: str) -> bool:
        return axis == "fsdp"


class _Table(dict):
    def __missing__(self, key):
        return _Row()


def _assert_plain_grads(plain, model, args) -> None:
    """The loss and every gradient of ``model`` equal those of the plain run (1e-6)."""
    (la, ga), (lb, gb) = _grads(plain, args), _grads(model, args)
    np.testing.assert_allclose(lb, la, rtol=1e-6)
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


def _groups():
    from mftk.engine.parallel.groups import AxisGroup

    one = AxisGroup(name="", ranks=(0,), rank=0)

    class G:
        fsdp = tp = dp_cp = one
    return G()


def _fsdp_model(cfg, replay=()):
    from mftk.engine.parallel import fsdp

    model = build_model(cfg, seed=0)
    sink = fsdp.GradSink()
    names = fsdp.apply_fsdp(model, _groups(), _Table(), replay=replay, sink=sink)
    return model, names, sink


def test_kept_units_give_the_plain_gradients_without_replaying(rng):
    from mftk.engine import unit_replay
    from mftk.engine.parallel import fsdp

    cfg = make_qwen3()
    plain = build_model(cfg, seed=0)
    model, names, _ = _fsdp_model(cfg)
    assert names == ["embedding", "output_layer"] + [f"decoder.layers.{i}" for i in range(cfg.num_hidden_layers)]
    cells = dict(model.cells_and_names())
    hooks = [fsdp.kept_hooks(cells[n]) for n in names if n != "output_layer"] + [fsdp.kept_hooks(model.loss)]
    assert all(h is not None for h in hooks) and not any(unit_replay.unit_of(c) for c in cells.values())
    regathers = []
    for h in hooks:  # count the backward's gathers: one per unit, and only there
        original = h._unpack

        def counting(packed, h=h, original=original):
            if isinstance(packed, tuple) and packed[0] == fsdp._WEIGHT and h._again is None:
                regathers.append(h)
            return original(packed)
        h._unpack = counting
    args = _args(cfg, rng)
    _assert_plain_grads(plain, model, args)
    # every unit whose backward reads its weights saved handles and gathered them once (the embedding's
    # lookup backward reads only the ids: never gathered again)
    assert sorted(map(id, regathers)) == sorted(map(id, hooks[1:]))
    assert all(h._again is None and not h._live for h in hooks)  # nothing gathered left behind


def test_kept_units_draw_the_plain_runs_dropout_masks(rng):
    """A kept unit runs its forward once, so with dropout on it draws the same masks as the plain model from the
    same seed and its gradients are the plain run's (why FSDP allows hidden_dropout; recompute still refuses it)."""
    cfg = make_qwen3(hidden_dropout=0.2)
    plain, (model, _, _) = build_model(cfg, seed=0), _fsdp_model(cfg)
    plain.set_train(True)
    model.set_train(True)
    args = _args(cfg, rng)
    ms.set_seed(5)
    la, ga = _grads(plain, args)
    ms.set_seed(6)
    other, _ = _grads(plain, args)
    assert abs(other - la) > 1e-4  # dropout is on: another seed draws other masks
    ms.set_seed(5)
    lb, gb = _grads(model, args)
    np.testing.assert_allclose(lb, la, rtol=1e-6)
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


def test_units_recompute_selects_replay(rng):
    from mftk.engine import unit_replay
    from mftk.engine.recompute import replayed_layers

    cfg = make_qwen3()
    section = Section(mode="select", select_module={"mlp": ["1"]}, full_recompute_layer=["0"])
    replay = replayed_layers(build_model(cfg, seed=0), section)
    assert replay == {"decoder.layers.0", "decoder.layers.1"}
    plain = build_model(cfg, seed=0)
    model, _, _ = _fsdp_model(cfg, replay)
    cells = dict(model.cells_and_names())
    args = _args(cfg, rng)
    _assert_plain_grads(plain, model, args)
    assert [unit_replay.unit_of(cells[p]).replays for p in sorted(replay)] == [1, 1]



def test_a_layer_exclude_op_lists_is_a_kept_unit_replaying_with_its_weights_gathered_again(rng):
    """exclude_op under FSDP: the layer it lists is checkpointed before FSDP (as `parallelize` does) and becomes a
    kept unit whose checkpoint replays with the unit's weights gathered again (`FsdpHooks.regathered`), the
    excluded cell running once; the other recomputed layer stays a replaying unit; the gradients are the plain
    run's."""
    from mftk.engine import activation_checkpoint, unit_replay
    from mftk.engine.parallel import fsdp
    from mftk.engine.recompute import apply_exclusions, apply_recompute, replayed_layers

    cfg = make_qwen3()
    section = Section(mode="full", full_recompute_layer=["0-1"], exclude_op={"*self_attention.linear_proj": ["0"]})
    plain, model = build_model(cfg, seed=0), build_model(cfg, seed=0)
    proj, qkv, mlp1 = ("decoder.layers.0.self_attention.linear_proj", "decoder.layers.0.self_attention.linear_qkv",
                       "decoder.layers.1.mlp")
    calls = count_forwards(model, [proj, qkv, mlp1])
    assert apply_exclusions(model, section) == [proj]
    replay = replayed_layers(model, section)
    assert replay == {"decoder.layers.1"}
    fsdp.apply_fsdp(model, _groups(), _Table(), replay=replay, sink=fsdp.GradSink())
    assert apply_recompute(model, section) == ["decoder.layers.0", "decoder.layers.1"]
    cells = dict(model.cells_and_names())
    layer0, layer1 = cells["decoder.layers.0"], cells["decoder.layers.1"]
    hooks, ck = fsdp.kept_hooks(layer0), activation_checkpoint.of(layer0)
    assert hooks is not None and ck is not None and unit_replay.unit_of(layer0) is None
    assert unit_replay.unit_of(layer1) is not None and fsdp.kept_hooks(layer1) is None
    regathers = []
    original = ck.around_replay

    def counting():
        regathers.append(1)
        return original()
    ck.around_replay = counting
    args = _args(cfg, rng)
    _assert_plain_grads(plain, model, args)
    assert calls == {proj: 1, qkv: 2, mlp1: 2}  # the excluded cell not replayed; the others of both layers are
    assert regathers == [1] and ck.replays == 1 and unit_replay.unit_of(layer1).replays == 1
    assert hooks._again is None and not hooks._live  # nothing gathered left behind

def test_units_put_their_gradients_in_the_flat_buffer(rng):
    from mftk.engine.optim import AdamW, decide_weight_decay

    cfg = make_qwen3()
    plain = build_model(cfg, seed=0)
    model, _, sink = _fsdp_model(cfg)
    params = list(model.trainable_params())
    opt = AdamW([p.name for p in params], [p.asnumpy() for p in params],
                decide_weight_decay([(p.name, tuple(p.shape)) for p in params], 0.1))
    sink.bind(params, opt)
    args = _args(cfg, rng)
    _, want = _grads(plain, args)
    flat = opt.grad_buffer()
    for first, scale in ((True, 0.5), (False, 0.5)):  # two micro-batches, each scaled by 1/2
        sink.begin(flat, scale, first)
        _, grads = ms.value_and_grad(model, None, params, has_aux=True)(*args)
        done = sink.end()
        assert done and all(np.shares_memory(grads[i].asnumpy(), flat) for i in done)  # no copy beside it
        opt.put_grads(flat, [None if i in done else g.asnumpy() for i, g in enumerate(grads)], scale) if first \
            else opt.add_grads(flat, [None if i in done else g.asnumpy() for i, g in enumerate(grads)], scale)
    for i, w in enumerate(want):
        np.testing.assert_allclose(opt.view(flat, i), w, rtol=1e-5, atol=1e-7)


def test_release_frees_the_build_parameters_fsdp_replaced():
    """The built Parameters FSDP replaces with row blocks sit in reference cycles, so only a full collection
    frees them; `memstat.release_freed_memory` runs one before the trim (bench/memory.py's 220M fsdp2 run kept its
    838 MiB build through every step before)."""
    import gc
    import weakref

    from mftk.engine.memstat import release_freed_memory
    from mftk.engine.parallel import fsdp

    model = build_model(make_qwen3(), seed=0)
    built = [weakref.ref(p) for p in model.trainable_params()]
    enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: what is freed, the call freed
    try:
        fsdp.apply_fsdp(model, _groups(), _Table(), sink=fsdp.GradSink())
        now = {id(p) for p in model.trainable_params()}
        replaced = [r for r in built if r() is None or id(r()) not in now]  # cut into new Parameters (rows)
        assert len(replaced) > len(built) // 2
        assert all(r() is not None for r in replaced)  # nothing refers to them but their cycles
        release_freed_memory()
        assert [r for r in replaced if r() is not None] == []
    finally:
        if enabled:
            gc.enable()


def test_exclude_op_checkpoints_leave_nothing_behind_from_step_to_step(rng, monkeypatch):
    """MindSpore keeps a recorded graph whose backward never ran, with its inputs, for good: the checkpoint runs its
    replay's (empty) backward (`engine.activation_checkpoint`), or a run would grow by its layers' gathered weights every step.
    Deterministic here: every replay's recorded graph is released by its backward, once, in every step. What
    leaving it out costs in memory (a layer's gathered weights per step) is measured by
    `bench/memory_guards.py --fsdp-replay`, not asserted on the process's RSS."""
    from mftk.engine import activation_checkpoint as ckpt_module
    from mftk.engine.parallel import fsdp
    from mftk.engine.recompute import apply_exclusions, replayed_layers

    graphs = []
    real_vjp = ckpt_module.ms.vjp

    def vjp(*args, **kwargs):
        out, release = real_vjp(*args, **kwargs)
        graph = {"released": 0}
        graphs.append(graph)

        def counted(*a):
            graph["released"] += 1
            return release(*a)
        return out, counted

    cfg = make_qwen3()
    section = Section(mode="full", full_recompute_layer=["0-1"], exclude_op={"*linear_proj": ["0-1"]})
    model = build_model(cfg, seed=0)
    apply_exclusions(model, section)
    assert replayed_layers(model, section) == set()  # both layers: kept units with their checkpoints
    fsdp.apply_fsdp(model, _groups(), _Table(), sink=fsdp.GradSink())
    args = _args(cfg, rng)
    monkeypatch.setattr(ckpt_module.ms, "vjp", vjp)
    for step in range(3):
        _grads(model, args)
        assert len(graphs) == 2 * (step + 1)  # one replay per layer per step
        assert [g["released"] for g in graphs] == [1] * len(graphs)
