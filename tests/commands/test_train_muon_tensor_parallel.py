"""Muon under tensor parallel (issue 36): Qwen3 and DeepSeek-V3 trained with Muon at tp2, alone and combined
with FSDP or pipeline parallel, on msrun workers give the losses, grad norms, load-balancing and MTP losses of
the single-process run with the same global batch (1e-5 relative, fp32) over 3 steps. The standard is Muon's
math on each weight's whole matrix: every rank gathers its tensor-parallel (and FSDP) blocks, orthogonalises
the matrix one process holds with ``sqrt(max(a, b))`` of the full piece, and keeps its block, as MindSpore
Transformers 2.1.0 does in PyNative (mindformers/pynative/optimizer/muon.py, ``_apply_muon_update``: a 2-D
DTensor's ``full_tensor()`` before Newton–Schulz, ``distribute_tensor(…).to_local()`` after). Orthogonalising each
shard on its own would give other numbers from step 2 on. A tp2 checkpoint (Muon's momentum saved from TP blocks)
resumed in one process continues with the single-process step 3.

QK-clip is off: it needs max-logit tracking, which tensor parallel does not run yet (`config.runnable`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.msrun import SharedJobs, column, job_slug, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
SP = {"sequence_parallel": True}
MUON = {"type": "Muon", "weight_decay": 0.01, "qk_clip_enabled": False}
# name -> (template, workers, parallelism)
LAYOUTS = {
    "qwen3 tp2": ("qwen3_tiny.yaml", 2, {"tensor_parallel": 2, **SP}),
    "deepseek tp2": ("deepseek_v3_tiny.yaml", 2, {"tensor_parallel": 2, **SP}),
    "qwen3 tp2×fsdp2": ("qwen3_tiny.yaml", 4, {"tensor_parallel": 2, **SP}),  # data_parallel_shard -1: 2
    "deepseek pp2×tp2": ("deepseek_v3_tiny.yaml", 4, {"pipeline_parallel": 2, "tensor_parallel": 2, **SP}),
}
KEYS = {"qwen3_tiny.yaml": ("loss", "grad_norm"),
        "deepseek_v3_tiny.yaml": ("loss", "grad_norm", "load_balancing_loss", "mtp_1_loss")}


_slug = job_slug


class Runs:
    """The single-process references (in-process, one per template) and the msrun runs, in two shared jobs
    (`SharedJobs`): the 2-worker layouts' runs and the 4-worker ones'."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.corpus = write_corpus(root / "corpus" / "tiny_text_document")
        self._single: dict[str, Path] = {}
        self.jobs = SharedJobs(root)

    def raw(self, name: str) -> dict:
        template, _, parallel = LAYOUTS[name]
        raw = tiny_raw(template, self.corpus, self.ckpt(name), steps=3, gbs=4)
        raw["optimizer"] = dict(MUON)
        raw["parallelism"].update(parallel)
        return raw

    def ckpt(self, name: str) -> Path:
        return self.root / f"ckpt_{_slug(name)}"

    def single(self, name: str) -> Path:
        template = LAYOUTS[name][0]
        if template not in self._single:
            out = self.root / f"single_{template.split('_')[0]}"
            single(self.raw(name), out)
            self._single[template] = out
        return self._single[template]

    def run(self, name: str) -> Path:
        world = LAYOUTS[name][1]
        self.jobs.results(str(world), world, lambda: [self._train(n) for n in LAYOUTS if LAYOUTS[n][1] == world])
        return self.root / f"out_{_slug(name)}"

    def _train(self, name: str) -> dict:
        return self.jobs.train_run(name, self.raw(name))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("muon_tp"))


@pytest.mark.parametrize("name", list(LAYOUTS), ids=[_slug(n) for n in LAYOUTS])
def test_muon_under_tensor_parallel_matches_single_process(runs, name):
    out, one = runs.run(name), metrics(runs.single(name))
    info = (out / "log" / "rank_0" / "info.log").read_text()
    assert "tensor_parallel=2" in info and "Muon:" in info
    for rank in (0, LAYOUTS[name][1] - 1):  # the first and the last pipeline stage, or two TP ranks
        m = metrics(out, rank)
        assert [r["step"] for r in m] == [1, 2, 3]
        for key in KEYS[LAYOUTS[name][0]]:
            got = column(m, "pipeline_loss" if key == "loss" and m[0]["loss"] is None else key)
            np.testing.assert_allclose(got, column(one, key), rtol=REL, err_msg=f"{name} rank {rank}: {key}")


@pytest.mark.parametrize("name", ["qwen3 tp2", "deepseek tp2"], ids=["qwen3_tp2", "deepseek_tp2"])
def test_muon_tensor_parallel_checkpoint_continues_in_one_process(runs, name):
    runs.run(name)
    one = metrics(runs.single(name))
    res = single(runs.raw(name), runs.root / f"continue_{_slug(name)}",
                 resume_from=runs.ckpt(name) / "iteration_00000002")
    assert res.resume.saved_world == 2 and res.resume.world == 1
    np.testing.assert_allclose(res.losses, column(one, "loss")[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, column(one, "grad_norm")[2:], rtol=REL)
