"""DeepSeek-V4 under context parallel (issue 36), with AdamW: the tiny V4 template (hash- and learned-routed MoE
inside hyper-connection layers, CSA/HCA attention with the indexer loss, MTP) under cp2, cp2·tp2 and cp2·pp2
gives the losses, grad norms, load-balancing, indexer and MTP losses of the single-process run with the same
global batch (1e-5 relative, fp32), on the first and the last rank. cp2's step-2 checkpoint continues in one
process with the single-process step 3, and re-saved under cp2·tp2 it is the same state bit for bit.

The plan (`parallelize.whole_sequence_v4_attention`): each CP rank holds colossal's load-balanced positions
(chunks i and 2cp−1−i) for the embedding, hyper-connections, norms, MoE and loss; each attention runs whole on
the sequence gathered back into order, every rank keeping its own positions of the output. The runs share
msrun jobs (`SharedJobs`): 2 workers (cp2), then 4 (cp2·tp2, cp2·pp2 and cp2's checkpoint re-saved under
cp2·tp2).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers.msrun import SharedJobs, column, job_slug, metrics, single
from tests.helpers.sharded import assert_bits_equal
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
KEYS = ("loss", "grad_norm", "load_balancing_loss", "indexer_loss", "mtp_1_loss")
CP = {"context_parallel": 2, "data_parallel_shard": 1}
STAGES = {"pipeline_parallel_layers_per_stage": ["0-1", "2"]}  # 3 layers: 2 + 1
# name -> (workers, parallelism)
LAYOUTS = {
    "cp2": (2, CP),
    "cp2×tp2": (4, {**CP, "tensor_parallel": 2, "sequence_parallel": True}),
    "cp2×pp2": (4, {**CP, "pipeline_parallel": 2, **STAGES}),
}
RESAVE = ("cp2", "cp2×tp2")  # cp2's checkpoint re-saved under cp2·tp2 (in the 4-worker job)


_slug = job_slug


class Runs:
    """The single-process reference (in-process) and the msrun runs, each launched once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.corpus = write_corpus(root / "corpus" / "tiny_text_document")
        self.jobs = SharedJobs(root)
        self._single: Path | None = None

    def raw(self, name: str, *, parallelism_of: str | None = None) -> dict:
        raw = tiny_raw("deepseek_v4_tiny.yaml", self.corpus, self.ckpt(name), steps=3, gbs=4)
        raw["optimizer"] = {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.1}
        raw["parallelism"].update(LAYOUTS[parallelism_of or name][1])
        return raw

    def ckpt(self, name: str) -> Path:
        return self.root / f"ckpt_{_slug(name)}"

    def single(self) -> Path:
        if self._single is None:
            self._single = self.root / "single"
            raw = self.raw("cp2")
            raw["parallelism"].update({"context_parallel": 1})
            single(raw, self._single)
        return self._single

    def run(self, name: str) -> Path:
        self._job(str(LAYOUTS[name][0]))
        return self.root / f"out_{_slug(name)}"

    def resaved(self) -> Path:
        self._job("4")
        return self.root / "resaved" / "iteration_00000002"

    def _job(self, job: str) -> None:
        if job == "4":
            self._job("2")  # the re-save reads cp2's checkpoint
        self.jobs.results(job, int(job), lambda: self._runs_of(job), timeout_s=1800)

    def _runs_of(self, job: str) -> list[dict]:
        runs = [self._train(n) for n, (w, _) in LAYOUTS.items() if str(w) == job]
        return runs + ([self._resave()] if job == "4" else [])

    def _train(self, name: str) -> dict:
        return self.jobs.train_run(name, self.raw(name))

    def _resave(self) -> dict:
        name, into = RESAVE
        cfg = self.root / "resave.yaml"
        cfg.write_text(yaml.safe_dump(self.raw(name, parallelism_of=into)))
        return {"config": str(cfg), "output_dir": str(self.root / "out_resave"),
                "resume_from": str(self.ckpt(name) / "iteration_00000002"),
                "overrides": [f"checkpoint.save_path={self.root / 'resaved'}", "training.steps=2"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("v4_cp"))


@pytest.mark.parametrize("name", list(LAYOUTS), ids=_slug)
def test_v4_context_parallel_matches_single_process(runs, name):
    out, one = runs.run(name), metrics(runs.single())
    assert {"indexer_loss", "mtp_1_loss", "load_balancing_loss"} <= one[0].keys()
    assert "context_parallel=2" in (out / "log" / "rank_0" / "info.log").read_text()
    for rank in (0, LAYOUTS[name][0] - 1):  # two CP ranks, or the first and the last pipeline stage
        m = metrics(out, rank)
        assert [r["step"] for r in m] == [1, 2, 3]
        for key in KEYS:
            got = column(m, "pipeline_loss" if key == "loss" and m[0]["loss"] is None else key)
            np.testing.assert_allclose(got, column(one, key), rtol=REL, err_msg=f"{name} rank {rank}: {key}")


def test_v4_cp2_checkpoint_continues_in_one_process(runs):
    runs.run("cp2")
    one = metrics(runs.single())
    raw = runs.raw("cp2")
    raw["parallelism"].update({"context_parallel": 1})
    res = single(raw, runs.root / "continue", resume_from=runs.ckpt("cp2") / "iteration_00000002")
    assert res.resume.saved_world == 2 and res.resume.world == 1
    np.testing.assert_allclose(res.losses, column(one, "loss")[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, column(one, "grad_norm")[2:], rtol=REL)


def test_v4_cp2_checkpoint_reshards_bit_exactly_under_cp2_tp2(runs):
    from mftk.ckpt.load import load_global

    saved, resaved = load_global(runs.ckpt("cp2") / "iteration_00000002"), load_global(runs.resaved())
    assert_bits_equal(saved, resaved)  # every weight, buffer, moment and the step
