"""Per-rank memory of data parallel, FSDP and recompute on a ~220 M-parameter Qwen3-like model, each run next to
`plan-parallel --profile mftk-cpu`'s estimate; tokens/s of each.

Model: 12 layers, hidden 1024, FFN 2816, 16 heads (head_dim 64, 16 KV heads), vocab 32000, untied head —
219.7 M parameters. 2 msrun workers, one micro-batch of one sequence per rank per step, 3 steps. Per rank:
peak RSS (VmHWM of the worker), the RSS after imports (baseline), and the plan's estimate of peak − baseline
(what `tests/plan/test_memory.py` calibrates). Runs are sequential (two workers share the machine's memory);
each job is one point, so the ratios are of single runs (the step times: median of steps 2–3).

FSDP units keep their activations unless recompute selects their layer (then they replay it), so the seq-1024
pair measures what full recompute cuts under FSDP.

Goals (issue 17): dp2's peak ≤ 28 B/param + the activations plan-parallel estimates; fsdp2's peak ≤ 0.65× dp2's;
with full recompute the peak ≤ 0.6× the same run without it (seq 1024); every estimate within ±15 %.

    .venv/bin/python bench/memory.py [--runs dp2-256 fsdp2-256 fsdp2-1024 ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = {"model.num_hidden_layers": 12, "model.hidden_size": 1024, "model.intermediate_size": 2816,
         "model.num_attention_heads": 16, "model.num_key_value_heads": 16, "model.head_dim": 64,
         "model.vocab_size": 32000, "model.tie_word_embeddings": False}
DP = {"parallelism.data_parallel_shard": 1}
FSDP = {"parallelism.data_parallel_shard": -1}
FULL = {"recompute.mode": "full", "recompute.full_recompute_layer": "[0-11]"}


def seq(s: int) -> dict:
    return {"model.seq_length": s, "train_dataset.dataloader.config.seq_length": s}


RUNS = {
    "dp2-256": {**DP, **seq(256)},
    "fsdp2-256": {**FSDP, **seq(256)},
    "dp2-256-recompute": {**DP, **seq(256), **FULL},
    "fsdp2-1024": {**FSDP, **seq(1024)},
    "fsdp2-1024-recompute": {**FSDP, **seq(1024), **FULL},
}
DEFAULT = ["dp2-256", "fsdp2-256", "fsdp2-1024", "fsdp2-1024-recompute"]
MiB = 2 ** 20
ACTIVATION_TERMS = ("activations", "embedding acts", "logits + loss")


def params() -> int:
    from mftk.config.load import load_config
    from mftk.config.templates import TEMPLATES_DIR
    from mftk.plan.flops import param_counts

    cfg = load_config(TEMPLATES_DIR / "qwen3_tiny.yaml", overrides=[f"{k}={v}" for k, v in MODEL.items()],
                      check_files=False).config
    return int(param_counts(cfg.model)[0])


def _measure(measure_multi, over: dict, tries: int = 3) -> list[dict]:
    """One 2-worker job; started again (new ports) when another job on the machine took its ports first."""
    from bench._calibration import QWEN3
    from mftk.errors import TrainingError

    for attempt in range(tries):
        try:
            return measure_multi(QWEN3, over, 2, timeout_s=1800)
        except TrainingError as exc:
            if "Repeated registration" not in str(exc) and "port" not in str(exc).lower() or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def main() -> None:
    from bench._calibration import QWEN3, estimate_bytes, measure_multi

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", default=DEFAULT, choices=list(RUNS))
    args = ap.parse_args()
    n = params()
    print(f"model: {n / 1e6:.1f} M parameters; 2 workers, 1 sequence per rank per step, 3 steps")
    print(f"{'run':<22} {'rank':>4} {'peak MiB':>9} {'B/param':>8} {'base MiB':>9} {'est MiB':>8} {'est/meas':>9} "
          f"{'acts est MiB':>12} {'tokens/s':>9}")
    peaks: dict[str, float] = {}
    acts: dict[str, float] = {}
    for name in args.runs:
        over = {**MODEL, **RUNS[name]}
        est = estimate_bytes(QWEN3, over, 2)
        act = sum(v for k, v in est["terms"].items() if k in ACTIVATION_TERMS)
        got = _measure(measure_multi, over)
        for g in got:
            steps = g["step_ms"][1:] or g["step_ms"]
            tps = g["tokens"][0] / (float(np.median(steps)) / 1000.0) if steps and g["tokens"] else float("nan")
            print(f"{name:<22} {g['rank']:>4} {g['peak'] / MiB:>9.0f} {g['peak'] / n:>8.1f} {g['baseline'] / MiB:>9.0f} "
                  f"{est['total'] / MiB:>8.0f} {est['total'] / g['measured']:>9.2f} {act / MiB:>12.0f} {tps:>9.1f}",
                  flush=True)
        peaks[name] = max(g["peak"] for g in got)
        acts[name] = act
    print()
    if "dp2-256" in peaks:
        budget = 28 * n + acts["dp2-256"]
        print(f"dp2 peak {peaks['dp2-256'] / MiB:.0f} MiB vs 28 B/param + estimated activations "
              f"{budget / MiB:.0f} MiB: {peaks['dp2-256'] / budget:.2f}× (goal ≤ 1)")
    if "dp2-256" in peaks and "fsdp2-256" in peaks:
        print(f"fsdp2 / dp2 peak at seq 256: {peaks['fsdp2-256'] / peaks['dp2-256']:.2f} (goal ≤ 0.65)")
    for base in ("fsdp2-1024", "dp2-256"):
        if base in peaks and f"{base}-recompute" in peaks:
            print(f"{base}: full recompute / without: {peaks[f'{base}-recompute'] / peaks[base]:.2f} (goal ≤ 0.6)")


if __name__ == "__main__":
    main()
