"""The low-priority dispatch thread (mftk/engine/dispatch.py): which threads end up in SCHED_IDLE, that
training through it is bit-identical, errors, and when the trainer turns it on. The models are compiled
(``jit_blocks``): MindSpore starts its relay thread for graph calls only.

The scheduling checks run in a child process: lowering MindSpore's relay thread is process-wide and,
for an unprivileged user, irreversible — it must not leak into the rest of the test session."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from tests.helpers.models import train_model as _model

linux_only = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")

CHILD = r"""
import itertools, json, os, threading
import numpy as np
from tests.helpers.models import train_model as _model
from mftk.engine.dispatch import threads_named
from mftk.engine.optim import AdamW, decide_weight_decay
from mftk.engine.state import TrainState
from mftk.engine.step import BatchSchedule, StepPlan
from mftk.engine.trainer import Trainer
from mftk.engine.trainer_build import TrainerParts, build_path

def train(low):
    model = _model()
    params = list(model.trainable_params())
    opt = AdamW([p.name for p in params], [p.asnumpy() for p in params],
                decide_weight_decay([(p.name, tuple(p.shape)) for p in params], 0.1))
    ids = np.random.default_rng(0).integers(1, 256, (2, 32)).astype(np.int32)
    batch = {"input_ids": ids, "labels": np.roll(ids, -1, 1)}
    path = build_path(model, opt, itertools.repeat(batch), jit_blocks=True, low_priority_dispatch=low)
    tr = Trainer(TrainerParts(path=path, schedule=lambda step: 3e-3,
                              plan=StepPlan(BatchSchedule(2, 2), total_steps=3, max_norm=1.0)))
    state = TrainState()
    losses = [tr.train_step(state)["loss"] for _ in range(3)]
    return tr, losses, [p.asnumpy() for p in params]

def policy(tid):
    return os.sched_getscheduler(tid)

_, ref_losses, ref_params = train(False)   # first: MindSpore's threads are created at normal priority
tr, losses, params = train(True)
pool_tid = tr.path.dispatch._pool.submit(threading.get_native_id).result()
names = {}
for tid in [int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")]:
    try:
        names[tid] = open(f"/proc/{os.getpid()}/task/{tid}/comm").read().strip()
    except OSError:
        pass
out = {
    "same_losses": losses == ref_losses,
    "same_params": all(np.array_equal(a, b) for a, b in zip(params, ref_params)),
    "lowered": tr.path.dispatch.lowered,
    "dispatch_idle": policy(pool_tid) == os.SCHED_IDLE,
    "main_idle": policy(threading.get_native_id()) == os.SCHED_IDLE,
    "relay_idle": [policy(t) == os.SCHED_IDLE for t in threads_named(("frontend_queue",))],
    "kernel_threads_idle": [policy(t) == os.SCHED_IDLE for t, n in names.items()
                            if n.startswith(("ActorThread", "KernelThread"))],
}
tr.path.close()
out["relay_idle_after_close"] = [policy(t) == os.SCHED_IDLE for t in threads_named(("frontend_queue",))]
print("RESULT " + json.dumps(out))
"""

FRESH = r"""
import json, os
import numpy as np
from tests.helpers.models import train_model as _model
from mftk.engine.dispatch import Dispatcher
import mindspore as ms
model = _model()   # builds parameters only; MindSpore's actor/kernel threads start with the first op
model.jit_blocks()
ids = np.random.default_rng(0).integers(1, 256, (2, 32)).astype(np.int32)
grad = ms.value_and_grad(model, None, model.trainable_params(), has_aux=True)
d = Dispatcher(low_priority=True)
for _ in range(2):
    d.call(lambda: [g.asnumpy() for g in grad(ids, np.roll(ids, -1, 1))[1]])
idle = []
for tid in os.listdir(f"/proc/{os.getpid()}/task"):
    name = open(f"/proc/{os.getpid()}/task/{tid}/comm").read().strip()
    if name.startswith(("ActorThread", "KernelThread")):
        idle.append(os.sched_getscheduler(int(tid)) == os.SCHED_IDLE)
print("RESULT " + json.dumps({"kernel_threads_idle": idle, "lowered": d.lowered}))
"""


def _child(code: str) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@linux_only
def test_low_priority_dispatch_trains_identically_and_lowers_only_the_spinners():
    out = _child(CHILD)
    assert out["same_losses"] and out["same_params"]
    assert out["dispatch_idle"] and not out["main_idle"]
    assert out["relay_idle"] and all(out["relay_idle"]), "MindSpore's relay thread was not found or not lowered"
    assert out["lowered"][0] == "dispatch" and len(out["lowered"]) == 1 + len(out["relay_idle"])
    assert out["kernel_threads_idle"] and not any(out["kernel_threads_idle"])
    if os.geteuid() == 0:  # only a privileged process may raise a thread back out of SCHED_IDLE
        assert not any(out["relay_idle_after_close"])


@linux_only
def test_kernel_threads_created_by_the_dispatch_thread_keep_normal_priority():
    """MindSpore starts its actor/kernel threads on the first op, from the dispatching thread, and they
    inherit its class: the dispatch thread may be lowered only after its first call."""
    out = _child(FRESH)
    assert out["lowered"] and out["lowered"][0] == "dispatch"
    assert out["kernel_threads_idle"] and not any(out["kernel_threads_idle"])


def test_inline_dispatcher_runs_on_the_calling_thread():
    from mftk.engine.dispatch import Dispatcher

    d = Dispatcher(low_priority=False)
    assert d.call(lambda a, b: (threading.get_ident(), a + b), 2, 3) == (threading.get_ident(), 5)
    assert d.lowered is None


def test_errors_reach_the_caller_and_the_dispatcher_stays_usable(monkeypatch):
    from mftk.engine import dispatch

    monkeypatch.setattr(dispatch, "set_policy", lambda tid, policy: False)  # keep the test process as it is
    d = dispatch.Dispatcher(low_priority=True)

    def boom():
        raise ValueError("shape mismatch in layer 3")

    with pytest.raises(ValueError, match="layer 3"):
        d.call(boom)
    assert d.lowered is None  # lowering waits for a call that succeeded
    assert d.call(threading.get_ident) != threading.get_ident()
    assert d.lowered == []  # the OS refused (patched): nothing claimed
    d.close()
    assert d.lowered is None and d.call(lambda: 7) == 7
    d.close()


@pytest.mark.parametrize("dist, minimum, device, want", [
    (None, 0, "CPU", True), (None, 10 ** 9, "CPU", False), ("dp", 0, "CPU", False), (None, 0, "GPU", False)])
def test_low_priority_dispatch_only_for_large_single_process_cpu_runs(monkeypatch, dist, minimum, device, want):
    import mindspore as ms

    from mftk import derive
    from mftk.engine import trainer_build

    model = _model()
    real = ms.get_context
    monkeypatch.setattr(derive, "JIT_MIN_PARAMS", minimum)
    monkeypatch.setattr(ms, "get_context", lambda key: device if key == "device_target" else real(key))
    assert trainer_build.auto_low_priority_dispatch(model, dist) is (want and hasattr(os, "SCHED_IDLE"))
