"""Shared msrun jobs: each runs once per session (msrun start-up costs 10–20 s) and many tests read it."""
from __future__ import annotations

import pytest

from mftk.engine.launch import LaunchSpec, launch


def run_job(target: str, nproc: int, tmp_path_factory, payload: dict | None = None, timeout_s: float = 180):
    log_dir = tmp_path_factory.mktemp(target)
    return launch(f"tests.engine.parallel.jobs:{target}", payload or {}, spec=LaunchSpec(nproc=nproc, log_dir=log_dir),
                  timeout_s=timeout_s)


@pytest.fixture(scope="session")
def two_rank(tmp_path_factory) -> dict[int, dict]:
    """Results of `jobs.two_rank_checks` on 2 workers, by rank."""
    return run_job("two_rank_checks", 2, tmp_path_factory).results


@pytest.fixture(scope="session")
def four_rank(tmp_path_factory) -> dict[int, dict]:
    return run_job("four_rank_groups", 4, tmp_path_factory, timeout_s=240).results
