"""Synthetic MindSpore Transformers logs for the parse-log tests (deterministic)."""
from __future__ import annotations

import datetime
import math
import random

from mftk.logs.format import format_step_line

PREFIX = "2025-06-01 10:00:{s:02d},{ms:03d} - mindformers[mindformers/pynative/callback/loss_callback.py:337] - INFO - "
_T0 = datetime.datetime(2025, 6, 1, 10, 0, 0)


def prefix_at(seconds: float) -> str:
    """The logger prefix of a line logged `seconds` after the synthetic runs' epoch."""
    t = _T0 + datetime.timedelta(seconds=seconds)
    return PREFIX.replace("10:00:{s:02d},{ms:03d}", "").replace("2025-06-01 ", t.strftime("%Y-%m-%d %H:%M:%S,")
                                                                  + f"{t.microsecond // 1000:03d}")
SEED_LINES = [  # the two example lines of the quick-start seed document
    "{ step:[    1/   10], loss:  11.813965, per_step_time:  13570ms, load_balancing_loss:   1.093977, "
    "lr: 1.000000e-05, grad_norm:  13.831877, throughput:   1.36T }",
    "{ step:[    2/   10], loss:  11.755612, per_step_time:    710ms, load_balancing_loss:   1.106543, "
    "lr: 1.000000e-05, grad_norm:  19.926786, throughput:  25.92T }",
]


def step_metrics(step: int, *, gbs: int = 8, rng: random.Random | None = None) -> dict:
    rng = rng or random.Random(step)
    return {
        "step": step, "consumed_samples": step * gbs, "global_batch_size": gbs,
        "loss": 3.0 + 8.0 * math.exp(-step / 200) + rng.uniform(-0.02, 0.02),
        "per_step_time": 5000 if step == 1 else 700 + rng.randint(-20, 20),
        "load_balancing_loss": 1.0 + rng.uniform(0, 0.01),
        "lr": 1e-4 * min(1.0, step / 10), "grad_norm": 2.0 + rng.uniform(0, 0.5),
        "throughput": 25.0 + rng.uniform(-0.5, 0.5),
    }


def synth_lines(n: int, *, total: int | None = None, start: int = 1, nan_at=(), spike_at=(), prefix: bool = True,
                noise_every: int = 0, seed: int = 0, gbs: int = 8) -> list[str]:
    """`n` step lines; NaN loss/grad at `nan_at`, loss x3 at `spike_at`; an INFO line every `noise_every`.

    Each `seed` is a separate job, logged a day after the previous seed's (so a resume, made with a later
    seed, has later timestamps than the lines it replaces, as a real one does); steps are a second apart."""
    rng = random.Random(seed)
    total = total or start + n - 1
    out = []
    for step in range(start, start + n):
        m = step_metrics(step, gbs=gbs, rng=rng)
        if step in nan_at:
            m["loss"], m["grad_norm"] = float("nan"), None
        if step in spike_at:
            m["loss"] *= 3
        line = format_step_line(m, total_steps=total)
        stamp = prefix_at(seed * 86400 + step)
        out.append((stamp if prefix else "") + line)
        if noise_every and step % noise_every == 0:
            out.append(stamp + f"Checkpoint saved at step {step} to ./ckpt (async=False)")
    return out
