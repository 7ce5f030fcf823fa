"""Parallel layouts of `mftk train` on the tiny models: tokens/s and communication share per layout, next to plain DP.

Same global batch (8), sequence (128) and data for every layout; 1 worker runs in-process, more through msrun.
On a 2-core machine this measures the overhead of going multi-process (collectives over TCP, 4 workers on 2
cores), not a speedup. Per step, from rank 0's metrics.jsonl (first step dropped as warm-up): median step
time, tokens/s = gbs·seq / step time, and communication share = time inside collectives (model forward and
backward, gradient sync, loss averaging, FSDP all-gather: ``time_collectives_ms``) / step time. The layouts
of a model run one after the other in each round (``--rounds`` > 1 interleaves them; medians over rounds);
"vs dp" is tokens/s relative to plain DP with the same worker count, "vs dp=d" relative to plain DP over as
many workers as the layout's own data-parallel degree d (the same micro-batches per rank: what the layout's
model-parallel dimensions cost on top of its data parallelism; d = 1 runs in-process). The last three columns
explain the rest: ``ms/coll`` is the time inside collectives per call (on 2 shared cores mostly the wait for
every rank of the group to be scheduled), ``mb/rank`` the micro-batches each rank runs per step (gbs / d), and
``compute ms/mb`` the time outside collectives per micro-batch and rank: a tiny model is dispatch-bound, so a
model-parallel rank launches about as many ops per micro-batch as a DP rank (each op smaller) while running
world/d times as many micro-batches.

    .venv/bin/python bench/scaling.py [--models qwen3_tiny deepseek_v3_tiny] [--workers 4] [--steps 6] [--rounds 1]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SP = {"sequence_parallel": True}
# layout name -> parallelism at 4 workers (plain "dp" first: the others are compared with it)
LAYOUTS = {
    "qwen3_tiny": {
        "dp": {"data_parallel_shard": 1}, "fsdp": {}, "tp2×dp2": {"tensor_parallel": 2, "data_parallel_shard": 1, **SP},
        "pp2×dp2": {"pipeline_parallel": 2, "data_parallel_shard": 1},
        "cp2×dp2": {"context_parallel": 2, "data_parallel_shard": 1},
        "pp2×tp2": {"pipeline_parallel": 2, "tensor_parallel": 2, **SP},
        "cp2×tp2": {"context_parallel": 2, "tensor_parallel": 2, **SP},
        "pp2 v2×dp2": {"pipeline_parallel": 2, "pipeline_parallel_interleave_num": 2, "data_parallel_shard": 1},
    },
    "deepseek_v3_tiny": {
        "dp": {"data_parallel_shard": 1}, "fsdp": {}, "ep2×fsdp2": {"expert_parallel": 2},
        "tp2×dp2": {"tensor_parallel": 2, "data_parallel_shard": 1, **SP},
        "tp2×ep2": {"tensor_parallel": 2, "expert_parallel": 2, **SP},
        "pp2×ep2": {"pipeline_parallel": 2, "expert_parallel": 2},
        "cp2×ep2": {"context_parallel": 2, "expert_parallel": 2},
        "pp2×tp2": {"pipeline_parallel": 2, "tensor_parallel": 2, **SP},
    },
}
GBS = 8  # global batch: sequences per step, one per micro-batch (local_batch_size 1)
MODEL = {"qwen3_tiny": {"num_hidden_layers": 4}, "deepseek_v3_tiny": {}}  # 4 layers: 2 stages × 2 chunks


def config(model: str, d: Path, steps: int, name: str, parallelism: dict) -> Path:
    from tests.helpers.tiny import tiny_raw, write_corpus

    corpus = d / "corpus" / "tiny_text_document"
    if not corpus.with_suffix(".bin").exists():
        write_corpus(corpus)
    raw = tiny_raw(f"{model}.yaml", corpus, d / f"ckpt_{model}", steps=steps, gbs=GBS, seq=128)
    raw["checkpoint"]["enable_save"] = False
    raw["model"].update(MODEL[model])
    raw["parallelism"].update(parallelism)
    path = d / f"{model}_{name.replace('×', 'x').replace(' ', '_')}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def run(cfg: Path, workers: int, out: Path) -> list[dict]:
    from mftk.config.load import load_config
    from mftk.engine.launch import LaunchSpec
    from mftk.engine.run import train
    from mftk.engine.workers import train_distributed

    if workers == 1:
        train(load_config(cfg), output_dir=out, install_signals=False)
    else:
        train_distributed(cfg, output_dir=out, spec=LaunchSpec(nproc=workers), timeout_s=900)
    return [json.loads(x) for x in (out / "log" / "rank_0" / "metrics.jsonl").read_text().splitlines()]


def summarise(records: list[dict]) -> tuple[float, float, float, float]:
    """(median step ms, tokens/s, share of the step inside collectives, collectives per step)."""
    steps = records[1:] or records
    step_ms = float(np.median([r["per_step_time"] for r in steps]))
    comm_ms = float(np.median([r.get("time_collectives_ms", 0.0) for r in steps]))
    calls = float(np.median([r.get("collectives", 0) for r in steps]))
    tokens = steps[0]["tokens"]
    return step_ms, tokens / (step_ms / 1000.0), comm_ms / step_ms if step_ms else 0.0, calls


def data_parallel(cfg: Path, workers: int) -> int:
    """The layout's data-parallel degree on ``workers`` ranks (dp = world / (tp·pp·cp))."""
    from mftk.config.load import load_config

    p = load_config(cfg, check_files=False, world_size=workers).config.parallelism
    return workers // (p.tensor_parallel * p.pipeline_parallel * p.context_parallel)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(LAYOUTS))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--layouts", nargs="+", default=None, help="layout names (default: all of the model's)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mftk-scaling-") as tmp:
        d = Path(tmp)
        print(f"{'model':<18} {'layout':<12} {'workers':>7} {'step ms':>9} {'tokens/s':>10} {'vs dp':>6} "
              f"{'vs dp=d':>8} {'comm share':>11} {'collectives':>12} {'ms/coll':>8} {'mb/rank':>8} "
              f"{'compute ms/mb':>14}")
        for model in args.models:
            names = [n for n in LAYOUTS[model] if args.layouts is None or n in args.layouts or n == "dp"]
            cfgs = {n: config(model, d, args.steps, n, LAYOUTS[model][n]) for n in names}
            own_dp = {n: data_parallel(cfgs[n], args.workers) for n in names}
            runs = [(n, cfgs[n], args.workers) for n in names]
            runs += [(f"dp={k}", cfgs["dp"], k) for k in sorted(set(own_dp.values()) - {args.workers})]
            results: dict[str, list[tuple[float, ...]]] = {n: [] for n, _, _ in runs}
            for r in range(args.rounds):
                for n, cfg, workers in runs:
                    out = d / f"out_{model}_{cfg.stem}_{workers}_{r}"
                    results[n].append(summarise(run(cfg, workers, out)))
            med = {n: [float(np.median([x[i] for x in v])) for i in range(4)] for n, v in results.items()}
            for n in names:
                step_ms, tps, share, calls = med[n]
                same = med["dp" if own_dp[n] == args.workers else f"dp={own_dp[n]}"][1]
                micro = GBS // own_dp[n]  # micro-batches (of one sequence) each rank runs per step
                comm_ms = share * step_ms
                print(f"{model:<18} {n:<12} {args.workers:>7} {step_ms:>9.0f} {tps:>10.0f} {tps / med['dp'][1]:>6.2f} "
                      f"{tps / same:>8.2f} {share:>10.0%} {calls:>12.0f} {comm_ms / max(calls, 1):>8.1f} "
                      f"{micro:>8d} {(step_ms - comm_ms) / micro:>14.0f}", flush=True)


if __name__ == "__main__":
    main()
