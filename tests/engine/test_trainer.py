"""The single-process loop end to end on a tiny Qwen3: log line, checkpoint layout, bit-exact resume,
weights-only and changed-gbs resume, NaN handling, save faults, SIGTERM."""
from __future__ import annotations

import errno
import json
import math
import os
import re
import signal

import numpy as np
import pytest

from tests.helpers.tiny import load, tiny_raw
from mftk.errors import CheckpointError, TrainingError, TrainingInterrupted
from mftk.progress import RecordingSink

pytestmark = pytest.mark.engine


def run(raw, tmp_path, name, *overrides, **kw):
    from mftk.engine.run import train

    return train(load(raw, *overrides), output_dir=tmp_path / name, **kw)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, corpus):
    """4 steps, 2 micro-batches per step, checkpoints at 2 and 4."""
    d = tmp_path_factory.mktemp("baseline")
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt", steps=4)
    sink = RecordingSink()
    from mftk.engine.run import train

    result = train(load(raw), output_dir=d / "out", sinks=[sink])
    return raw, result, sink, d


def test_loss_decreases_and_log_line_parses(baseline):
    raw, result, sink, d = baseline
    assert result.final_step == 4 and len(result.losses) == 4
    assert result.losses[-1] < result.losses[0]
    lines = [l for l in open(result.log_file, encoding="utf-8") if "{ step:[" in l]
    assert len(lines) == 4
    assert lines[0].startswith("[INFO] ") and "[mindformers/pynative/callback/loss_callback.py:337] on_step_end: " in lines[0]
    logged = [float(re.search(r"loss:\s+(\d+\.\d+)", l).group(1)) for l in lines]
    assert logged == pytest.approx(list(result.losses), abs=1e-6)
    assert re.search(r"\{ step:\[    1/    4\], consumed_samples: 2, global_batch_size: 2, loss: +\d+\.\d{6}, "
                     r"per_step_time: +\d+ms, lr: \d\.\d{6}e[-+]\d\d, grad_norm: +\d+\.\d{6}, throughput: +\d+\.\d\dT \}",
                     lines[0])
    metrics = [json.loads(l) for l in open(result.metrics_file, encoding="utf-8")]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[0]["loss"] == result.losses[0]  # full precision in the JSON lines
    assert [s["step"] for s in sink.steps] == [1, 2, 3, 4]
    assert [c[0] for c in sink.checkpoints] == [2, 4]


def test_peak_rss_is_logged_per_step(baseline):
    """metrics.jsonl carries this rank's peak RSS at every step (never decreasing, at least the RSS after
    importing MindSpore) and the log names it; CPU reports no device peak."""
    from mftk.engine.memstat import status_bytes

    raw, result, sink, d = baseline
    metrics = [json.loads(l) for l in open(result.metrics_file, encoding="utf-8")]
    peaks = [m["peak_rss_mib"] for m in metrics]
    assert all(b >= a for a, b in zip(peaks, peaks[1:])) and peaks[0] > 100
    # this process's own high-water mark, read later; Linux keeps RSS counters per thread and folds them in
    # every 64 page faults, so two reads may disagree by a few hundred KiB (0.15 MiB seen): 2 MiB of slack
    assert peaks[-1] <= status_bytes("VmHWM") / 2 ** 20 + 2
    assert "peak_device_mib" not in metrics[0]
    assert any(re.search(r"Memory: rank 0 peak RSS \d+ MiB", l) for l in open(result.log_file, encoding="utf-8"))


def test_checkpoint_layout_matches_reference(baseline):
    from safetensors.numpy import load_file

    raw, result, sink, d = baseline
    root = d / "ckpt"
    assert (root / "latest_checkpointed_iteration.txt").read_bytes() == b"4"
    step_dir = root / "iteration_00000004"
    names = sorted(os.listdir(step_dir))
    assert names == ["checkpoint-model-0000000-0000001.safetensors", "checkpoint-opt-0000000-0000001.safetensors",
                     "common.json", "mftk-config.json", "mftk-state-0000000-0000001.json"]
    saved = json.loads((step_dir / "mftk-config.json").read_text())  # the resolved config, defaults filled in
    assert saved["training"]["steps"] == raw["training"]["steps"] and saved["checkpoint"]["save_max"] == 10
    assert saved["model"]["hidden_size"] == raw["model"]["hidden_size"] and "rms_norm_eps" in saved["model"]
    common = json.loads((step_dir / "common.json").read_text())
    assert list(common) == ["epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size",
                            "consumed_samples", "ckpt_status"]
    assert common == {"epoch_num": 1, "step_num": 4, "global_step": 4, "loss_scale": 1.0, "global_batch_size": 2,
                      "consumed_samples": 8, "ckpt_status": None}
    model = load_file(step_dir / names[0])
    opt = load_file(step_dir / names[1])
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in model
    assert all(a.dtype == np.float32 for a in model.values())
    trainable = [n for n in model]
    assert set(opt) == {f"adam_{k}.{n}" for k in "mv" for n in trainable} | {"global_step"}
    assert opt["global_step"].dtype == np.int64 and opt["global_step"].tolist() == [4]
    assert all(opt[f"adam_m.{n}"].shape == model[n].shape for n in trainable)


def test_bit_exact_resume(baseline, tmp_path):
    raw, full, _, d = baseline
    resumed = run(dict(raw, checkpoint=dict(raw["checkpoint"], save_path=str(tmp_path / "ckpt2"))), tmp_path, "r",
                  resume_from=d / "ckpt" / "iteration_00000002")
    assert resumed.start_step == 2 and resumed.resume.scenario == 1
    assert resumed.losses == full.losses[2:]          # identical floats, not approx
    assert resumed.grad_norms == full.grad_norms[2:]
    from safetensors.numpy import load_file

    a = load_file(d / "ckpt" / "iteration_00000004" / "checkpoint-model-0000000-0000001.safetensors")
    b = load_file(tmp_path / "ckpt2" / "iteration_00000004" / "checkpoint-model-0000000-0000001.safetensors")
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_weights_only_resume(baseline, tmp_path):
    raw, full, _, d = baseline
    r = run(dict(raw, checkpoint=dict(raw["checkpoint"], save_path=str(tmp_path / "c"))), tmp_path, "w",
            resume_from=d / "ckpt", weights_only=True, )
    assert r.resume.scenario == 2 and r.start_step == 0 and r.final_step == 4
    assert r.losses[0] < full.losses[0]  # starts from trained weights
    from safetensors.numpy import load_file

    opt = load_file(tmp_path / "c" / "iteration_00000004" / "checkpoint-opt-0000000-0000001.safetensors")
    assert opt["global_step"].tolist() == [4]  # fresh optimizer: 4 updates in this run


def test_changed_global_batch_size_rescales_step(baseline, tmp_path):
    raw, full, _, d = baseline
    r = run(dict(raw, checkpoint=dict(raw["checkpoint"], save_path=str(tmp_path / "c"))), tmp_path, "g",
            "training.global_batch_size=4", "training.steps=3", resume_from=d / "ckpt")
    assert r.resume.scenario == 3
    assert r.start_step == 2 and r.resume.consumed_samples == 8   # int(4·2/4), samples kept
    assert r.resume.skip_micro_batches == 8
    assert r.final_step == 3 and r.consumed_samples == 12
    common = json.loads((tmp_path / "c" / "iteration_00000003" / "common.json").read_text())
    assert common["global_batch_size"] == 4 and common["consumed_samples"] == 12


def test_dry_run_loads_nothing(baseline, tmp_path):
    raw, _, _, d = baseline
    r = run(raw, tmp_path, "dry", resume_from=d / "ckpt", dry_run=True)
    assert r.dry_run and r.losses == () and r.resume.start_step == 4 and not r.resume.missing
    assert not (tmp_path / "dry").exists()


def test_missing_load_path_is_an_error(baseline, tmp_path):
    from mftk.errors import InputError

    raw, _, _, d = baseline
    with pytest.raises(InputError):
        run(raw, tmp_path, "x", resume_from=tmp_path / "nope")


def test_nan_without_skip_stops(corpus, tmp_path, monkeypatch):
    _poison_loss(monkeypatch, at_calls={2})
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=4, gbs=1)
    with pytest.raises(TrainingError) as e:
        run(raw, tmp_path, "n")
    assert e.value.step == 2 and "not finite" in e.value.message


def test_nan_with_skip(corpus, tmp_path, monkeypatch):
    _poison_loss(monkeypatch, at_calls={2})
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=4, gbs=1)
    r = run(raw, tmp_path, "n", "training.use_skip_step_on_nan=true", "training.max_consecutive_skipped_steps=2")
    assert r.final_step == 4 and r.skipped_steps == 1
    assert r.grad_norms[1] is None and all(g is not None for g in r.grad_norms[2:])
    assert "grad_norm: NaN" in open(r.log_file).read()


def test_nan_budget_exhausted(corpus, tmp_path, monkeypatch):
    _poison_loss(monkeypatch, at_calls={2, 3})
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=4, gbs=1)
    with pytest.raises(TrainingError) as e:
        run(raw, tmp_path, "n", "training.use_skip_step_on_nan=true", "training.max_consecutive_skipped_steps=2")
    assert e.value.step == 3  # the reference's rule: stop once 2 <= consecutive skips


def _poison_loss(monkeypatch, at_calls):
    import attrs

    from mftk.engine.host_path import HostPath

    original, calls = HostPath.accumulate, {"n": 0}

    def poisoned(self, plan, state, timer):
        grads, out = original(self, plan, state, timer)
        calls["n"] += 1
        if calls["n"] in at_calls:
            grads[:] = np.nan
            out = attrs.evolve(out, loss=math.nan)
        return grads, out

    monkeypatch.setattr(HostPath, "accumulate", poisoned)


def test_unwritable_save_path_fails_before_training(corpus, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    raw = tiny_raw("qwen3_tiny.yaml", corpus, blocker / "ckpt", steps=2)
    with pytest.raises(CheckpointError) as e:
        run(raw, tmp_path, "u")
    assert "cannot write checkpoints" in e.value.message


def test_disk_full_during_save_keeps_previous_checkpoint(corpus, tmp_path, monkeypatch):
    from mftk.ckpt import safetensors_io

    real, calls = safetensors_io.write_file, {"n": 0}

    def flaky(path, tensors, *a, **k):
        calls["n"] += 1
        if calls["n"] > 2:  # first save (model + opt) succeeds, the second fails
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, tensors, *a, **k)

    monkeypatch.setattr(safetensors_io, "write_file", flaky)
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=4, gbs=1)
    with pytest.raises(TrainingError) as e:
        run(raw, tmp_path, "d")
    assert e.value.step == 4 and "No space left" in e.value.message
    root = tmp_path / "c"
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert sorted(p.name for p in root.iterdir()) == ["iteration_00000002", "latest_checkpointed_iteration.txt"]


def test_killed_save_leaves_previous_latest(baseline, tmp_path):
    """A kill -9 mid-save leaves a hidden temp dir; the tracker still names the previous step."""
    import shutil

    raw, _, _, d = baseline
    root = tmp_path / "c"
    shutil.copytree(d / "ckpt", root)
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    shutil.rmtree(root / "iteration_00000004")
    partial = root / ".tmp-iteration_00000004"
    partial.mkdir()
    (partial / "checkpoint-model-0000000-0000001.safetensors").write_bytes(b"\x10\x00")
    r = run(dict(raw, checkpoint=dict(raw["checkpoint"], save_path=str(tmp_path / "c2"))), tmp_path, "k",
            resume_from=root, dry_run=True)
    assert r.resume.saved_step == 2 and r.resume.step_dir.endswith("iteration_00000002")


def test_sigterm_saves_then_raises(corpus, tmp_path):
    class Killer(RecordingSink):
        def on_step(self, metrics):
            super().on_step(metrics)
            if metrics["step"] == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=4, gbs=1)
    with pytest.raises(TrainingInterrupted) as e:
        run(raw, tmp_path, "s", sinks=[Killer()])
    assert e.value.step == 1 and e.value.saved_path.endswith("iteration_00000001")
    assert (tmp_path / "c" / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_async_save_writes_tracker_for_last(corpus, tmp_path):
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=3, gbs=1)
    raw["checkpoint"]["async_save"] = True
    r = run(raw, tmp_path, "a")
    assert (tmp_path / "c" / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert r.checkpoint.endswith("iteration_00000003")


def test_rampup_batch_size(corpus, tmp_path):
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=3, gbs=4, rampup_batch_size=[2, 2, 2])
    r = run(raw, tmp_path, "ramp")
    metrics = [json.loads(l) for l in open(r.metrics_file)]
    # gbs(c): c=0 -> 2; c=2 -> 2 + int(2/2)*2 = 4 (capped at 4); consumed 2, 6, 10
    assert [m["global_batch_size"] for m in metrics] == [2, 4, 4]
    assert [m["consumed_samples"] for m in metrics] == [2, 6, 10]


def test_deepseek_v3_trains_with_moe_and_mtp(corpus, tmp_path):
    raw = tiny_raw("deepseek_v3_tiny.yaml", corpus, tmp_path / "c", steps=3, gbs=1)
    r = run(raw, tmp_path, "ds")
    text = open(r.log_file).read()
    assert "load_balancing_loss:" in text and "mtp_1_loss:" in text
    line = [l for l in text.splitlines() if "{ step:[" in l][0]
    assert float(re.search(r"loss:\s+(\d+\.\d+)", line).group(1)) == pytest.approx(r.losses[0], abs=1e-6)
    from safetensors.numpy import load_file

    model = load_file(tmp_path / "c" / "iteration_00000003" / "checkpoint-model-0000000-0000001.safetensors")
    bias = [k for k in model if k.endswith("expert_bias")]
    assert bias and any(np.abs(model[k]).sum() > 0 for k in bias)  # the expert-bias update ran


@pytest.mark.parametrize("override, want", [(None, False), ("training.low_priority_dispatch=true", True)])
def test_low_priority_dispatch_key_reaches_the_trainer(corpus, tmp_path, monkeypatch, override, want):
    """null (auto) stays off for the tiny model; ``true`` forces the idle-class dispatch thread. The
    dispatcher is recorded, then run inline, so this test process's threads keep their priority."""
    from mftk.engine import dispatch

    seen = []
    real_init = dispatch.Dispatcher.__init__

    def record(self, low_priority):
        seen.append(low_priority)
        real_init(self, False)

    monkeypatch.setattr(dispatch.Dispatcher, "__init__", record)
    raw = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "c", steps=1, gbs=1)
    r = run(raw, tmp_path, "d", *([override] if override else []))
    assert r.final_step == 1 and seen == [want]


def test_save_interval_counts_from_the_resumed_step(tmp_path):
    """The reference's example (mindformers-2.1.md §2.3): resumed at 300 with interval 70 → 370, 440, ..."""
    from mftk.engine.trainer import Checkpointer

    resumed = Checkpointer(root=str(tmp_path), interval=70, start_step=300)
    assert [s for s in range(290, 520) if resumed.due(s)] == [370, 440, 510]
    fresh = Checkpointer(root=str(tmp_path), interval=70)
    assert [s for s in range(0, 150) if fresh.due(s)] == [70, 140]


class _Agreement:
    """A `DistContext` stand-in for `any_flag`: the other ranks' flags, and a signal that arrives at this rank
    while it waits in the agreement's collective (its handler runs as the collective returns)."""

    def __init__(self, stop, others: list[bool], signal_during: set[int]) -> None:
        self.stop, self.others, self.signal_during, self.calls = stop, others, signal_during, 0

    def any_flag(self, flag: bool) -> bool:
        agreed = flag or self.others[self.calls]
        if self.calls in self.signal_during:
            self.stop.request("SIGTERM")  # after this rank's flag was sent: the others were told False
        self.calls += 1
        return agreed


def test_a_signal_during_the_stop_agreement_stops_every_rank_at_the_next_step():
    """The signal comes while this rank waits in step 1's agreement (the others were told no stop): this rank
    must run step 2 like the others, and all stop after step 2 (stopping now left it saving alone: exit 4)."""
    from types import SimpleNamespace

    from mftk.engine.trainer import StopFlag, Trainer

    stop = StopFlag()
    dist = _Agreement(stop, others=[False, False], signal_during={0})
    me = SimpleNamespace(stop=stop, dist=dist, checkpointer=None, fault=None)
    Trainer.stop_if_requested(me, SimpleNamespace(global_step=1))  # agreed False: go on
    with pytest.raises(TrainingInterrupted, match="SIGTERM received: stopped after step 2"):
        Trainer.stop_if_requested(me, SimpleNamespace(global_step=2))
    assert dist.calls == 2


def test_another_ranks_stop_request_stops_this_rank_at_the_same_step():
    from types import SimpleNamespace

    from mftk.engine.trainer import StopFlag, Trainer

    stop = StopFlag()
    me = SimpleNamespace(stop=stop, dist=_Agreement(stop, others=[True], signal_during=set()), checkpointer=None,
                         fault=None)
    with pytest.raises(TrainingInterrupted, match=r"SIGTERM \(on another rank\) received: stopped after step 1"):
        Trainer.stop_if_requested(me, SimpleNamespace(global_step=1))
