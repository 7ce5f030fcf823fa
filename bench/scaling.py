"""Data-parallel scaling of `mftk train` on the tiny models: tokens/s and communication share for 1, 2, 4 workers.

Same global batch (8) and data for every worker count; 1 worker runs in-process, more through msrun.
On a 2-core machine this measures the overhead of going multi-process (collectives over TCP, cores
shared), not a speedup. Per step, from rank 0's metrics.jsonl (first step dropped as warm-up):
median step time, tokens/s = gbs·seq / step time, and communication share = time in gradient
all-reduce, loss averaging and FSDP all-gather / step time.

    .venv/bin/python bench/scaling.py [--models qwen3_tiny deepseek_v3_tiny] [--workers 1 2 4] [--steps 6]
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


def config(model: str, d: Path, steps: int, layout: str) -> Path:
    from tests.helpers.tiny import tiny_raw, write_corpus

    corpus = d / "corpus" / "tiny_text_document"
    if not corpus.with_suffix(".bin").exists():
        write_corpus(corpus)
    raw = tiny_raw(f"{model}.yaml", corpus, d / f"ckpt_{model}", steps=steps, gbs=8, seq=128)
    raw["checkpoint"]["enable_save"] = False
    raw["parallelism"]["data_parallel_shard"] = -1 if layout == "fsdp" else 1
    path = d / f"{model}_{layout}.yaml"
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
        train_distributed(cfg, output_dir=out, spec=LaunchSpec(nproc=workers), timeout_s=600)
    return [json.loads(x) for x in (out / "log" / "rank_0" / "metrics.jsonl").read_text().splitlines()]


def summarise(records: list[dict]) -> tuple[float, float, float]:
    steps = records[1:] or records
    step_ms = float(np.median([r["per_step_time"] for r in steps]))
    comm_ms = float(np.median([r.get("time_communication_ms", 0.0) for r in steps]))
    tokens = steps[0]["tokens"]
    return step_ms, tokens / (step_ms / 1000.0), comm_ms / step_ms if step_ms else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["qwen3_tiny", "deepseek_v3_tiny"])
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--layout", choices=["dp", "fsdp"], default="dp")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mftk-scaling-") as tmp:
        d = Path(tmp)
        print(f"{'model':<18} {'workers':>7} {'step ms':>9} {'tokens/s':>10} {'vs 1':>6} {'comm share':>11}")
        for model in args.models:
            cfg = config(model, d, args.steps, args.layout)
            base = None
            for n in args.workers:
                step_ms, tps, share = summarise(run(cfg, n, d / f"out_{model}_{n}"))
                base = base or tps
                print(f"{model:<18} {n:>7} {step_ms:>9.0f} {tps:>10.0f} {tps / base:>6.2f} {share:>10.0%}", flush=True)


if __name__ == "__main__":
    main()
