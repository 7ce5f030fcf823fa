"""Calibrate `mftk plan-parallel`'s memory model against measured peak RSS of real `mftk train` runs (CPU, fp32).

The points and the measurement are `bench._calibration`'s (each point in a fresh process: VmHWM
after 3 steps minus VmRSS after imports, beside the planner's "mftk-cpu" estimate). Prints
estimate/measured per point (median of --repeat runs); the goal is within ±15%.

    .venv/bin/python bench/plan_calibration.py            # whole grid, 3 runs each (~10 min on 2 shared cores)
    .venv/bin/python bench/plan_calibration.py --quick    # four points (the quick grid)
    .venv/bin/python bench/plan_calibration.py --llama    # Llama-3-8B FSDP8 estimate vs the published 82.4 GiB

    .venv/bin/python bench/plan_calibration.py --multi    # several workers (msrun): dp2, fsdp2, tp2, dsv3 ep2
    .venv/bin/python bench/plan_calibration.py --compiled # compiled layers: forced on − forced off vs the term

Several workers: one msrun job per point (`engine.launch`, free ports); each rank measures its own
baseline (VmRSS after imports and ``communication.init()``) and VmHWM after training and returns them
as JSON; the estimate is the planner's per-device peak for the job's layout under the same profile.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._calibration import (COMPILED, GRID, MULTI, QUICK, estimate_bytes, measure,  # noqa: E402
                                measure_multi)


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
    if "--compiled" in argv:
        main_compiled(repeat)
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


def compiled_term(template: str, over: dict) -> float:
    """The estimate's "compiled layers" term for a point, whatever its size (the threshold moved to 0)."""
    from mftk import derive

    saved, derive.JIT_MIN_PARAMS = derive.JIT_MIN_PARAMS, 0
    try:
        return estimate_bytes(template, over)["terms"]["compiled layers"]
    finally:
        derive.JIT_MIN_PARAMS = saved


def main_compiled(repeat: int) -> None:
    """Per point: the layers forced compiled and forced eager, interleaved, medians; their difference is
    what the graphs hold, beside the estimate's term."""
    print(f"compiled layers: measured = median(forced compiled) − median(forced eager) over {repeat} runs each")
    print(f"{'config':<20} {'term MiB':>9} {'measured MiB':>12} {'ratio':>6}")
    ratios = []
    for name, template, over in (GRID[i] for i in COMPILED):
        runs = {True: [], False: []}
        for _ in range(repeat):
            for flag in (True, False):
                runs[flag].append(measure(template, over, compiled=flag)["measured"])
        got = statistics.median(runs[True]) - statistics.median(runs[False])
        term = compiled_term(template, over)
        ratios.append(term / got)
        print(f"{name:<20} {term / 2**20:>9.1f} {got / 2**20:>12.1f} {term / got:>6.2f}", flush=True)
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(f"{len(ratios)} points, worst ratio {worst:.2f}")


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
