"""Calibrate `mftk plan-parallel`'s memory model against measured peak RSS of real `mftk train` runs (CPU, fp32).

Each grid point runs in a fresh process: import MindSpore and the engine, record RSS (the idle-process
baseline), train 3 steps, record peak RSS (`ru_maxrss`). Measured = peak − baseline; estimate = the
planner's single-device total for the same config (unfused attention: the CPU engine materialises the
scores). Prints estimate/measured per point; the goal is within ±15%.

    .venv/bin/python bench/plan_calibration.py            # whole grid (minutes on 2 shared cores)
    .venv/bin/python bench/plan_calibration.py --quick    # three points
    .venv/bin/python bench/plan_calibration.py --llama    # Llama-3-8B FSDP8 estimate vs the published 82.4 GiB

Multi-worker points need the engine's multi-process launch; they are skipped until `train(world_size>1)` exists.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (template, overrides) — tiny shapes that train in seconds; activations vs states vary across the grid.
GRID = [
    ("templates/qwen3_tiny.yaml", {}),
    ("templates/qwen3_tiny.yaml", {"model.hidden_size": 256, "model.intermediate_size": 768, "model.num_attention_heads": 8,
                                   "model.num_key_value_heads": 4, "model.head_dim": 32}),
    ("templates/qwen3_tiny.yaml", {"model.num_hidden_layers": 8, "training.local_batch_size": 4}),
    ("templates/qwen3_tiny.yaml", {"model.hidden_size": 512, "model.intermediate_size": 1536, "model.num_attention_heads": 8,
                                   "model.num_key_value_heads": 8, "model.head_dim": 64, "model.num_hidden_layers": 4}),
    ("templates/deepseek_v3_tiny.yaml", {}),
    ("templates/deepseek_v3_tiny.yaml", {"model.hidden_size": 256, "model.moe_intermediate_size": 128,
                                         "model.intermediate_size": 512, "model.num_hidden_layers": 4}),
    ("templates/deepseek_v3_tiny.yaml", {"training.local_batch_size": 4, "model.num_hidden_layers": 4}),
]
QUICK = [0, 3, 5]
COMMON = {"training.steps": 3, "checkpoint.enable_save": False, "training.global_batch_size": None}


def _overrides(over: dict) -> list[str]:
    lbs = over.get("training.local_batch_size", 1)
    merged = {**COMMON, **over, "training.global_batch_size": lbs}
    return [f"{k}={v}" for k, v in merged.items()]


def estimate_bytes(template: str, over: dict) -> dict:
    from mftk.config.load import load_config
    from mftk.plan.layout import Layout
    from mftk.plan.memory import Assumptions, estimate
    from mftk.plan.report import plan_inputs

    cfg = load_config(ROOT / template, overrides=_overrides(over), check_files=False).config
    est = estimate(Layout(world=1), plan_inputs(cfg, cfg.parallelism), Assumptions(fused_attention=False))
    return {"total": est.peak_bytes, "terms": {t.name: t.value for t in est.peak.terms}}


def worker(template: str, over: dict) -> dict:
    """Runs inside a fresh interpreter: baseline after imports, peak after training."""
    import resource

    import mindspore  # noqa: F401  (part of the idle baseline)

    from mftk.config.load import load_config
    from mftk.engine import run

    loaded = load_config(ROOT / template, overrides=_overrides(over), check_files=True)
    base = _rss_now()
    with tempfile.TemporaryDirectory() as out:
        run.train(loaded, output_dir=out, install_signals=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"baseline": base, "peak": peak, "measured": peak - base}


def _rss_now() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


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
    from mftk.plan.layout import Layout
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


def main(argv: list[str]) -> None:
    if "--llama" in argv:
        print(json.dumps(llama3_8b_fsdp8(), indent=2))
        return
    points = [GRID[i] for i in QUICK] if "--quick" in argv else GRID
    print(f"{'config':<28} {'overrides':<58} {'estimate MiB':>12} {'measured MiB':>12} {'ratio':>6}")
    for template, over in points:
        est = estimate_bytes(template, over)["total"]
        got = measure(template, over)["measured"]
        name = Path(template).stem
        print(f"{name:<28} {json.dumps(over)[:58]:<58} {est / 2**20:>12.1f} {got / 2**20:>12.1f} {est / got:>6.2f}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
