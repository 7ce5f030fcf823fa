"""Every dimension composed with the others (issue 16): for each layout below, `mftk train --nproc N` runs 3 steps
on a tiny template with the same losses, grad norms, load-balancing and MTP losses as the single-process run
with the same global batch (1e-5 relative, fp32); its step-2 checkpoint, resumed by `mftk resume` under another
layout of the list, is the same state bit for bit (re-saved by that layout: model and optimizer), and resumed
in one process it continues with the single-process step 3.

An msrun job's start-up (MindSpore imports in every worker, the cluster join) is most of a tiny run's cost, so
the runs share three msrun jobs (`Runs`): each worker runs `mftk train/resume --nproc N`'s worker body
(`train_worker`) once per run, building that run's groups, model and optimizer; `mftk train --nproc 4` itself runs
in `test_plan_parallels_best_layout_trains`. The single-process references run in-process.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from commands.app import app
from tests.helpers.cli import runner
from tests.helpers.msrun import SharedJobs, column, job_slug, metrics, single
from tests.helpers.sharded import assert_bits_equal
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
SP = {"sequence_parallel": True}
QWEN4 = {"num_hidden_layers": 4}

# name -> (template, workers, parallelism, model overrides)
LAYOUTS = {
    "qwen3 pp2×dp2": ("qwen3_tiny.yaml", 4, {"pipeline_parallel": 2, "data_parallel_shard": 1}, {}),
    "qwen3 pp2×tp2": ("qwen3_tiny.yaml", 4, {"pipeline_parallel": 2, "tensor_parallel": 2, **SP}, {}),
    "qwen3 pp2×fsdp2": ("qwen3_tiny.yaml", 4, {"pipeline_parallel": 2}, {}),
    "qwen3 cp2×tp2": ("qwen3_tiny.yaml", 4, {"context_parallel": 2, "tensor_parallel": 2, **SP}, {}),
    "qwen3 cp2×fsdp2": ("qwen3_tiny.yaml", 4, {"context_parallel": 2}, {}),
    "qwen3 pp2 v2": ("qwen3_tiny.yaml", 4, {"pipeline_parallel": 2, "pipeline_parallel_interleave_num": 2,
                                            "pipeline_parallel_schedule": "interleaved_1f1b"}, QWEN4),
    "deepseek tp2": ("deepseek_v3_tiny.yaml", 4, {"tensor_parallel": 2, **SP}, {}),
    "deepseek tp2×ep2": ("deepseek_v3_tiny.yaml", 4, {"tensor_parallel": 2, "expert_parallel": 2, **SP}, {}),
    "deepseek pp2×ep2": ("deepseek_v3_tiny.yaml", 4, {"pipeline_parallel": 2, "expert_parallel": 2}, {}),
    "deepseek pp2×tp2": ("deepseek_v3_tiny.yaml", 4, {"pipeline_parallel": 2, "tensor_parallel": 2, **SP}, {}),
    "deepseek cp2×ep2": ("deepseek_v3_tiny.yaml", 4, {"context_parallel": 2, "expert_parallel": 2}, {}),
    "qwen3 pp2×tp2×dp2": ("qwen3_tiny.yaml", 8, {"pipeline_parallel": 2, "tensor_parallel": 2,
                                                  "data_parallel_shard": 1, **SP}, {}),
    "deepseek pp2×ep2×fsdp2": ("deepseek_v3_tiny.yaml", 8, {"pipeline_parallel": 2, "expert_parallel": 2,
                                                            "data_parallel_shard": 2}, {}),
    "deepseek tp2×ep2×dp2": ("deepseek_v3_tiny.yaml", 8, {"tensor_parallel": 2, "expert_parallel": 2,
                                                          "data_parallel_shard": 1, **SP}, {}),
    # the reference's other context-parallel methods
    "qwen3 cp2 ulysses×fsdp2": ("qwen3_tiny.yaml", 4, {"context_parallel": 2, "context_parallel_method": "ulysses"}, {}),
    "qwen3 cp4 hybrid": ("qwen3_tiny.yaml", 4, {"context_parallel": 4, "context_parallel_method": "hybrid",
                                                "ulysses_degree_in_cp": 2}, {}),
    "deepseek cp2 ulysses×ep2": ("deepseek_v3_tiny.yaml", 4, {"context_parallel": 2, "expert_parallel": 2,
                                                             "context_parallel_method": "ulysses"}, {}),
}
# each layout the issue names has its step-2 checkpoint resumed under another one of the list (same model); the
# other context-parallel methods shard no weight differently from colossal's (CP splits the sequence), so their
# checkpoints are checked by continuing in one process only (each resave is one more ~35 s msrun job)
RESUME_UNDER = {
    "qwen3 pp2×dp2": "qwen3 cp2×tp2", "qwen3 pp2×tp2": "qwen3 cp2×fsdp2", "qwen3 pp2×fsdp2": "qwen3 pp2×tp2",
    "qwen3 cp2×tp2": "qwen3 pp2×dp2", "qwen3 cp2×fsdp2": "qwen3 pp2×tp2×dp2", "qwen3 pp2 v2": "qwen3 cp2×tp2",
    "qwen3 pp2×tp2×dp2": "qwen3 pp2×fsdp2",
    "deepseek tp2": "deepseek pp2×ep2", "deepseek tp2×ep2": "deepseek cp2×ep2", "deepseek pp2×ep2": "deepseek tp2×ep2",
    "deepseek pp2×tp2": "deepseek tp2×ep2×dp2", "deepseek cp2×ep2": "deepseek pp2×tp2",
    "deepseek pp2×ep2×fsdp2": "deepseek tp2", "deepseek tp2×ep2×dp2": "deepseek pp2×ep2×fsdp2",
}
KEYS = {"qwen3_tiny.yaml": ("loss", "grad_norm"),
        "deepseek_v3_tiny.yaml": ("loss", "grad_norm", "load_balancing_loss", "mtp_1_loss")}


_slug = job_slug


def _parallelism(name: str) -> dict:
    """Every parallel key a layout of the list sets, at its default unless ``name`` sets it."""
    keys = {k for _, _, par, _ in LAYOUTS.values() for k in par}
    defaults = {"context_parallel_method": "colossal", "ulysses_degree_in_cp": None,
                "pipeline_parallel_schedule": "1f1b", "data_parallel_shard": -1, "sequence_parallel": False}
    return {k: defaults.get(k, 1) for k in keys} | LAYOUTS[name][2]


IDS = [_slug(n) for n in LAYOUTS]


class Runs:
    """Every run of the module, in three shared msrun jobs (`launch_many`), each launched once: the 4-worker
    layouts' runs and the resaves under a 4-worker layout of their checkpoints; the 8-worker layouts' runs and
    every resave under an 8-worker layout; the resaves of the 8-worker checkpoints under a 4-worker layout.
    The single-process references run in-process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.corpus = write_corpus(root / "corpus" / "tiny_text_document")
        self._single: dict[tuple, Path] = {}
        self.jobs = SharedJobs(root)

    def raw(self, name: str, *, parallelism_of: str | None = None) -> dict:
        """The config of layout ``name`` (its model), with the parallelism of ``parallelism_of`` when given."""
        template, _, _, model = LAYOUTS[name]
        raw = tiny_raw(template, self.corpus, self.root / f"ckpt_{_slug(name)}", steps=3, gbs=4)
        raw["model"].update(model)
        raw["parallelism"].update(_parallelism(parallelism_of or name))
        return raw

    def single(self, name: str) -> Path:
        """The single-process run of the layout's model (shared by layouts of the same model)."""
        template, _, _, model = LAYOUTS[name]
        key = (template, tuple(sorted(model.items())))
        if key not in self._single:
            out = self.root / f"single_{len(self._single)}"
            single(self.raw(name), out)
            self._single[key] = out
        return self._single[key]

    def run(self, name: str) -> Path:
        """``name``'s 3-step run (as `mftk train CFG --nproc N` runs it on every worker)."""
        self._job("4" if _world(name) == 4 else "8")
        return self.root / f"out_{_slug(name)}"

    def resaved(self, name: str) -> Path:
        """``name``'s step-2 checkpoint resumed under `RESUME_UNDER` [name] with nothing left to train (as
        `mftk resume --from STEP2 --nproc N` runs it): its final save writes the loaded state in that layout."""
        other = RESUME_UNDER[name]
        self._job("8" if _world(other) == 8 else "4" if _world(name) == 4 else "8to4")
        return self.root / f"resaved_{_slug(name)}" / "iteration_00000002"

    def step(self, name: str, step: int) -> Path:
        return self.root / f"ckpt_{_slug(name)}" / f"iteration_{step:08d}"

    def _job(self, job: str) -> None:
        """Launch ``job`` (and the jobs whose checkpoints it reads) once."""
        for needed in {"4": (), "8": ("4",), "8to4": ("8",)}[job]:
            self._job(needed)
        self.jobs.results(job, 8 if job == "8" else 4, lambda: self._runs_of(job))

    def _runs_of(self, job: str) -> list[dict]:
        world = 8 if job == "8" else 4
        runs = [self._train(n) for n in LAYOUTS if job != "8to4" and _world(n) == world]
        return runs + [self._resave(n) for n, other in RESUME_UNDER.items() if _world(other) == world
                       and (job == "8" or _world(n) == (4 if job == "4" else 8))]

    def _train(self, name: str) -> dict:
        return self.jobs.train_run(name, self.raw(name))

    def _resave(self, name: str) -> dict:
        cfg = self.root / f"resave_{_slug(name)}.yaml"
        cfg.write_text(yaml.safe_dump(self.raw(name, parallelism_of=RESUME_UNDER[name])))
        return {"config": str(cfg), "output_dir": str(self.root / f"out_resave_{_slug(name)}"),
                "resume_from": str(self.step(name, 2)),
                "overrides": [f"checkpoint.save_path={self.root / f'resaved_{_slug(name)}'}", "training.steps=2"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("layouts"))


def _world(name: str) -> int:
    return LAYOUTS[name][1]


def _last_rank(name: str) -> int:
    return _world(name) - 1


@pytest.mark.parametrize("name", list(LAYOUTS), ids=IDS)
def test_layout_matches_single_process(runs, name):
    out, one = runs.run(name), metrics(runs.single(name))
    for rank in (0, _last_rank(name)):  # the first and the last pipeline stage, or any two ranks
        m = metrics(out, rank)
        assert [r["step"] for r in m] == [1, 2, 3]
        for key in KEYS[LAYOUTS[name][0]]:
            got = column(m, "pipeline_loss" if key == "loss" and m[0]["loss"] is None else key)
            np.testing.assert_allclose(got, column(one, key), rtol=REL, err_msg=f"{name} rank {rank}: {key}")


@pytest.mark.parametrize("name", list(RESUME_UNDER), ids=[_slug(n) for n in RESUME_UNDER])
def test_checkpoint_reshards_bit_exactly_under_another_layout(runs, name):
    from mftk.ckpt.load import load_global

    saved, resaved = load_global(runs.step(name, 2)), load_global(runs.resaved(name))
    assert_bits_equal(saved, resaved)  # every weight, buffer, moment and the step, from every stage
    other = json.loads((runs.resaved(name) / "metadata.json").read_text())["state_dict_metadata"]
    assert other.keys() == json.loads((runs.step(name, 2) / "metadata.json").read_text())["state_dict_metadata"].keys()


@pytest.mark.parametrize("name", list(LAYOUTS), ids=IDS)
def test_checkpoint_continues_in_one_process(runs, name):
    runs.run(name)
    one = metrics(runs.single(name))
    res = single(runs.raw(name), runs.root / f"continue_{_slug(name)}", resume_from=runs.step(name, 2))
    assert res.resume.saved_world == LAYOUTS[name][1] and res.resume.world == 1
    np.testing.assert_allclose(res.losses, column(one, "loss")[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, column(one, "grad_norm")[2:], rtol=REL)


def test_plan_parallels_best_layout_trains(tmp_path):
    """`plan-parallel templates/deepseek_v3_tiny.yaml --world-size 4` recommends a layout that validate-config
    accepts and `train --nproc 4` runs (the template as shipped, one step)."""
    from tests.helpers.tiny import ROOT

    template = str(ROOT / "templates" / "deepseek_v3_tiny.yaml")
    r = runner.invoke(app, ["plan-parallel", template, "--world-size", "4", "--json"])
    assert r.exit_code == 0, r.output
    best = yaml.safe_load(json.loads(r.stdout)["yaml"])["parallelism"]
    model_parallel = ("tensor_parallel", "expert_parallel", "context_parallel", "pipeline_parallel")
    assert math.prod(best[k] for k in model_parallel) > 1  # a model-parallel layout, not plain DP
    sets = [x for k, v in best.items() for x in ("--set", f"parallelism.{k}={str(v).lower()}")]
    r = runner.invoke(app, ["validate-config", template, "--world-size", "4", *sets])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["train", template, "--nproc", "4", "--output-dir", str(tmp_path / "out"), *sets,
                            "--set", "training.steps=1", "--set", "checkpoint.enable_save=false"])
    assert r.exit_code == 0, r.output[-3000:]
    assert f"tensor_parallel={best['tensor_parallel']}" in r.stdout
    assert len(metrics(tmp_path / "out")) == 1
