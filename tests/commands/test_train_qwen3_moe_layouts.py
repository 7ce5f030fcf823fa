"""Qwen3-MoE under the parallel dimensions it shares with Qwen3 (GQA attention) and DeepSeek-V3 (MoE layers):
for each layout below, `mftk train --nproc N` runs 3 steps of the tiny template with the losses, grad norms
and load-balancing losses of the single-process run with the same global batch (1e-5 relative, fp32). The
pipeline runs 4 micro-batches per step under 1F1B (the second forward runs before the first backward's
replay), once with ``global_aux_loss``, whose running expert counts the replay must neither add again nor
read ahead of the single process; and pp2×fsdp2 with ``global_aux_loss`` (FSDP's unit replays nested in the
pipeline's) gives the numbers of fsdp2 alone.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers.msrun import SharedJobs, column, job_slug, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
KEYS = ("loss", "grad_norm", "load_balancing_loss")
FOUR = {"num_hidden_layers": 4}  # 'auto' splits the layers evenly over two stages
GLOBAL = {**FOUR, "moe_router_load_balancing_type": "global_aux_loss"}
# name -> (workers, parallelism, model overrides)
LAYOUTS = {
    "tp2×ep2": (2, {"tensor_parallel": 2, "expert_parallel": 2, "sequence_parallel": True}, {}),
    "cp2×ep2": (2, {"context_parallel": 2, "expert_parallel": 2}, {}),
    "pp2": (2, {"pipeline_parallel": 2}, FOUR),
    "pp2 global_aux_loss": (2, {"pipeline_parallel": 2}, GLOBAL),
}
# FSDP replays each unit inside the pipeline's replay, and both put the counts back. With dp > 1 each rank's
# running counts are its own micro-batches' (not one process's), so the reference here is plain fsdp2.
WITH_FSDP = {"pp2×fsdp2 global_aux_loss": (4, {"pipeline_parallel": 2}, GLOBAL),
             "fsdp2 global_aux_loss": (2, {}, GLOBAL)}
ALL = {**LAYOUTS, **WITH_FSDP}


_slug = job_slug


class Runs:
    """The single-process references (one per model) and each layout's run, each run once: the 2-worker runs in
    one msrun job, the 4-worker run in another (each worker runs `mftk train --nproc N`'s body per run)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.corpus = write_corpus(root / "corpus" / "tiny_text_document")
        self._single: dict[tuple, Path] = {}
        self.jobs = SharedJobs(root)

    def raw(self, name: str, *, parallel: bool) -> dict:
        _, par, model = ALL[name]
        raw = tiny_raw("qwen3_moe_tiny.yaml", self.corpus, self.root / f"ckpt_{_slug(name)}_{parallel}", steps=3,
                       gbs=4)
        raw["model"].update(model)
        if parallel:
            raw["parallelism"].update(par)
        return raw

    def single(self, name: str) -> Path:
        key = tuple(sorted(LAYOUTS[name][2].items()))
        if key not in self._single:
            out = self.root / f"single_{len(self._single)}"
            single(self.raw(name, parallel=False), out)
            self._single[key] = out
        return self._single[key]

    def run(self, name: str) -> Path:
        """``name``'s 3-step run; the runs of one worker count share one msrun job (`SharedJobs`)."""
        workers = ALL[name][0]
        self.jobs.results(str(workers), workers, lambda: [self._run(n) for n in ALL if ALL[n][0] == workers])
        return self.root / f"out_{_slug(name)}"

    def _run(self, name: str) -> dict:
        cfg = self.root / f"{_slug(name)}.yaml"
        cfg.write_text(yaml.safe_dump(self.raw(name, parallel=True)))
        return {"config": str(cfg), "output_dir": str(self.root / f"out_{_slug(name)}")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("qwen3_moe_layouts"))


@pytest.mark.parametrize("name", list(LAYOUTS), ids=[_slug(n) for n in LAYOUTS])
def test_qwen3_moe_layout_matches_single_process(runs, name):
    out, one = runs.run(name), metrics(runs.single(name))
    assert all(r["load_balancing_loss"] > 0 for r in one)
    for rank in (0, LAYOUTS[name][0] - 1):  # under PP: the first and the last stage
        m = metrics(out, rank)
        assert [r["step"] for r in m] == [1, 2, 3]
        for key in KEYS:
            got = column(m, "pipeline_loss" if key == "loss" and m[0]["loss"] is None else key)
            np.testing.assert_allclose(got, column(one, key), rtol=REL, err_msg=f"{name} rank {rank}: {key}")


def test_global_aux_loss_pipeline_with_fsdp_matches_fsdp_alone(runs):
    """pp2×fsdp2 (4 workers) gives the losses, grad norms and load-balancing losses of fsdp2 (2 workers)."""
    out, ref = runs.run("pp2×fsdp2 global_aux_loss"), metrics(runs.run("fsdp2 global_aux_loss"))
    for rank in (0, 3):  # the first and the last rank (both stages)
        m = metrics(out, rank)
        assert [r["step"] for r in m] == [1, 2, 3]
        for key in KEYS:
            got = column(m, "pipeline_loss" if key == "loss" and m[0]["loss"] is None else key)
            np.testing.assert_allclose(got, column(ref, key), rtol=REL, err_msg=f"rank {rank}: {key}")
