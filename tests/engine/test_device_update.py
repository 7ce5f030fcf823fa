"""The device-resident update (``mftk.update_on_device``, `engine.device_optim`) against the host path.

- the fused update, the norm and the clip against float64 NumPy, and against the host AdamW, per step;
- a checkpoint's optimizer state round-trips bit-exactly between the two optimizer classes;
- 5 steps of qwen3_tiny (2 micro-batches a step, clipping active) on both paths: the same losses and grad
  norms (1e-6 relative), checkpoints with the same tensor names, shapes and dtypes, and each path resumes the
  other's checkpoint and continues the uninterrupted run (the device path resumes its own bit-exactly);
- the selection rule (null: host on CPU, device on GPU/Ascend unless refused) and the refused combinations.
The multi-process runs are in tests/commands/test_train_device_update.py.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

from mftk.engine.optim import AdamW, decide_weight_decay
from tests.helpers.msrun import run_single
from tests.helpers.tiny import load, tiny_raw

pytestmark = pytest.mark.engine
REL = 1e-6
SHAPES = {"w.weight": (48, 40), "b.bias": (40,), "norm.weight": (40,), "e.weight": (70, 33)}
BETAS, EPS, WD = (0.9, 0.95), 1e-8, 0.1


# ------------------------------------------------------------------------------- the update itself
def _reference(p, m, v, g, lr, t, wd):
    """The reference's AdamW step in float64 (optim module docstring)."""
    b1, b2 = BETAS
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - lr / (1 - b1 ** t) * m / (np.sqrt(v / (1 - b2 ** t)) + EPS), m, v


def _pair(rng):
    """A host AdamW and a DeviceAdamW over the same initial weights (two decayed, two not)."""
    from mindspore import Parameter, Tensor

    from mftk.engine.device_optim import DeviceAdamW

    init = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    decisions = decide_weight_decay([(n, s) for n, s in SHAPES.items()], WD)
    host = AdamW(list(SHAPES), list(init.values()), decisions, betas=BETAS, eps=EPS)
    params = [Parameter(Tensor(a.copy()), name=n) for n, a in init.items()]
    dev = DeviceAdamW(list(SHAPES), params, decisions, betas=BETAS, eps=EPS)
    return init, decisions, host, dev, params


def test_fused_update_matches_float64_and_the_host_update_each_step():
    from mindspore import Tensor

    rng = np.random.default_rng(0)
    init, decisions, host, dev, params = _pair(rng)
    ref = {n: (a.astype(np.float64), np.zeros(a.shape), np.zeros(a.shape)) for n, a in init.items()}
    wds = {d.name: d.weight_decay for d in decisions}
    for t, lr in enumerate([1e-3, 3e-3, 2e-3, 5e-4, 0.0], start=1):
        grads = {n: (rng.standard_normal(s) * 10 ** rng.uniform(-3, 1)).astype(np.float32) for n, s in SHAPES.items()}
        flat = host.grad_buffer()
        host.put_grads(flat, list(grads.values()))
        host.step(flat, lr)
        acc = dev.grad_buffer()
        dev.put_grads(acc, [Tensor(g) for g in grads.values()])
        dev.step(acc, lr)
        for i, (n, g) in enumerate(grads.items()):
            ref[n] = _reference(*ref[n], g.astype(np.float64), lr, t, wds[n])
            scale = np.abs(ref[n][0]).max()
            got_dev, got_host = params[i].asnumpy(), host.view(host.master, i)
            np.testing.assert_allclose(got_dev, ref[n][0], rtol=REL, atol=REL * scale, err_msg=f"{n} step {t}")
            np.testing.assert_allclose(got_dev, got_host, rtol=REL, atol=REL * scale, err_msg=f"{n} step {t}")
            np.testing.assert_allclose(dev.m[i].asnumpy(), ref[n][1], rtol=1e-5, atol=1e-6 * np.abs(ref[n][1]).max())
            np.testing.assert_allclose(dev.v[i].asnumpy(), ref[n][2], rtol=1e-5, atol=1e-6 * np.abs(ref[n][2]).max())
    assert dev.global_step == host.global_step == 5


def test_norm_accumulation_and_clip_match_float64():
    from mindspore import Tensor

    rng = np.random.default_rng(1)
    _, _, _, dev, _ = _pair(rng)
    micro = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES.values()] for _ in range(3)]
    acc = dev.grad_buffer()
    for k, gs in enumerate(micro):
        (dev.add_grads if k else dev.put_grads)(acc, [Tensor(g) for g in gs], 1.0 / 3)
    want = [sum(mb[i].astype(np.float64) for mb in micro) / 3 for i in range(len(SHAPES))]
    for a, w in zip(acc, want):
        np.testing.assert_allclose(a.asnumpy(), w, rtol=1e-6, atol=1e-7)
    norm = np.sqrt(sum(float((w * w).sum()) for w in want))
    assert float(dev.squared_norm(acc).asnumpy()) == pytest.approx(norm ** 2, rel=REL)
    weights = [0.5, 1.0, 0.0, 0.25]  # a parameter's share of the global norm under several processes
    want_w = sum(wt * float((w * w).sum()) for wt, w in zip(weights, want))
    assert float(dev.squared_norm(acc, weights).asnumpy()) == pytest.approx(want_w, rel=REL)
    dev.scale(acc, 0.25)
    np.testing.assert_allclose(acc[0].asnumpy(), want[0] * 0.25, rtol=1e-6, atol=1e-7)


def test_optimizer_state_round_trips_bit_exactly_between_the_paths():
    from mindspore import Tensor

    rng = np.random.default_rng(2)
    _, _, host, dev, _ = _pair(rng)
    for opt in (host, dev):  # some steps so every state is non-trivial
        for _ in range(3):
            g = [rng.standard_normal(s).astype(np.float32) for s in SHAPES.values()]
            buf = opt.grad_buffer()
            opt.put_grads(buf, g if opt is host else [Tensor(x) for x in g])
            opt.step(buf, 1e-2)
    saved_dev, saved_host = dev.state_dict(with_masters=True), host.state_dict(with_masters=True)
    _, _, host2, dev2, _ = _pair(np.random.default_rng(3))
    host2.load_state_dict(saved_dev)
    dev2.load_state_dict(saved_host)
    for want, got in ((saved_dev, host2.state_dict(with_masters=True)), (saved_host, dev2.state_dict(with_masters=True))):
        assert want.keys() == got.keys()
        for k in want:
            assert want[k].dtype == got[k].dtype and want[k].shape == got[k].shape, k
            assert np.array_equal(want[k].view(np.uint8), got[k].view(np.uint8)), k


def test_low_precision_parameter_gets_an_fp32_master_cast_into_it():
    import mindspore as ms
    from mindspore import Parameter, Tensor

    from mftk.engine.device_optim import DeviceAdamW

    w = np.random.default_rng(4).standard_normal((8, 6)).astype(np.float32)
    p = Parameter(Tensor(w, dtype=ms.bfloat16), name="w.weight")
    opt = DeviceAdamW(["w.weight"], [p], decide_weight_decay([("w.weight", (8, 6))], 0.0), betas=BETAS, eps=EPS)
    assert opt.master[0] is not p and opt.master[0].dtype == ms.float32
    g = np.full((8, 6), 0.5, np.float32)
    acc = opt.grad_buffer()
    opt.put_grads(acc, [Tensor(g, dtype=ms.bfloat16)])
    opt.step(acc, 1e-2)
    start = Tensor(w, dtype=ms.bfloat16).astype(ms.float32).asnumpy().astype(np.float64)
    want, _, _ = _reference(start, 0.0, 0.0, g.astype(np.float64), 1e-2, 1, 0.0)
    np.testing.assert_allclose(opt.master[0].asnumpy(), want, rtol=REL, atol=1e-7)
    np.testing.assert_allclose(p.astype(ms.float32).asnumpy(), want, rtol=1e-2)  # bf16 rounding of the master
    assert "main_param.w.weight" in opt.state_dict(with_masters=True)


# ------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    d = tmp_path_factory.mktemp("device_update")
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ck", steps=5, gbs=4, lbs=2)  # 2 micro-batches per step
    host = run_single(raw, d / "host", f"checkpoint.save_path={d / 'ck_host'}")
    dev = run_single(raw, d / "dev", f"checkpoint.save_path={d / 'ck_dev'}", "mftk.update_on_device=true")
    return raw, d, host, dev


def test_device_path_ran_on_request_and_host_path_by_default_on_cpu(runs):
    _, d, _, _ = runs
    assert "Optimizer update: on the CPU device" in (d / "dev" / "log" / "rank_0" / "info.log").read_text()
    assert "Optimizer update: on the host" in (d / "host" / "log" / "rank_0" / "info.log").read_text()


def test_five_steps_same_losses_and_grad_norms(runs):
    _, d, host, dev = runs
    assert len(host.losses) == len(dev.losses) == 5
    assert max(host.grad_norms) > 1.0  # training.max_norm 1.0: the clip is active
    np.testing.assert_allclose(dev.losses, host.losses, rtol=REL)
    np.testing.assert_allclose(dev.grad_norms, host.grad_norms, rtol=REL)
    from mftk.ckpt.load import load_global

    a, b = (load_global(d / f"ck_{k}" / "iteration_00000005") for k in ("host", "dev"))
    assert a.keys() == b.keys()  # the same format: names, shapes, dtypes
    for n in a:
        assert a[n].shape == b[n].shape and a[n].dtype == b[n].dtype, n
        np.testing.assert_allclose(b[n], a[n], rtol=1e-5, atol=1e-6, err_msg=n)


@pytest.mark.parametrize("saved,resumed", [("dev", "host"), ("host", "dev"), ("dev", "dev")])
def test_each_path_resumes_the_others_checkpoint(runs, saved, resumed):
    """Across the paths: the uninterrupted run's steps 3-5 to 1e-6; the device path on itself: bit-exact."""
    raw, d, host, dev = runs
    full = {"host": host, "dev": dev}[saved]
    flag = "true" if resumed == "dev" else "false"
    out = d / f"resume_{saved}_{resumed}"
    r = run_single(raw, out, f"checkpoint.save_path={out}_ck", f"mftk.update_on_device={flag}",
                   resume_from=d / f"ck_{saved}" / "iteration_00000002")
    np.testing.assert_allclose(r.losses, full.losses[2:], rtol=REL)
    np.testing.assert_allclose(r.grad_norms, full.grad_norms[2:], rtol=REL)
    if saved == resumed:
        assert list(r.losses) == list(full.losses[2:]) and list(r.grad_norms) == list(full.grad_norms[2:])


def test_lora_adapters_update_on_the_device_as_on_the_host(corpus, tmp_path):
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ck", steps=3, gbs=2)
    raw["lora_config"] = {"target_modules": r"(linear_qkv|linear_proj|linear_fc1|linear_fc2)$", "lora_rank": 4,
                          "lora_alpha": 8, "lora_a_std": 0.05, "lora_b_std": 0.02}
    host = run_single(raw, tmp_path / "host", f"checkpoint.save_path={tmp_path / 'ck_host'}")
    dev = run_single(raw, tmp_path / "dev", f"checkpoint.save_path={tmp_path / 'ck_dev'}", "mftk.update_on_device=true")
    assert host.losses[-1] != host.losses[0]  # the adapters train
    np.testing.assert_allclose(dev.losses, host.losses, rtol=REL)
    np.testing.assert_allclose(dev.grad_norms, host.grad_norms, rtol=REL)


# ------------------------------------------------------------------------------- selection and refusals
def test_selection_null_follows_the_device(monkeypatch, corpus, tmp_path, caplog):
    import mindspore as ms

    from mftk.derive import Layout
    from mftk.engine.device_optim import chosen

    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ck")
    one = Layout(world=1)
    assert chosen(load(raw).config, one) is False  # CPU: the host update
    assert chosen(load(raw, "mftk.update_on_device=true").config, one) is True
    real = ms.get_context
    monkeypatch.setattr(ms, "get_context", lambda k: "GPU" if k == "device_target" else real(k))
    assert chosen(load(raw).config, one) is True
    assert chosen(load(raw, "mftk.update_on_device=false").config, one) is False
    with caplog.at_level(logging.INFO, logger="mftk.train"):
        assert chosen(load(raw, "optimizer.type=Muon").config, one) is False  # not silent: logged with its reason
    assert "optimizer.type: Muon is not supported yet" in caplog.text


@pytest.mark.parametrize("overrides,world", [(("optimizer.type=Muon",), 1), (("parallelism.pipeline_parallel=2",), 2)])
def test_refused_combinations_name_the_setting_and_the_fix(corpus, tmp_path, overrides, world):
    import copy

    from mftk.config.load import load_data
    from mftk.errors import ConfigError

    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ck")
    base = (*overrides, "parallelism.data_parallel_shard=1")
    load_data(copy.deepcopy(raw), source="<test>", overrides=base, world_size=world)  # null: the host update
    with pytest.raises(ConfigError) as e:
        load_data(copy.deepcopy(raw), source="<test>", overrides=(*base, "mftk.update_on_device=true"),
                  world_size=world)
    errors = [p for p in e.value.problems if p.severity == "error"]
    assert [p.path for p in errors] == ["mftk.update_on_device"]
    assert "not supported yet" in errors[0].message and "mftk.update_on_device: false" in errors[0].hint


# ----------------------------------------------------------------------------------- host transfers
class TransferSpy:
    """Counts every host↔device copy MindSpore offers mftk: ``Tensor.asnumpy`` (reads), ``Tensor.from_numpy``
    and ``Tensor(ndarray)`` (writes), each with its element count."""

    def __init__(self, monkeypatch) -> None:
        from mindspore.common.tensor import Tensor

        self.reads: list[tuple[int, ...]] = []
        self.writes: list[tuple[int, ...]] = []
        asnumpy, from_numpy, init = Tensor.asnumpy, Tensor.from_numpy, Tensor.__init__
        spy = self

        def read(self):
            a = asnumpy(self)
            spy.reads.append(tuple(a.shape))
            return a

        def write(array):
            spy.writes.append(tuple(np.shape(array)))
            return from_numpy(array)

        def construct(self, input_data=None, *args, **kw):
            if isinstance(input_data, np.ndarray):
                spy.writes.append(tuple(input_data.shape))
            return init(self, input_data, *args, **kw)

        monkeypatch.setattr(Tensor, "asnumpy", read)
        monkeypatch.setattr(Tensor, "from_numpy", staticmethod(write))
        monkeypatch.setattr(Tensor, "__init__", construct)

    def snapshot(self) -> tuple[list, list]:
        return list(self.reads), list(self.writes)


def test_device_path_moves_no_weight_sized_tensor_between_saves(corpus, tmp_path, monkeypatch):
    """The per-step host traffic of the device-resident update, counted on the real path (CPU is the device
    here): steps 3 and 4 minus steps 1 and 2 of the same run. No weight, gradient or moment crosses; what does
    cross is per micro-batch and token-sized (the batch's inputs, targets and mask; the fused loss kernel reads
    nothing back since it moved onto ops), plus ONE read of the step's scalars — the gaps `runnable.DEVICE_HOST_TRAFFIC` lists.
    (The inherited `Trainer.optimizer_step` used to read every master back each step: weight-sized reads.)"""
    import math

    from mftk.engine.builders import build_model
    from mftk.engine.run import train

    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ck", steps=4, gbs=2)  # 2 micro-batches per step
    raw["checkpoint"]["enable_save"] = False
    raw["mftk"] = {"update_on_device": True}
    loaded = load(raw)
    shapes = {tuple(p.shape) for p in build_model(loaded.config).get_parameters() if len(p.shape) >= 1}
    total = sum(math.prod(p.shape) for p in build_model(loaded.config).get_parameters())
    spy = TransferSpy(monkeypatch)
    marks = []

    from mftk.progress import BaseSink

    class Mark(BaseSink):
        def on_step(self, metrics):
            marks.append(spy.snapshot())

    result = train(loaded, output_dir=tmp_path / "out", install_signals=False, lock_save_path=False,
                   sinks=[Mark()])
    assert all(math.isfinite(x) for x in result.losses) and len(marks) == 4
    (r2, w2), (r4, w4) = marks[1], marks[3]
    reads, writes = r4[len(r2):], w4[len(w2):]  # steps 3 and 4
    seq, micro = raw["model"]["seq_length"], 2
    for moved in (reads, writes):
        weightlike = [s for s in moved if s in shapes and math.prod(s) > seq * seq]
        assert not weightlike, f"weight-sized transfers per step: {weightlike}"
        assert max(math.prod(s) for s in moved) <= seq * seq  # the largest: the attention mask of one micro-batch
    per_step = (len(reads) / 2, len(writes) / 2)
    elements = (sum(math.prod(s) for s in reads) + sum(math.prod(s) for s in writes)) / 2
    assert elements < total / 20, (elements, total)
    # counted on Qwen3 (dense), per step of 2 micro-batches: 7 reads (the step's scalars once; per micro-batch
    # the 3 batch columns the model reads back), 16 writes (per micro-batch the 4 batch columns, 3 targets and
    # the mask; the RoPE tables are cached). Before the loss kernel moved onto ops: 11 and 18 (it read P[y] and
    # the weights back and wrote the per-token losses).
    assert per_step == (7, 16), per_step
