"""`mftk train` with TensorBoard and the MindSpore profiler switched on: one 3-step tiny Qwen3 run."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from mftk.progress import RecordingSink
from tests.helpers.tfevents import event_file, scalars
from tests.helpers.tiny import load, tiny_raw

pytestmark = pytest.mark.engine


class TimedSink(RecordingSink):
    """Records the wall clock when each step is reported (before the profiler sink sees it)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_step(self, metrics):
        self.times.append(time.time())
        super().on_step(metrics)


@pytest.fixture(scope="module")
def run3(tmp_path_factory, corpus):
    from mftk.engine.run import train

    d = tmp_path_factory.mktemp("monitor_run")
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt", steps=3)
    raw["monitor"] = {"tensorboard": {"output_dir": str(d / "tb"), "log_interval": 1},
                      "train_state": {"device_loss": True}}
    raw["profiler"] = {"enable_profiling": True, "start_step": 2, "end_step": 2, "output_path": str(d / "prof"),
                       "with_stack": False}
    sink = TimedSink()
    result = train(load(raw), output_dir=d / "out", sinks=[sink], install_signals=False)
    return d, result, sink


def test_tensorboard_scalars_match_the_step_metrics(run3):
    d, result, sink = run3
    got, texts = scalars(event_file(d / "tb"))
    assert [s for s, _ in got["loss"]] == [1, 2, 3]
    np.testing.assert_allclose([v for _, v in got["loss"]], result.losses, rtol=1e-6)
    np.testing.assert_allclose([v for _, v in got["grad-norm"]], result.grad_norms, rtol=1e-6)
    np.testing.assert_allclose([v for _, v in got["device_loss"]], result.losses, rtol=1e-6)
    assert [s for s, _ in got["loss_vs_samples"]] == [m["consumed_samples"] for m in sink.steps]
    assert [v for _, v in got["batch-size"]] == [2.0, 2.0, 2.0]
    assert len(got["local_loss"]) == 3
    assert "model/text_summary" in texts and "training/text_summary" in texts


def test_profiler_output_for_step_two_only(run3):
    d, result, sink = run3
    times = sink.times
    runs = list((d / "prof" / "rank_0").glob("*_ascend_ms"))
    assert len(runs) == 1, runs
    trace = runs[0] / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    events = json.loads(trace.read_text())
    events = events if isinstance(events, list) else events["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("type") == "HostCpuOps"]
    assert len(ops) > 10, "no CPU ops recorded"
    # every recorded op ran during step 2: after step 1 was reported and before step 2 was (trace µs)
    t1, t2 = (1e6 * t for t in times[:2])
    starts = [float(e["ts"]) for e in ops]
    assert t1 < min(starts) and max(starts) < t2, (t1, min(starts), max(starts), t2)
    assert result.final_step == 3
