"""The points `plan-parallel`'s mftk-cpu memory profile is calibrated on, and how each is measured.

Each point runs in a fresh process: import MindSpore and the engine, record RSS (the idle-process baseline),
train 3 steps, record the peak (VmHWM). Measured = peak − baseline; the estimate is the planner's total for
the same config under the "mftk-cpu" profile (`plan.memory.MFTK_CPU`). Several workers: one msrun job per
point, each rank measuring its own baseline and peak. `bench/plan_calibration.py` prints the whole grid and
`bench/memory.py` the large runs; no test measures memory (`run_all.sh` skips this module: its name starts with _).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mftk.config.templates import TEMPLATES_DIR

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the repository: the mftk package and bench/ (a namespace package)

QWEN3, DSV3 = "qwen3_tiny.yaml", "deepseek_v3_tiny.yaml"  # shipped templates (`config.templates`)
H256 = {"model.hidden_size": 256, "model.intermediate_size": 768, "model.num_attention_heads": 8,
        "model.num_key_value_heads": 4, "model.head_dim": 32}
H512 = {"model.hidden_size": 512, "model.intermediate_size": 1536, "model.num_attention_heads": 8,
        "model.num_key_value_heads": 8, "model.head_dim": 64}
DS256 = {"model.hidden_size": 256, "model.moe_intermediate_size": 128, "model.intermediate_size": 512}


def seq(s: int) -> dict:
    return {"model.seq_length": s, "train_dataset.dataloader.config.seq_length": s}


# (name, template, overrides): one dimension varied at a time around each base (layers, hidden, batch, seq,
# vocab), so each term of the "mftk-cpu" profile is pinned by its own sweep; QUICK names the test's points.
GRID = [
    ("qwen3 tiny", QWEN3, {}),
    ("qwen3 h256 L1", QWEN3, {**H256, "model.num_hidden_layers": 1}),
    ("dsv3 L4 b4", DSV3, {"model.num_hidden_layers": 4, "training.local_batch_size": 4}),
    ("dsv3 tiny", DSV3, {}),
    ("qwen3 h256 L4", QWEN3, {**H256, "model.num_hidden_layers": 4}),
    ("qwen3 h256 L8", QWEN3, {**H256, "model.num_hidden_layers": 8}),
    ("qwen3 h256 L4 b4", QWEN3, {**H256, "model.num_hidden_layers": 4, "training.local_batch_size": 4}),
    ("qwen3 h256 L4 b16", QWEN3, {**H256, "model.num_hidden_layers": 4, "training.local_batch_size": 16}),
    ("qwen3 h256 L4 s512", QWEN3, {**H256, "model.num_hidden_layers": 4, **seq(512)}),
    ("qwen3 h256 L4 V32k", QWEN3, {**H256, "model.num_hidden_layers": 4, "model.vocab_size": 32768}),
    ("qwen3 h512 L4", QWEN3, {**H512, "model.num_hidden_layers": 4}),
    ("dsv3 h256 L4", DSV3, {**DS256, "model.num_hidden_layers": 4}),
]
QUICK = [1, 2, 6, 10]  # the test points: large enough that the fixed runtime overhead does not dominate; h512
# (17.8M parameters) runs its layers compiled
COMMON = {"training.steps": 3, "checkpoint.enable_save": False, "training.global_batch_size": None}


# Several workers (msrun, `mftk train --nproc`): (name, template, overrides, nproc). Every point is the
# single-process grid's "qwen3 h256 L4" / "dsv3 L4 b4" under one layout, so the multi-process terms are what
# differs; each worker's own peak is measured (all ranks reported; the estimate is per device).
DP2 = {"parallelism.data_parallel_shard": 1}
FSDP2 = {"parallelism.data_parallel_shard": -1}
TP2 = {"parallelism.tensor_parallel": 2, "parallelism.sequence_parallel": True}
EP2 = {"parallelism.expert_parallel": 2}
MULTI = [
    ("qwen3 h256 L4 dp2", QWEN3, {**H256, "model.num_hidden_layers": 4, **DP2}, 2),
    ("qwen3 h256 L4 fsdp2", QWEN3, {**H256, "model.num_hidden_layers": 4, **FSDP2}, 2),
    ("qwen3 h256 L4 tp2", QWEN3, {**H256, "model.num_hidden_layers": 4, **TP2}, 2),
    ("dsv3 L4 b4 ep2", DSV3, {"model.num_hidden_layers": 4, "training.local_batch_size": 4, **EP2}, 2),
]
MULTI_TEST = 1  # the slow test's point: fsdp2 qwen3 h256 L4


def _overrides(over: dict, world: int = 1) -> list[str]:
    """Steps, no saving, and one micro-batch per data-parallel rank per step (gbs = lbs·dp)."""
    lbs = over.get("training.local_batch_size", 1)
    tp = over.get("parallelism.tensor_parallel", 1)
    merged = {**COMMON, **over, "training.global_batch_size": lbs * max(world // tp, 1)}
    return [f"{k}={v}" for k, v in merged.items()]


# The compiled layers' term (`plan.memory._compiled_term`): single-process points measured with the layers
# forced compiled and forced eager; the difference is what the graphs hold.
COMPILED = [1, 4, 5, 6, 8, 10, 2, 11]  # h256 L1/L4/L8, batch 4, seq 512, h512; DeepSeek-V3 (MoE: attention only)


def estimate_bytes(template: str, over: dict, world: int = 1) -> dict:
    from mftk.config.load import load_config
    from mftk.derive import Layout, layout_from_config
    from mftk.plan.memory import MFTK_CPU, estimate
    from mftk.plan.report import plan_inputs

    cfg = load_config(TEMPLATES_DIR / template, overrides=_overrides(over, world), world_size=world, check_files=False).config
    layout = Layout(world=1) if world == 1 else layout_from_config(cfg.parallelism, world)
    est = estimate(layout, plan_inputs(cfg, cfg.parallelism), MFTK_CPU)
    return {"total": est.peak_bytes, "terms": {t.name: t.value for t in est.peak.terms}, "layout": layout.describe()}


def worker(template: str, over: dict, compiled: bool | None = None) -> dict:
    """Runs inside a fresh interpreter: baseline after imports, peak after training.

    The peak is VmHWM (this address space's high-water mark), not ``ru_maxrss``: Linux carries
    ``ru_maxrss`` across exec, so a child of a large process (pytest after many tests) would
    report its parent's size. ``compiled`` moves this process's compile threshold (`measure`).
    """
    import mindspore  # noqa: F401 - part of the idle baseline

    from mftk import derive
    from mftk.config.load import load_config
    from mftk.engine import run

    if compiled is not None:  # this throw-away process only
        derive.JIT_MIN_PARAMS = 0 if compiled else 1 << 62

    loaded = load_config(TEMPLATES_DIR / template, overrides=_overrides(over), check_files=True)
    base = _status_bytes("VmRSS")
    with tempfile.TemporaryDirectory() as out:
        run.train(loaded, output_dir=out, install_signals=False)
    peak = _status_bytes("VmHWM")
    return {"baseline": base, "peak": peak, "measured": peak - base}


def _status_bytes(key: str) -> int:
    """A memory figure of this process from /proc/self/status (kB there)."""
    from mftk.engine.memstat import status_bytes

    value = status_bytes(key)
    if value is None:
        raise RuntimeError(f"{key} not in /proc/self/status")
    return value


def dist_worker(template: str, over: dict) -> dict:
    """The msrun target (`engine.launch` has run ``communication.init()``): this rank's baseline after
    imports and its own VmHWM after training, returned as JSON (launch collects one per rank)."""
    import mindspore  # noqa: F401
    from mindspore import communication

    from mftk.config.load import load_config
    from mftk.engine import run

    world, rank = communication.get_group_size(), communication.get_rank()
    loaded = load_config(TEMPLATES_DIR / template, overrides=_overrides(over, world), world_size=world, check_files=True)
    base = _status_bytes("VmRSS")
    with tempfile.TemporaryDirectory() as out:
        run.train(loaded, output_dir=out, install_signals=False, world_size=world)
        records = [json.loads(x) for x in (Path(out) / "log" / f"rank_{rank}" / "metrics.jsonl").read_text().splitlines()]
    peak = _status_bytes("VmHWM")
    return {"baseline": base, "peak": peak, "measured": peak - base, "rank": rank,
            "step_ms": [r["per_step_time"] for r in records], "tokens": [r.get("tokens", 0) for r in records]}


def measure_multi(template: str, over: dict, nproc: int, timeout_s: float = 900) -> list[dict]:
    """One msrun job of ``nproc`` workers on free ports; each rank's own baseline/peak, by rank."""
    from mftk.engine.launch import LaunchSpec, launch

    os.environ["PYTHONPATH"] = _with_root(os.environ.get("PYTHONPATH", ""))  # the workers import bench._calibration
    with tempfile.TemporaryDirectory(prefix="mftk-calib-") as logs:
        res = launch("bench._calibration:dist_worker", {"template": template, "over": over},
                     spec=LaunchSpec(nproc=nproc, log_dir=Path(logs)), timeout_s=timeout_s)
    return [res.results[r] for r in sorted(res.results)]


def measure(template: str, over: dict, compiled: bool | None = None) -> dict:
    """One single-process run of 3 steps in a fresh interpreter: its baseline, peak and measured bytes.
    ``compiled`` forces the layers compiled (True) or eager (False) whatever the model's size (None: the
    trainer's own rule, `derive.compiles_blocks`)."""
    code = ("import json; from bench._calibration import worker; "
            "print('RESULT ' + json.dumps(worker(%r, %r, %r)))" % (template, over, compiled))
    env = dict(os.environ, PYTHONPATH=_with_root(os.environ.get("PYTHONPATH", "")))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"worker failed ({proc.returncode}): {proc.stderr[-2000:]}")


def _with_root(pythonpath: str) -> str:
    """``PYTHONPATH`` with the repository first, so a fresh interpreter imports mftk and ``bench._calibration``."""
    return str(PACKAGE_ROOT) + (os.pathsep + pythonpath if pythonpath else "")
