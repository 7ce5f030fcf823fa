"""DeepSeek-V4 (every part of the tiny template on: hash-routed and learned-routed MoE layers inside
hyper-connection layers, CSA/HCA attention with the indexer loss, MTP) trained with Muon under expert parallel
× FSDP on msrun workers gives the losses, grad norms, load-balancing, indexer and MTP losses of the
single-process run with the same global batch (1e-5 relative, fp32). Each rank holds whole experts, so Muon
orthogonalises each of its own expert matrices as one process does. Its step-2 checkpoint resumed under the
same layout continues with the very step 3 (metrics and saved state bit for bit), re-saved under fsdp4×ep4 it
is the same state bit for bit, and resumed in one process it continues with the single-process step 3.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from commands.app import app
from tests.helpers.cli import runner
from tests.helpers.msrun import column, metrics, single
from tests.helpers.sharded import assert_bits_equal
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
KEYS = ("loss", "grad_norm", "load_balancing_loss", "indexer_loss", "mtp_1_loss")
# name -> (workers, data_parallel_shard, expert_parallel)
LAYOUTS = {"fsdp2×ep2": (2, 2, 2), "fsdp4×ep4": (4, 4, 4)}


class Runs:
    """The single-process reference and each layout's msrun run, each run once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.corpus = write_corpus(root / "corpus" / "tiny_text_document")
        self._single: Path | None = None
        self._runs: dict[str, Path] = {}

    def raw(self, name: str | None, ckpt: Path) -> dict:
        raw = tiny_raw("deepseek_v4_tiny.yaml", self.corpus, ckpt, steps=3, gbs=4)
        if name is not None:
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
        if name not in self._runs:
            cfg = self.root / f"{name}.yaml"
            cfg.write_text(yaml.safe_dump(self.raw(name, self.ckpt(name))))
            out = self.root / f"out_{name}"
            r = runner.invoke(app, ["train", str(cfg), "--nproc", str(LAYOUTS[name][0]), "--output-dir", str(out)])
            assert r.exit_code == 0, r.output[-3000:]
            assert f"expert_parallel={LAYOUTS[name][2]}" in r.stdout and "Muon:" in r.stdout
            self._runs[name] = out
        return self._runs[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("v4_ep"))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_v4_expert_parallel_matches_single_process(runs, name):
    out, one = runs.run(name), metrics(runs.single())
    assert {"indexer_loss", "mtp_1_loss", "load_balancing_loss"} <= one[0].keys()
    for rank in (0, LAYOUTS[name][0] - 1):
        m = metrics(out, rank)
        assert [r["step"] for r in m] == [1, 2, 3]
        for key in KEYS:
            np.testing.assert_allclose(column(m, key), column(one, key), rtol=REL, err_msg=f"{name} rank {rank}: {key}")


def test_v4_expert_parallel_resumes_bit_exactly(runs):
    from mftk.ckpt.load import load_global

    name = "fsdp2×ep2"
    runs.run(name)
    cfg = runs.root / f"{name}.yaml"
    save, out = runs.root / "ckpt_resumed", runs.root / "out_resumed"
    r = runner.invoke(app, ["resume", str(cfg), "--from", str(runs.ckpt(name) / "iteration_00000002"), "--nproc", "2",
                            "--output-dir", str(out), "--set", f"checkpoint.save_path={save}"])
    assert r.exit_code == 0, r.output[-3000:]
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

    runs.run("fsdp2×ep2")
    cfg = runs.root / "resave.yaml"
    cfg.write_text(yaml.safe_dump(runs.raw("fsdp4×ep4", runs.root / "ckpt_resave")))
    save = runs.root / "ckpt_resaved"
    r = runner.invoke(app, ["resume", str(cfg), "--from", str(runs.ckpt("fsdp2×ep2") / "iteration_00000002"),
                            "--nproc", "4", "--output-dir", str(runs.root / "out_resave"),
                            "--set", f"checkpoint.save_path={save}", "--set", "training.steps=2"])
    assert r.exit_code == 0, r.output[-3000:]
    assert_bits_equal(load_global(runs.ckpt("fsdp2×ep2") / "iteration_00000002"),
                      load_global(save / "iteration_00000002"))
