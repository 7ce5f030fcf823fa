"""Muon against a float64 NumPy transcription of mindformers-2.1.md §4.4–§4.6 (written here, independently):
momentum/Nesterov, the split rules, Newton–Schulz with the YAML's coefficients in both forms, the
AdamW fallback, weight decay and QK-clip; the state names and a bit-exact save/load."""
from __future__ import annotations

import types

import numpy as np
import pytest

from mftk.config.optimizer_muon import ns_schedule
from mftk.engine.muon import Muon, QKClip, split_rules
from mftk.engine.optim import decide_weight_decay
from mftk.errors import CheckpointError

NH, NOPE, ROPE, V, QR, KVR, E, H, F = 2, 3, 2, 4, 5, 6, 3, 4, 2
CFG = types.SimpleNamespace(kv_lora_rank=KVR, num_attention_heads=NH, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
                            v_head_dim=V, q_lora_rank=QR)
SHAPES = {
    "embedding.word_embeddings.weight": (7, H),
    "decoder.layers.0.input_layernorm.weight": (H,),
    "decoder.layers.0.self_attention.linear_qkv.weight": (QR + KVR + ROPE, H),
    "decoder.layers.0.self_attention.linear_qb.weight": (NH * (NOPE + ROPE), QR),
    "decoder.layers.0.self_attention.linear_kvb.weight": (NH * (NOPE + V), KVR),
    "decoder.layers.0.self_attention.linear_proj.weight": (H, NH * V),
    "decoder.layers.0.mlp.linear_fc1.weight": (2 * F, H),
    "decoder.layers.1.mlp.experts.weight1": (E, H, 2 * F),
    "decoder.layers.1.mlp.experts.weight2": (E, F, H),
    "decoder.layers.1.mlp.router.weight": (E, H),
    "output_layer.weight": (7, H),
}
FLAT = [3.4445, -4.7750, 2.0315]
SEGMENTED = [[[3.4445, -4.7750, 2.0315], 8], [[2.0, -1.5, 0.5], 2]]


# ------------------------------------------------------------------------------------------------ the reference
def ref_ns(x, coeffs, eps):
    """§4.4 for one matrix, float64: transpose if tall, normalise by max(‖X‖_F, eps), iterate, transpose back."""
    a, b = x.shape
    if a > b:
        x = x.T
    x = x / max(np.linalg.norm(x), eps)
    for ka, kb, kc in coeffs:
        A = x @ x.T
        x = ka * x + (kb * A + kc * A @ A) @ x
    return (x.T if a > b else x) * np.sqrt(max(a, b))


def ref_pieces(name, u):
    """§4.5 by hand: the list of (index, matrix) pieces of the update u."""
    if name.endswith("experts.weight1"):
        return [((e, slice(None), half), u[e][:, half]) for e in range(u.shape[0])
                for half in (slice(0, F), slice(F, 2 * F))]
    if name.endswith("experts.weight2"):
        return [((e,), u[e]) for e in range(u.shape[0])]
    if name.endswith("linear_fc1.weight"):
        return [((slice(0, None, 2),), u[0::2]), ((slice(1, None, 2),), u[1::2])]
    if name.endswith("linear_qb.weight") or name.endswith("linear_kvb.weight"):
        first = NOPE
        second = ROPE if "linear_qb" in name else V
        rows = np.arange(u.shape[0]).reshape(NH, first + second)
        a, b = rows[:, :first].reshape(-1), rows[:, first:].reshape(-1)
        return [((a,), u[a]), ((b,), u[b])]
    if name.endswith("linear_qkv.weight"):
        edges = np.cumsum([0, QR, KVR, ROPE])
        return [((slice(lo, hi),), u[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])]
    return [((Ellipsis,), u)]


def ref_step(state, grads, lr, t, *, wd, coeffs, mu=0.95, nesterov=True, rms=0.2, eps=1e-8, betas=(0.95, 0.95),
             adam_eps=1e-8, qk=None):
    for name, g in grads.items():
        p = state["p"][name]
        decay = wd if (len(p.shape) > 1 and not name.endswith(".bias")) else 0.0
        p *= 1 - lr * decay
        if len(p.shape) in (2, 3) and "word_embeddings" not in name and "output_layer" not in name:
            m = state["m"][name] = mu * state["m"][name] + g
            u = g + mu * m if nesterov else m
            out = np.zeros_like(u)
            for idx, piece in ref_pieces(name, u):
                out[idx] = ref_ns(piece, coeffs, eps)
            p -= lr * rms * out
        else:
            b1, b2 = betas
            m = state["m"][name] = b1 * state["m"][name] + (1 - b1) * g
            v = state["v"][name] = b2 * state["v"][name] + (1 - b2) * g * g
            p -= (lr / (1 - b1 ** t)) * m / (np.sqrt(v / (1 - b2 ** t)) + adam_eps)
    if qk is not None:  # §4.6: s_h = τ / max(m_h, τ); nope rows ×√s, rope rows ×s; kvb k-nope rows ×√s
        tau, logits = qk
        s = tau / np.maximum(logits, tau)
        qb = state["p"]["decoder.layers.0.self_attention.linear_qb.weight"].reshape(NH, NOPE + ROPE, -1)
        qb[:, :NOPE] *= np.sqrt(s)[:, None, None]
        qb[:, NOPE:] *= s[:, None, None]
        kvb = state["p"]["decoder.layers.0.self_attention.linear_kvb.weight"].reshape(NH, NOPE + V, -1)
        kvb[:, :NOPE] *= np.sqrt(s)[:, None, None]


# ------------------------------------------------------------------------------------------------ tests
def _setup(rng, coeffs, wd=0.1, **kw):
    names = list(SHAPES)
    arrays = [rng.normal(0, 0.5, SHAPES[n]).astype(np.float32) for n in names]
    decisions = decide_weight_decay([(n, SHAPES[n]) for n in names], wd)
    opt = Muon(names, arrays, decisions, schedule=ns_schedule(coeffs, 5), splits=split_rules(CFG), **kw)
    state = {"p": {n: a.astype(np.float64) for n, a in zip(names, arrays)},
             "m": {n: np.zeros(SHAPES[n]) for n in names}, "v": {n: np.zeros(SHAPES[n]) for n in names}}
    return opt, state


def _flat(opt, grads):
    g = opt.grad_buffer()
    opt.put_grads(g, [grads[n] for n in opt.names])
    return g


@pytest.mark.parametrize("coeffs,nesterov", [(FLAT, True), (SEGMENTED, True), (SEGMENTED, False)],
                         ids=["flat", "segmented", "segmented-no-nesterov"])
def test_muon_matches_float64_transcription(coeffs, nesterov):
    rng = np.random.default_rng(0)
    opt, state = _setup(rng, coeffs, nesterov=nesterov)
    for t in range(1, 4):
        grads = {n: rng.normal(0, 1, s).astype(np.float32) for n, s in SHAPES.items()}
        opt.step(_flat(opt, grads), 0.02)
        ref_step(state, {n: g.astype(np.float64) for n, g in grads.items()}, 0.02, t, wd=0.1,
                 coeffs=ns_schedule(coeffs, 5), nesterov=nesterov)
    for n, m in zip(opt.names, opt.masters()):
        assert np.allclose(m, state["p"][n], rtol=1e-4, atol=1e-5), n
    assert opt.global_step == 3
    assert sorted(opt.muon_names()) == sorted(n for n in SHAPES if len(SHAPES[n]) > 1 and "word_emb" not in n
                                              and "output_layer" not in n)


def test_newton_schulz_orthogonalises():
    """With the YAML's segmented coefficients the singular values of the update are pulled towards 1."""
    from mftk.engine.muon import orthogonalise

    x = np.random.default_rng(1).normal(0, 1, (6, 10)).astype(np.float32)
    o = orthogonalise(x, ns_schedule(SEGMENTED, 5), 1e-8) / np.sqrt(10)
    sv = np.linalg.svd(o, compute_uv=False)
    assert 0.6 < sv.min() and sv.max() < 1.25


def test_qk_clip_rescales_the_masters_per_head():
    rng = np.random.default_rng(2)
    logits = np.array([250.0, 40.0])  # head 0 above τ = 100, head 1 below
    qk = QKClip(CFG, 100.0, lambda: {"decoder.layers.0.self_attention.": logits})
    opt, state = _setup(rng, SEGMENTED, qk_clip=qk)
    grads = {n: rng.normal(0, 1, s).astype(np.float32) for n, s in SHAPES.items()}
    opt.step(_flat(opt, grads), 0.02)
    ref_step(state, {n: g.astype(np.float64) for n, g in grads.items()}, 0.02, 1, wd=0.1,
             coeffs=ns_schedule(SEGMENTED, 5), qk=(100.0, logits))
    for n, m in zip(opt.names, opt.masters()):
        assert np.allclose(m, state["p"][n], rtol=1e-4, atol=1e-5), n


def test_state_names_and_bit_exact_resume():
    rng = np.random.default_rng(3)
    grads = [{n: rng.normal(0, 1, s).astype(np.float32) for n, s in SHAPES.items()} for _ in range(4)]
    a, _ = _setup(np.random.default_rng(4), SEGMENTED)
    for g in grads:
        a.step(_flat(a, g), 0.01)
    b, _ = _setup(np.random.default_rng(4), SEGMENTED)
    for g in grads[:2]:
        b.step(_flat(b, g), 0.01)
    saved = b.state_dict(with_masters=True)
    assert "muon_m.decoder.layers.1.mlp.experts.weight1" in saved and "adam_m.output_layer.weight" in saved
    assert "adam_v.decoder.layers.0.input_layernorm.weight" in saved and "global_step" in saved
    assert not any(k.startswith("adam_m.decoder.layers.1.mlp.experts") for k in saved)
    c, _ = _setup(np.random.default_rng(99), SEGMENTED)
    c.load_state_dict(saved)
    for g in grads[2:]:
        c.step(_flat(c, g), 0.01)
    assert all(np.array_equal(x, y) for x, y in zip(a.masters(), c.masters()))
    assert all(np.array_equal(a.state_dict()[k], c.state_dict()[k]) for k in a.state_dict())


def test_loading_adamw_states_into_muon_says_so():
    from mftk.engine.optim import AdamW

    rng = np.random.default_rng(5)
    names = list(SHAPES)
    arrays = [rng.normal(0, 1, SHAPES[n]).astype(np.float32) for n in names]
    adam = AdamW(names, arrays, decide_weight_decay([(n, SHAPES[n]) for n in names], 0.1))
    muon, _ = _setup(rng, FLAT)
    with pytest.raises(CheckpointError, match="Muon") as e:
        muon.load_state_dict(adam.state_dict())
    assert "AdamW states only" in e.value.message and "--weights-only" in e.value.hint
    assert "missing tensor: muon_m." in "\n".join(e.value.problems)


def test_other_3d_weights_are_refused():
    with pytest.raises(ValueError, match="grouped experts"):
        Muon(["lora.weight"], [np.zeros((2, 3, 4), np.float32)], decide_weight_decay([("lora.weight", (2, 3, 4))], 0.0),
             schedule=ns_schedule(FLAT, 5))


@pytest.mark.parametrize("value,steps,message", [
    ([1.0, 2.0], 5, "exactly three"), ([1.0, 2.0, 3.0], 0, "ns_steps must be > 0"),
    ([[[1.0, 2.0], 3]], 5, "three numbers"), ([[[1.0, 2.0, 3.0], 0]], 5, "step count must be > 0"),
    ([[[1.0, 2.0, 3.0]]], 5, "segment 0"), ([], 5, "non-empty")])
def test_ns_coefficient_errors(value, steps, message):
    with pytest.raises(ValueError, match=message):
        ns_schedule(value, steps)


def test_ns_coefficient_forms():
    assert ns_schedule(FLAT, 3) == [tuple(FLAT)] * 3
    seg = ns_schedule(SEGMENTED, 99)  # ns_steps is ignored by the segmented form
    assert len(seg) == 10 and seg[0] == tuple(FLAT) and seg[-1] == (2.0, -1.5, 0.5)


def test_expert_parallel_shards_give_the_single_process_update():
    """Expert parallel: each rank holds whole experts (a block of dim 0 of ``weight1``/``weight2``) and its Muon
    orthogonalises each of its own expert matrices; the ranks' masters, put side by side, are those of one
    process holding every expert (the split rules and Newton–Schulz act per expert)."""
    rng = np.random.default_rng(3)
    e, ep = 4, 2
    shapes = {"decoder.layers.0.mlp.experts.weight1": (e, H, 2 * F), "decoder.layers.0.mlp.experts.weight2": (e, F, H)}
    names = list(shapes)
    arrays = [rng.normal(0, 0.5, shapes[n]).astype(np.float32) for n in names]
    grads = [[rng.normal(0, 1, shapes[n]).astype(np.float32) for n in names] for _ in range(3)]
    decisions = decide_weight_decay([(n, shapes[n]) for n in names], 0.1)

    def muon(block):
        parts = [a[block] for a in arrays]
        opt = Muon(names, parts, decisions, schedule=ns_schedule(SEGMENTED, 5), splits=split_rules(CFG),
                   full_shapes=[shapes[n] for n in names])
        for step in grads:
            g = opt.grad_buffer()
            opt.put_grads(g, [s[block] for s in step])
            opt.step(g, 0.02)
        return opt.masters()

    whole = muon(slice(None))
    ranks = [muon(slice(r * e // ep, (r + 1) * e // ep)) for r in range(ep)]
    for i, n in enumerate(names):
        np.testing.assert_array_equal(np.concatenate([r[i] for r in ranks]), whole[i], err_msg=n)
    state = {"p": {n: a.astype(np.float64) for n, a in zip(names, arrays)},
             "m": {n: np.zeros(shapes[n]) for n in names}, "v": {}}
    for step in grads:  # and both are the float64 transcription's
        ref_step(state, {n: g.astype(np.float64) for n, g in zip(names, step)}, 0.02, 0, wd=0.1,
                 coeffs=ns_schedule(SEGMENTED, 5))
    for i, n in enumerate(names):
        assert np.allclose(whole[i], state["p"][n], rtol=1e-4, atol=1e-5), n


def test_state_kinds_name_the_saved_states():
    """`state_kinds` (what metadata.json lists for every stage's parameters) is what `state_dict` writes."""
    opt, _ = _setup(np.random.default_rng(1), FLAT)
    saved = set(opt.state_dict())
    listed = {f"{k}.{n}" for n in SHAPES for k in opt.state_kinds(n, SHAPES[n])} | {"global_step"}
    assert saved == listed
    assert opt.state_kinds("decoder.layers.0.mlp.linear_fc1.weight", (4, 4)) == ("muon_m",)
    assert opt.state_kinds("embedding.word_embeddings.weight", (7, 4)) == ("adam_m", "adam_v")


def test_gathered_splits_undo_tp_and_fsdp_and_keep_expert_blocks():
    """Under TP and FSDP Muon gathers every block (innermost first) and cuts its rank's block back as the
    placement table cuts (`Placement.cut`); expert parallel's split of the expert dimension stays (each rank
    orthogonalises its own experts), and only as the outermost split."""
    from mftk.engine.muon import cut_blocks, gathered_splits
    from mftk.engine.parallel.placement import Placement

    assert gathered_splits(((0, "tp"), (0, "fsdp"))) == ((0, "tp"), (0, "fsdp"))
    assert gathered_splits(((0, "ep"), (2, "tp"))) == ((2, "tp"),)
    with pytest.raises(ValueError, match="expert parallel inside"):
        gathered_splits(((1, "tp"), (0, "ep")))
    g = types.SimpleNamespace(tp=types.SimpleNamespace(size=2, rank=1), fsdp=types.SimpleNamespace(size=2, rank=0),
                              ep=types.SimpleNamespace(size=1, rank=0))
    full = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    for splits in (((0, "tp"), (0, "fsdp")), ((1, "tp"), (0, "fsdp"))):
        want = Placement(name="w", shape=full.shape, dtype="float32", trainable=True, splits=splits).cut(full, g)
        np.testing.assert_array_equal(cut_blocks(full, splits, g), want)
    np.testing.assert_array_equal(cut_blocks(full, ((0, "tp"), (0, "fsdp")), g), full[4:6])
    np.testing.assert_array_equal(cut_blocks(full, ((1, "tp"), (0, "fsdp")), g), full[:4, 3:])
