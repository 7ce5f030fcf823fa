"""Shared pieces of the multi-process tests: read a run's metrics, and the single-process reference run."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.helpers.tiny import load

# Every model-parallel degree back to 1: the layout the multi-process runs are compared against.
SINGLE_PROCESS = {"tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1, "expert_parallel": 1,
                  "pipeline_parallel_interleave_num": 1, "pipeline_parallel_layers_per_stage": "auto",
                  "pipeline_parallel_schedule": "1f1b", "data_parallel_shard": -1, "sequence_parallel": False,
                  "context_parallel_method": "colossal", "ulysses_degree_in_cp": None}


def metrics(out: Path, rank: int = 0) -> list[dict]:
    """Rank `rank`'s metrics.jsonl records of a run written to `out`."""
    return [json.loads(line) for line in (out / "log" / f"rank_{rank}" / "metrics.jsonl").read_text().splitlines()]


def column(records: list[dict], key: str) -> np.ndarray:
    return np.array([r[key] for r in records], np.float64)


def single(raw: dict, out: Path, resume_from=None):
    """Train `raw` in this process with every model-parallel degree 1 (checkpoints next to `out`)."""
    from mftk.engine.run import train

    one = dict(raw, parallelism={**raw["parallelism"], **SINGLE_PROCESS})
    return train(load(one, f"checkpoint.save_path={out}_ckpt"), output_dir=out, resume_from=resume_from,
                 install_signals=False)


def run_single(raw: dict, out: Path, *overrides: str, resume_from=None):
    from mftk.engine.run import train

    return train(load(raw, *overrides), output_dir=out, resume_from=resume_from, install_signals=False)
