"""Calibrate `mftk plan-parallel`'s memory model against measured peak RSS of real `mftk train` runs (CPU, fp32).

Each grid point runs in a fresh process: import MindSpore and the engine, record RSS (the idle-process
baseline), train 3 steps, record peak RSS (`ru_maxrss`). Measured = peak − baseline; estimate = the
planner's single-device total for the same config under the "mftk-cpu" profile (`mftk.plan.memory.MFTK_CPU`:
what this engine holds, term by term). Prints estimate/measured per point (median of --repeat runs);
the goal is within ±15%.

    .venv/bin/python bench/plan_calibration.py            # whole grid, 3 runs each (~10 min on 2 shared cores)
    .venv/bin/python bench/plan_calibration.py --quick    # the test's three points
    .venv/bin/python bench/plan_calibration.py --llama    # Llama-3-8B FSDP8 estimate vs the published 82.4 GiB

    .venv/bin/python bench/plan_calibration.py --multi    # several workers (msrun): dp2, fsdp2, tp2, dsv3 ep2

Several workers: one msrun job per point (`engine.launch`, free ports); each rank measures its own
baseline (VmRSS after imports and ``communication.init()``) and VmHWM after training and returns them
as JSON; the estimate is the planner's per-device peak for the job's layout under the same profile.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN3, DSV3 = "templates/qwen3_tiny.yaml", "templates/deepseek_v3_tiny.yaml"
H256 = {"model.hidden_size": 256, "model.intermediate_size": 768, "model.num_attention_heads": 8,
        "model.num_key_value_heads": 4, "model.head_dim": 32}
H512 = {"model.hidden_size": 512, "model.intermediate_size": 1536, "model.num_attention_heads": 8,
        "model.num_key_value_heads": 8, "model.head_dim": 64}
DS256 = {"model.hidden_size": 256, "model.moe_intermediate_size": 128, "model.intermediate_size": 512}


def seq(s: int) -> dict:
    return {"model.seq_length": s, "train_dataset.dataloader.config.seq_length": s}


# (name, template, overrides): one dimension varied at a time around each base (layers, hidden, batch, seq,
# vocab), so each term of the "mftk-cpu" profile is pinned by its own sweep. The first three (QUICK) are the
# test's points: cheap, one per family plus a larger dense one.
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
QUICK = [1, 2, 6]  # the test points: large enough that the fixed runtime overhead does not dominate
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


def estimate_bytes(template: str, over: dict, world: int = 1) -> dict:
    from mftk.config.load import load_config
    from mftk.derive import Layout, layout_from_config
    from mftk.plan.memory import MFTK_CPU, estimate
    from mftk.plan.report import plan_inputs

    cfg = load_config(ROOT / template, overrides=_overrides(over, world), world_size=world, check_files=False).config
    layout = Layout(world=1) if world == 1 else layout_from_config(cfg.parallelism, world)
    est = estimate(layout, plan_inputs(cfg, cfg.parallelism), MFTK_CPU)
    return {"total": est.peak_bytes, "terms": {t.name: t.value for t in est.peak.terms}, "layout": layout.describe()}


def worker(template: str, over: dict) -> dict:
    """Runs inside a fresh interpreter: baseline after imports, peak after training.

    The peak is VmHWM (this address space's high-water mark), not ``ru_maxrss``: Linux carries
    ``ru_maxrss`` across exec, so a child of a large process (pytest after many tests) would
    report its parent's size.
    """
    import mindspore  # noqa: F401  (part of the idle baseline)

    from mftk.config.load import load_config
    from mftk.engine import run

    loaded = load_config(ROOT / template, overrides=_overrides(over), check_files=True)
    base = _status_bytes("VmRSS")
    with tempfile.TemporaryDirectory() as out:
        run.train(loaded, output_dir=out, install_signals=False)
    peak = _status_bytes("VmHWM")
    return {"baseline": base, "peak": peak, "measured": peak - base}


def _status_bytes(key: str) -> int:
    """A memory figure of this process from /proc/self/status (kB there)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def dist_worker(template: str, over: dict) -> dict:
    """The msrun target (`engine.launch` has run ``communication.init()``): this rank's baseline after
    imports and its own VmHWM after training, returned as JSON (launch collects one per rank)."""
    import mindspore  # noqa: F401
    from mindspore import communication

    from mftk.config.load import load_config
    from mftk.engine import run

    world = communication.get_group_size()
    loaded = load_config(ROOT / template, overrides=_overrides(over, world), world_size=world, check_files=True)
    base = _status_bytes("VmRSS")
    with tempfile.TemporaryDirectory() as out:
        run.train(loaded, output_dir=out, install_signals=False, world_size=world)
    peak = _status_bytes("VmHWM")
    return {"baseline": base, "peak": peak, "measured": peak - base, "rank": communication.get_rank()}


def measure_multi(template: str, over: dict, nproc: int, timeout_s: float = 900) -> list[dict]:
    """One msrun job of ``nproc`` workers on free ports; each rank's own baseline/peak, by rank."""
    from mftk.engine.launch import LaunchSpec, launch

    with tempfile.TemporaryDirectory(prefix="mftk-calib-") as logs:
        res = launch("bench.plan_calibration:dist_worker", {"template": template, "over": over},
                     spec=LaunchSpec(nproc=nproc, log_dir=Path(logs)), timeout_s=timeout_s)
    return [res.results[r] for r in sorted(res.results)]


def measure(template: str, over: dict) -> dict:
    code = ("import json,sys; sys.path.insert(0, %r); from bench.plan_calibration import worker; "
            "print('RESULT ' + json.dumps(worker(%r, %r)))" % (str(ROOT), template, over))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"worker failed ({proc.returncode}): {proc.stderr[-2000:]}")


def llama3_8b_fsdp8() -> dict:
    """Llama-3-8B shapes written as a Qwen3-family config (qk-norm adds 8K params), FSDP over 8, seq 8192."""
    import yaml

    from mftk.config.load import load_data
    from mftk.derive import Layout
    from mftk.plan.memory import estimate
    from mftk.plan.report import plan_inputs

    data = yaml.safe_load((ROOT / "templates/qwen3_tiny.yaml").read_text())
    data["model"].update(vocab_size=128256, seq_length=8192, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         compute_dtype="bfloat16", rope_theta=500000.0)
    data["train_dataset"]["dataloader"]["config"]["seq_length"] = 8192
    data["training"].update(local_batch_size=2, global_batch_size=16)
    data["recompute"] = {"mode": "select", "select_module": {"*core_attention*": ["0-31"]}}
    cfg = load_data(data, world_size=8, check_files=False).config
    est = estimate(Layout(world=8, dp_shard=8), plan_inputs(cfg, cfg.parallelism))
    return {"estimate_gib": est.peak_bytes / 2 ** 30, "published_gib": 82.4,
            "terms_gib": {t.name: round(t.value / 2 ** 30, 2) for t in est.peak.terms}}


def measure_median(template: str, over: dict, repeat: int) -> float:
    """Median measured bytes over ``repeat`` fresh processes (others share the cores; RSS varies a little)."""
    return statistics.median(measure(template, over)["measured"] for _ in range(repeat))


def main(argv: list[str]) -> None:
    if "--llama" in argv:
        print(json.dumps(llama3_8b_fsdp8(), indent=2))
        return
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 3
    if "--multi" in argv:
        main_multi(repeat)
        return
    points = [GRID[i] for i in QUICK] if "--quick" in argv else GRID
    print(f"profile mftk-cpu; measured = peak RSS − RSS after imports, median of {repeat} runs of 3 steps")
    print(f"{'config':<20} {'estimate MiB':>12} {'measured MiB':>12} {'ratio':>6}  overrides")
    ratios = []
    for name, template, over in points:
        est = estimate_bytes(template, over)["total"]
        got = measure_median(template, over, repeat)
        ratios.append(est / got)
        print(f"{name:<20} {est / 2**20:>12.1f} {got / 2**20:>12.1f} {est / got:>6.2f}  {json.dumps(over)[:70]}",
              flush=True)
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(f"{len(ratios)} points, worst ratio {worst:.2f}, within ±15%: {all(abs(r - 1) <= 0.15 for r in ratios)}")


def main_multi(repeat: int) -> None:
    """The several-worker grid: per point, every rank's measured peak (median over runs) beside the estimate."""
    print(f"profile mftk-cpu; each worker: VmHWM − VmRSS after imports, median of {repeat} jobs of 3 steps")
    print(f"{'config':<20} {'layout':<26} {'estimate MiB':>12} {'measured MiB (per rank)':>24} {'worst':>6}")
    ratios = []
    for name, template, over, nproc in MULTI:
        est = estimate_bytes(template, over, nproc)
        runs = [measure_multi(template, over, nproc) for _ in range(repeat)]
        per_rank = [statistics.median(run[r]["measured"] for run in runs) for r in range(nproc)]
        worst = max((est["total"] / m for m in per_rank), key=lambda r: abs(r - 1))
        ratios.append(worst)
        short = " × ".join(d for d in est["layout"].split(" × ") if not d.endswith("=1"))  # the dims > 1
        got = " / ".join(f"{m / 2**20:.1f}" for m in per_rank)
        print(f"{name:<20} {short[:26]:<26} {est['total'] / 2**20:>12.1f} {got:>24} {worst:>6.2f}", flush=True)
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(f"{len(ratios)} points, worst ratio {worst:.2f}, within ±15%: {all(abs(r - 1) <= 0.15 for r in ratios)}")


if __name__ == "__main__":
    main(sys.argv[1:])
