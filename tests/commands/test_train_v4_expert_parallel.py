"""DeepSeek-V4 (every part of the tiny template on: hash-routed and learned-routed MoE layers inside
hyper-connection layers, CSA/HCA attention with the indexer loss, MTP) trained with Muon under expert parallel
× FSDP on msrun workers gives the losses, grad norms, load-balancing, indexer and MTP losses of the
single-process run with the same global batch (1e-5 relative, fp32). Each rank holds whole experts, so Muon
orthogonalises each of its own expert matrices as one process does. Its step-2 checkpoint resumed under the
same layout continues with the very step 3 (metrics and saved state bit for bit), re-saved under fsdp4×ep4 it
is the same state bit for bit, and resumed in one process it continues with the single-process step 3. FSDP over
2 workers without EP gives the single-process numbers too (1e-4).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers.msrun import SharedJobs, column, metrics, single
from tests.helpers.sharded import assert_bits_equal
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
KEYS = ("loss", "grad_norm", "load_balancing_loss", "indexer_loss", "mtp_1_loss")
# name -> (workers, data_parallel_shard, expert_parallel)
LAYOUTS = {"fsdp2×ep2": (2, 2, 2), "fsdp4×ep4": (4, 4, 4)}
FSDP2 = "fsdp2"  # FSDP over both workers, no EP: the Muon weights' rows are gathered for the orthogonalisation


class Runs:
    """The single-process reference and the msrun runs, each run once, in two shared msrun jobs (`SharedJobs`;
    each worker runs `mftk train/resume --nproc N`'s body per run): on 2 workers the fsdp2×ep2 run, its step-2
    checkpoint resumed under the same layout and the fsdp2 run; on 4 the fsdp4×ep4 run and that checkpoint
    re-saved under it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.corpus = write_corpus(root / "corpus" / "tiny_text_document")
        self._single: Path | None = None
        self.jobs = SharedJobs(root)

    def raw(self, name: str | None, ckpt: Path) -> dict:
        raw = tiny_raw("deepseek_v4_tiny.yaml", self.corpus, ckpt, steps=3, gbs=4)  # data_parallel_shard -1
        if name == FSDP2:
            raw["checkpoint"]["enable_save"] = False
        elif name is not None:
            _, shard, ep = LAYOUTS[name]
            raw["parallelism"].update({"data_parallel_shard": shard, "expert_parallel": ep})
        return raw

    def single(self) -> Path:
        if self._single is None:
            self._single = self.root / "single"
            single(self.raw(None, self.root / "ckpt_single"), self._single)
        return self._single

    def ckpt(self, name: str) -> Path:
        return self.root / f"ckpt_{name}"

    def run(self, name: str) -> Path:
        """``name``'s 3-step run."""
        self._job(str(LAYOUTS[name][0]) if name != FSDP2 else "2")
        return self.root / f"out_{name}"

    def resumed(self) -> tuple[Path, Path]:
        """(output, save path) of fsdp2×ep2's step-2 checkpoint resumed under fsdp2×ep2 (step 3 again)."""
        self._job("2")
        return self.root / "out_resumed", self.root / "ckpt_resumed"

    def resaved(self) -> Path:
        """fsdp2×ep2's step-2 checkpoint resumed under fsdp4×ep4 with nothing left to train: its final save
        writes the loaded state in that layout."""
        self._job("4")
        return self.root / "ckpt_resaved" / "iteration_00000002"

    def _job(self, job: str) -> None:
        if job == "4":
            self._job("2")  # the re-save reads fsdp2×ep2's checkpoint
        self.jobs.results(job, int(job), lambda: self._runs_of(job))

    def _runs_of(self, job: str) -> list[dict]:
        name = "fsdp2×ep2" if job == "2" else "fsdp4×ep4"
        cfg = self.root / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump(self.raw(name, self.ckpt(name))))
        step2 = str(self.ckpt("fsdp2×ep2") / "iteration_00000002")
        if job == "2":
            again = {"config": str(cfg), "output_dir": str(self.root / "out_resumed"), "resume_from": step2,
                     "overrides": [f"checkpoint.save_path={self.root / 'ckpt_resumed'}"]}
        else:
            resave = self.root / "resave.yaml"
            resave.write_text(yaml.safe_dump(self.raw("fsdp4×ep4", self.root / "ckpt_resave")))
            again = {"config": str(resave), "output_dir": str(self.root / "out_resave"), "resume_from": step2,
                     "overrides": [f"checkpoint.save_path={self.root / 'ckpt_resaved'}", "training.steps=2"]}
        runs = [{"config": str(cfg), "output_dir": str(self.root / f"out_{name}")}, again]
        if job == "2":
            fsdp = self.root / f"{FSDP2}.yaml"
            fsdp.write_text(yaml.safe_dump(self.raw(FSDP2, self.ckpt(FSDP2))))
            runs.append({"config": str(fsdp), "output_dir": str(self.root / f"out_{FSDP2}")})
        return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("v4_ep"))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_v4_expert_parallel_matches_single_process(runs, name):
    out, one = runs.run(name), metrics(runs.single())
    info = (out / "log" / "rank_0" / "info.log").read_text()
    assert f"expert_parallel={LAYOUTS[name][2]}" in info and "Muon:" in info
    assert {"indexer_loss", "mtp_1_loss", "load_balancing_loss"} <= one[0].keys()
    for rank in (0, LAYOUTS[name][0] - 1):
        m = metrics(out, rank)
        assert [r["step"] for r in m] == [1, 2, 3]
        for key in KEYS:
            np.testing.assert_allclose(column(m, key), column(one, key), rtol=REL, err_msg=f"{name} rank {rank}: {key}")


def test_v4_expert_parallel_resumes_bit_exactly(runs):
    from mftk.ckpt.load import load_global

    name = "fsdp2×ep2"
    out, save = runs.resumed()
    again, first = metrics(out), metrics(runs.run(name))
    assert [x["step"] for x in again] == [3]
    for key in KEYS:
        assert again[0][key] == first[2][key], key  # the very same numbers
    assert_bits_equal(load_global(runs.ckpt(name) / "iteration_00000003"), load_global(save / "iteration_00000003"))


def test_v4_expert_parallel_checkpoint_continues_in_one_process(runs):
    name = "fsdp2×ep2"
    runs.run(name)
    one = metrics(runs.single())
    res = single(runs.raw(name, runs.root / "ckpt_continue"), runs.root / "continue",
                 resume_from=runs.ckpt(name) / "iteration_00000002")
    assert res.resume.saved_world == 2 and res.resume.world == 1
    np.testing.assert_allclose(res.losses, column(one, "loss")[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, column(one, "grad_norm")[2:], rtol=REL)


def test_v4_expert_parallel_checkpoint_reshards_bit_exactly(runs):
    """The fsdp2×ep2 step-2 checkpoint resumed under fsdp4×ep4 with nothing left to train: its final save writes
    the loaded state in that layout, bit for bit the same tensors (model, Muon and AdamW states, the step)."""
    from mftk.ckpt.load import load_global

    assert_bits_equal(load_global(runs.ckpt("fsdp2×ep2") / "iteration_00000002"),
                      load_global(runs.resaved()))


def test_v4_muon_fsdp2_matches_single_process(runs):
    """FSDP over 2 workers without EP (the Muon weights' rows gathered for the orthogonalisation)."""
    out, one = runs.run(FSDP2), metrics(runs.single())
    info = (out / "log" / "rank_0" / "info.log").read_text()
    assert "FSDP:" in info and "Muon:" in info
    m = metrics(out)
    assert [r["step"] for r in m] == [1, 2, 3]
    np.testing.assert_allclose(column(m, "loss"), column(one, "loss"), rtol=1e-4)
    np.testing.assert_allclose(column(m, "grad_norm"), column(one, "grad_norm"), rtol=1e-4)
