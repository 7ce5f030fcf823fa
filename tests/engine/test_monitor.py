"""Monitors without a training run: TensorBoard scalars read back by an independent TFRecord/protobuf
reader, log_interval, staged micro-batch losses, and the profiler's step window and failure paths."""
from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pytest

from mftk.engine.monitor import TrainStateMonitor, build_monitors
from mftk.engine.profiler import StepProfiler, profiler_dir, wants_profiler
from mftk.engine.tensorboard import TensorboardSink, scalars_of
from mftk.errors import InputError
from tests.helpers.tfevents import event_file, scalars


def _metrics(step: int, **kw) -> dict:
    m = {"step": step, "consumed_samples": 8 * step, "global_batch_size": 8, "loss": 10.0 - step,
         "per_step_time": 100 + step, "lr": 1e-3 * step, "grad_norm": 0.5 * step, "throughput": 2.0,
         "lr_used": 9.0, "skipped": False, "tokens": 256}
    m.update(kw)
    return m


def _train_state(**kw):
    base = {"local_loss": False, "device_loss": False, "local_norm": "", "device_norm": False}
    base.update(kw)
    return NS(**base)


def test_scalars_written_every_log_interval_with_reference_tags(tmp_path):
    sink = TensorboardSink(str(tmp_path / "tb"), log_interval=2, config_text={"training": "{'steps': 5}"})
    for s in range(1, 6):
        sink.on_step(_metrics(s, mtp_1_loss=0.25 * s, load_balancing_loss=0.125))
    sink.close()
    got, texts = scalars(event_file(tmp_path / "tb"))
    assert texts == ["training/text_summary"]
    assert set(got) == {t for base in ("loss", "load-balancing-loss", "grad-norm", "iteration-time", "throughput",
                                       "learning-rate", "batch-size", "mtp-1-loss")
                        for t in (base, f"{base}_vs_samples")}  # tensorboardX turns spaces into _
    assert got["loss"] == [(2, 8.0), (4, 6.0)]  # steps 1, 3, 5 dropped
    assert got["loss_vs_samples"] == [(16, 8.0), (32, 6.0)]
    assert got["iteration-time"] == [(2, 102.0), (4, 104.0)]
    assert got["mtp-1-loss"] == [(2, 0.5), (4, 1.0)]
    assert [s for s, _ in got["learning-rate"]] == [2, 4]
    np.testing.assert_allclose([v for _, v in got["learning-rate"]], [2e-3, 4e-3], rtol=1e-6)


def test_bad_log_interval_falls_back_to_every_step(tmp_path):
    sink = TensorboardSink(str(tmp_path), log_interval=0, queue_size=0)
    for s in (1, 2, 3):
        sink.on_step(_metrics(s))
    sink.close()
    assert [s for s, _ in scalars(event_file(tmp_path))[0]["loss"]] == [1, 2, 3]


def test_skipped_step_has_no_grad_norm_point():
    tags = dict(scalars_of(_metrics(1, grad_norm=None), {}))
    assert "grad-norm" not in tags and tags["loss"] == 9.0


def test_monitor_stages_local_and_device_loss(tmp_path, caplog):
    for device_loss in (False, True):
        d = tmp_path / str(device_loss)
        sink = TensorboardSink(str(d), device_loss=device_loss)
        mon = TrainStateMonitor(_train_state(device_loss=device_loss), sink)
        assert mon.enabled
        out = NS(loss=2.5, local_losses=[1.0, 1.5])  # already ÷ accumulation
        with caplog.at_level(logging.INFO, "mftk.train"):
            mon.flush(3, out, np.zeros(1, np.float32), NS(names=[], slices=[]))
        sink.on_step(_metrics(3))
        sink.on_step(_metrics(4))  # nothing staged: no local_loss point at step 4
        sink.close()
        got = scalars(event_file(d))[0]
        assert got["local_loss"] == [(3, 1.5)]  # the last micro-batch, as the reference records it
        assert got.get("device_loss", []) == ([(3, 2.5)] if device_loss else [])


def test_unwritable_output_dir_is_an_input_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError) as e:
        TensorboardSink(str(blocker / "tb"))
    assert "monitor.tensorboard.output_dir" in e.value.hint


def test_only_last_rank_writes_tensorboard(tmp_path):
    config = NS(monitor=NS(tensorboard=NS(output_dir=str(tmp_path / "tb"), log_interval=1, queue_size=10),
                           train_state=_train_state()),
                profiler=NS(enable_profiling=False, profiler_rank=None))
    loaded = NS(config=config, raw={"training": {"steps": 2}})
    mon, sinks = build_monitors(loaded, rank=0, world=2)
    assert sinks == [] and mon.tensorboard is None and not mon.enabled
    mon, sinks = build_monitors(loaded, rank=1, world=2)
    assert len(sinks) == 1 and mon.tensorboard is sinks[0]
    sinks[0].close()


# --------------------------------------------------------------------------------------- profiler
class FakeProfile:
    def __init__(self, out_dir: Path, write: bool = True) -> None:
        self.calls: list[str] = []
        self.out_dir, self.write = out_dir, write

    def start(self):
        self.calls.append("start")

    def step(self):
        self.calls.append("step")

    def stop(self):
        self.calls.append("stop")
        if self.write:
            p = self.out_dir / "host_1_2_ascend_ms" / "ASCEND_PROFILER_OUTPUT"
            p.mkdir(parents=True)
            (p / "trace_view.json").write_text("[]")


def _prof_cfg(tmp_path, start, end, **kw):
    base = dict(enable_profiling=True, start_step=start, end_step=end, output_path=str(tmp_path / "prof"),
                profiler_rank=None, profiler_level=0, mstx=False, profile_memory=False, profile_cpu=True,
                with_stack=False)
    base.update(kw)
    return NS(**base)


def _drive(tmp_path, start, end, steps, write=True, first_step=1):
    """Runs ``steps`` reported steps; returns (profiler, fake, calls seen before each step)."""
    made: list[FakeProfile] = []

    def factory(cfg, out_dir, n):
        assert n == end - start + 1
        made.append(FakeProfile(out_dir, write))
        return made[-1]

    p = StepProfiler(_prof_cfg(tmp_path, start, end), factory=factory)
    timeline = []
    for s in range(first_step, first_step + steps):
        timeline.append(list(made[0].calls) if made else None)  # what had happened before step s ran
        p.on_step({"step": s})
    p.close()
    return p, (made[0] if made else None), timeline


def test_profiler_window_counts_steps_of_this_run(tmp_path):
    # resumed at global step 100: start_step 2 is the run's 2nd step (global 102)
    p, fake, before = _drive(tmp_path, 2, 3, steps=5, first_step=101)
    assert before[0] is None and before[1] == ["start"]  # started after step 1 was reported
    assert fake.calls == ["start", "step", "step", "stop"]  # steps 2, 3 recorded; stopped after step 3
    assert before[4] == fake.calls and p.ok is True


def test_profiler_from_step_one_starts_before_the_loop(tmp_path):
    p, fake, before = _drive(tmp_path, 1, 1, steps=3)
    assert before[0] == ["start"] and before[1] == ["start", "step", "stop"] and p.ok


def test_profiler_stops_at_close_when_the_run_ends_early(tmp_path):
    p, fake, _ = _drive(tmp_path, 2, 10, steps=3)
    assert fake.calls == ["start", "step", "step", "stop"] and p.done


def test_profiler_that_cannot_start_warns_and_training_continues(tmp_path, caplog):
    def broken(cfg, out_dir, n):
        raise RuntimeError("no profiler on this device")

    with caplog.at_level(logging.WARNING, "mftk.train"):
        p = StepProfiler(_prof_cfg(tmp_path, 1, 2), factory=broken)
        for s in (1, 2, 3):
            p.on_step({"step": s})
        p.close()
    assert p.ok is False
    assert any("Profiler could not start (RuntimeError: no profiler on this device)" in r.message
               for r in caplog.records)


def test_profiler_that_writes_nothing_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, "mftk.train"):
        p, _, _ = _drive(tmp_path, 1, 1, steps=1, write=False)
    assert p.ok is False and any("wrote no trace" in r.message for r in caplog.records)


def test_profiler_output_dir_and_ranks(tmp_path):
    assert profiler_dir("/x/p", 3) == Path("/x/p/rank_3")
    assert profiler_dir(None, 0, cwd=str(tmp_path)) == tmp_path / "profile" / "rank_0"
    cfg = _prof_cfg(tmp_path, 1, 1, profiler_rank=[1])
    assert not wants_profiler(cfg, 0) and wants_profiler(cfg, 1)
    assert not wants_profiler(_prof_cfg(tmp_path, 1, 1, enable_profiling=False), 0)
