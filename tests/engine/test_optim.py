"""AdamW against an independent float64 per-parameter implementation (and torch when installed);
weight-decay groups; clipping; optimizer state round trip."""
import numpy as np
import pytest

from mftk.engine.optim import AdamW, clip_factor, decide_weight_decay, global_norm
from mftk.errors import CheckpointError

SHAPES = {"a.weight": (4, 3), "a.bias": (4,), "norm.weight": (3,), "b.weight": (2, 4)}


def make(wd=0.1, betas=(0.9, 0.95), eps=1e-8):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=s).astype(np.float32) for s in SHAPES.values()]
    dec = decide_weight_decay(list(SHAPES.items()), wd)
    return AdamW(list(SHAPES), arrays, dec, betas=betas, eps=eps), arrays


def reference_adamw(p, grads, lrs, wd, b1, b2, eps):
    """Textbook decoupled AdamW in float64 (reference §2.7), one parameter at a time."""
    p = p.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr / (1 - b1 ** t) * m / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


def test_update_matches_independent_implementation():
    opt, arrays = make()
    rng = np.random.default_rng(1)
    steps = [[rng.normal(size=s).astype(np.float32) for s in SHAPES.values()] for _ in range(5)]
    lrs = [0.01, 0.02, 0.03, 0.02, 0.01]
    for grads, lr in zip(steps, lrs):
        flat = opt.zeros_like_flat()
        opt.add_grads(flat, grads)
        opt.step(flat, lr)
    assert opt.global_step == 5
    for i, (name, shape) in enumerate(SHAPES.items()):
        wd = 0.1 if name in ("a.weight", "b.weight") else 0.0
        want = reference_adamw(arrays[i], [s[i] for s in steps], lrs, wd, 0.9, 0.95, 1e-8)
        np.testing.assert_allclose(opt.masters()[i], want, rtol=2e-6, atol=2e-7)


def test_matches_torch_adamw_when_available():
    torch = pytest.importorskip("torch")
    opt, arrays = make()
    params = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    decay = [p for p, n in zip(params, SHAPES) if n in ("a.weight", "b.weight")]
    plain = [p for p, n in zip(params, SHAPES) if n not in ("a.weight", "b.weight")]
    topt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}],
                             lr=0.01, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(2)
    for _ in range(3):
        grads = [rng.normal(size=s).astype(np.float32) for s in SHAPES.values()]
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g)
        topt.step()
        flat = opt.zeros_like_flat()
        opt.add_grads(flat, grads)
        opt.step(flat, 0.01)
    for mine, theirs in zip(opt.masters(), params):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_weight_decay_groups_and_priority():
    params = [("emb.weight", (8, 4)), ("layer.bias", (4,)), ("norm.weight", (4,)), ("lin.bias", (4, 4)),
              ("router.weight", (4, 4)), ("head.weight", (8, 4))]
    dec = {d.name: d for d in decide_weight_decay(params, 0.01, include=["norm.*"], exclude=["router", "*emb*"])}
    assert dec["emb.weight"].weight_decay == 0.0 and "exclude" in dec["emb.weight"].reason   # glob
    assert dec["router.weight"].weight_decay == 0.0                                           # substring
    assert dec["norm.weight"].weight_decay == 0.01 and "include" in dec["norm.weight"].reason  # include beats 1-D
    assert dec["layer.bias"].reason == "1-D parameter"
    assert dec["lin.bias"].reason == "bias"
    assert dec["head.weight"].weight_decay == 0.01 and dec["head.weight"].reason == "default"
    line = dec["head.weight"].log_line()
    assert line == "param_name: " + "head.weight".ljust(60) + " | weight_decay:   0.0100 | reason: default"


def test_include_beats_exclude():
    (d,) = decide_weight_decay([("x.weight", (2, 2))], 0.1, include=["x.weight"], exclude=["x.weight"])
    assert d.weight_decay == 0.1


def test_gradient_accumulation_scale():
    opt, _ = make()
    flat = opt.zeros_like_flat()
    g = [np.ones(s, np.float32) for s in SHAPES.values()]
    opt.add_grads(flat, g, 0.5)
    opt.add_grads(flat, g, 0.5)
    np.testing.assert_array_equal(flat, np.ones_like(flat))


def test_norm_and_clip():
    g = np.array([3.0, 4.0], np.float32)
    assert global_norm(g) == pytest.approx(5.0)
    assert clip_factor(5.0, 1.0) == pytest.approx(1.0 / (5.0 + 1e-6))
    assert clip_factor(0.5, 1.0) == 1.0
    assert clip_factor(5.0, 0.0) == 1.0   # reference would zero the gradients; mftk disables clipping
    assert clip_factor(5.0, -1.0) == 1.0  # reference would flip them


def test_state_round_trip_and_names():
    opt, _ = make()
    flat = opt.zeros_like_flat() + 1
    opt.step(flat, 0.1)
    sd = opt.state_dict()
    assert set(sd) == {f"adam_{k}.{n}" for k in "mv" for n in SHAPES} | {"global_step"}
    assert sd["global_step"].dtype == np.int64 and sd["global_step"].tolist() == [1]
    assert sd["adam_m.a.weight"].dtype == np.float32 and sd["adam_m.a.weight"].shape == (4, 3)
    fresh, _ = make()
    fresh.load_state_dict(sd)
    fresh.set_masters(opt.masters())
    opt.step(flat, 0.1)
    fresh.step(flat, 0.1)
    np.testing.assert_array_equal(opt.master, fresh.master)


def test_state_mismatch_is_an_error():
    opt, _ = make()
    sd = opt.state_dict()
    del sd["adam_v.b.weight"]
    sd["adam_m.zzz"] = np.zeros(1, np.float32)
    with pytest.raises(CheckpointError) as e:
        make()[0].load_state_dict(sd)
    assert any("adam_v.b.weight" in p for p in e.value.problems)
    assert any("adam_m.zzz" in p for p in e.value.problems)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threaded_update_is_bit_identical(monkeypatch, threads):
    """Chunks shared out to threads: every element's arithmetic is the same, so the bits are too
    (a small CHUNK makes several chunks per thread, crossing the decay boundary mid-way)."""
    import mftk.engine.optim as optim

    rng = np.random.default_rng(3)
    grads = [rng.normal(size=(sum(int(np.prod(s)) for s in SHAPES.values()),)).astype(np.float32) for _ in range(3)]
    results = []
    for n in (1, threads):
        monkeypatch.setattr(optim, "CHUNK", 5)
        monkeypatch.setattr(optim, "UPDATE_THREADS", n)
        opt, _ = make()
        assert len(opt._scratch) == n
        for g in grads:
            opt.step(g.copy(), 1e-2)
        results.append((opt.master.copy(), opt.m.copy(), opt.v.copy()))
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_global_norm_equals_float64_norm():
    rng = np.random.default_rng(4)
    g = rng.normal(size=(3 * (1 << 16) + 17,)).astype(np.float32)
    assert global_norm(g) == pytest.approx(float(np.sqrt((g.astype(np.float64) ** 2).sum())), rel=1e-6)
