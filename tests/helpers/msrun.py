"""Shared pieces of the multi-process tests: read a run's metrics, and the single-process reference run."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

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


def train_many(runs: list[dict]) -> list[dict]:
    """msrun worker target: `engine.workers.train_worker` (what every rank of `mftk train/resume --nproc N` runs)
    for each of ``runs`` in turn, in the processes of one job. Why: a job's start-up (MindSpore imports in every
    worker, the cluster join) is most of a tiny run's cost, and each run builds its own groups, model and
    optimizer anyway. A failing run fails the job, naming the run."""
    import gc

    from mftk.engine.workers import train_worker

    results = []
    for run in runs:
        gc.collect()  # the previous run's model and optimizer (reference cycles) go before this one builds
        try:
            results.append(train_worker(**run))
        except Exception as exc:
            raise RuntimeError(f"shared job: run with output {run['output_dir']} failed: {exc}") from exc
    return results


def launch_many(runs: list[dict], nproc: int, log_dir: Path, timeout_s: float = 600) -> list[dict]:
    """Every one of ``runs`` (`train_worker` keywords: config, overrides, output_dir, resume_from) in one msrun
    job of ``nproc`` workers (`train_many`); rank 0's results, in order."""
    from mftk.engine.launch import LaunchSpec, launch

    runs = [{"overrides": [], "resume_from": None, **run} for run in runs]
    result = launch("tests.helpers.msrun:train_many", {"runs": runs}, spec=LaunchSpec(nproc=nproc, log_dir=log_dir),
                    timeout_s=timeout_s)
    return result.results[min(result.results)]


def job_slug(name: str) -> str:
    """A layout's name ("tp2×dp2 muon") as a file name."""
    return name.replace(" ", "_").replace("×", "x")


class SharedJobs:
    """A test module's shared msrun jobs (`launch_many`), each launched once, on first use, with its log under
    ``root``; a job that failed fails every test that reads it, without being launched again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[str, list[dict] | Exception] = {}

    def results(self, job: str, nproc: int, runs: Callable[[], list[dict]], timeout_s: float = 600) -> list[dict]:
        """Rank 0's results of ``job`` (``runs()``'s runs on ``nproc`` workers), launching it the first time."""
        if job not in self._done:
            try:
                self._done[job] = launch_many(runs(), nproc, self.root / f"msrun_{job}", timeout_s=timeout_s)
            except Exception as exc:  # noqa: BLE001 - kept, so the job is not launched again for each test
                self._done[job] = exc
        done = self._done[job]
        if isinstance(done, Exception):
            raise done
        return done

    def train_run(self, name: str, raw: dict) -> dict:
        """One run of a job: ``raw`` written as ``<slug>.yaml`` under ``root``, trained into ``out_<slug>``."""
        cfg = self.root / f"{job_slug(name)}.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        return {"config": str(cfg), "output_dir": str(self.root / f"out_{job_slug(name)}")}
