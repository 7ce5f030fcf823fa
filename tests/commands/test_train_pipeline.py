"""`mftk train --nproc 2` with pipeline_parallel=2 on Qwen3 tiny: 1F1B with the 'auto' split and GPipe with an
explicit uneven split ('0-1', '2' of three layers) give the single-process losses and grad norms (global norm over
both stages); the last stage logs the loss line, the first the reference's non-last-stage line; each rank saves
its stage's tensors only, metadata.json says which rank holds which, and a pp2 checkpoint resumes in one process.

Both runs share one msrun job (its start-up is most of a tiny run's cost) and several tests read it.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.msrun import SharedJobs, column, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
NON_LAST = "loss: N/A (non-last PP stage, refer to last stage for real loss)"





@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("pp")
    corpus = write_corpus(d / "corpus" / "tiny_text_document")
    auto = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_auto", steps=3, gbs=4)  # 4 micro-batches per step
    auto["parallelism"].update({"pipeline_parallel": 2, "pipeline_parallel_layers_per_stage": "auto",
                                "pipeline_parallel_schedule": "1f1b"})
    (d / "auto.yaml").write_text(yaml.safe_dump(auto))
    three = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_gpipe", steps=3, gbs=4)
    three["model"]["num_hidden_layers"] = 3
    three["parallelism"].update({"pipeline_parallel": 2, "pipeline_parallel_layers_per_stage": ["0-1", "2"],
                                 "pipeline_parallel_schedule": "gpipe"})
    (d / "gpipe.yaml").write_text(yaml.safe_dump(three))
    return {"dir": d, "auto": auto, "three": three}


@pytest.fixture(scope="module")
def jobs(work):
    """Both pipeline runs in one shared msrun job (each worker runs `mftk train --nproc 2`'s body per run)."""
    d = work["dir"]
    shared = SharedJobs(d)
    return lambda: shared.results("2", 2, lambda: [{"config": str(d / f"{n}.yaml"), "output_dir": str(d / f"out_{n}")}
                                                   for n in ("auto", "gpipe")])


@pytest.fixture(scope="module")
def pp_auto(jobs):
    return jobs()[0]


@pytest.fixture(scope="module")
def pp_gpipe(jobs):
    return jobs()[1]


@pytest.fixture(scope="module")
def single_auto(work):
    return single(work["auto"], work["dir"] / "single_auto")


@pytest.fixture(scope="module")
def single_three(work):
    return single(work["three"], work["dir"] / "single_three")


def test_pp2_1f1b_auto_matches_single_process(work, pp_auto, single_auto):
    last = metrics(work["dir"] / "out_auto", 1)
    assert [r["step"] for r in last] == [1, 2, 3]
    np.testing.assert_allclose(column(last, "loss"), single_auto.losses, rtol=REL)
    np.testing.assert_allclose(column(last, "grad_norm"), single_auto.grad_norms, rtol=REL)
    first = metrics(work["dir"] / "out_auto", 0)
    assert all(r["loss"] is None for r in first)  # the loss lives on the last stage
    np.testing.assert_allclose(column(first, "pipeline_loss"), single_auto.losses, rtol=REL)
    np.testing.assert_allclose(column(first, "grad_norm"), single_auto.grad_norms, rtol=REL)  # one global norm


def test_pp2_log_lines_per_stage(work, pp_auto):
    d = work["dir"] / "out_auto"
    first = (d / "log" / "rank_0" / "info.log").read_text()
    last = (d / "log" / "rank_1" / "info.log").read_text()
    assert "consumed_samples: None, global_batch_size: None, " + NON_LAST in first
    assert "grad_norm: NaN }" in first
    assert NON_LAST not in last and "consumed_samples: 4, global_batch_size: 4, loss:" in last
    assert "stage 0 of 2 holds decoder layers [0], the embedding" in first
    assert "stage 1 of 2 holds decoder layers [1], the final norm and output layer" in last
    assert "pipeline_parallel=2" in first


def test_pp2_checkpoint_holds_each_stage_on_its_rank(work, pp_auto):
    from mftk.ckpt.safetensors_io import read_header

    step = work["dir"] / "ckpt_auto" / "iteration_00000003"
    r0 = set(read_header(step / "checkpoint-model-0000000-0000002.safetensors").tensors)
    r1 = set(read_header(step / "checkpoint-model-0000001-0000002.safetensors").tensors)
    assert "embedding.word_embeddings.weight" in r0 and not any(n.startswith("decoder.layers.1.") for n in r0)
    assert "output_layer.weight" in r1 and not any(n.startswith(("decoder.layers.0.", "embedding.")) for n in r1)
    meta = json.loads((step / "metadata.json").read_text())["storage_data"]

    def group(name):
        return meta[str((name, (0,)))][0]["rank_group"]

    assert group("embedding.word_embeddings.weight") == [0]
    assert group("decoder.layers.1.mlp.linear_fc1.weight") == [1]
    assert group("adam_v.output_layer.weight") == [1]
    assert group("global_step") == [0, 1]
    r = runner.invoke(app, ["inspect-ckpt", str(step), "--verify"])
    assert r.exit_code == 0, r.output


def test_pp2_checkpoint_resumes_in_one_process(work, pp_auto, single_auto):
    d = work["dir"]
    res = single(work["auto"], d / "resume_auto", resume_from=d / "ckpt_auto" / "iteration_00000002")
    assert res.resume.saved_world == 2 and res.resume.world == 1
    np.testing.assert_allclose(res.losses, single_auto.losses[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, single_auto.grad_norms[2:], rtol=REL)


def test_pp2_gpipe_explicit_uneven_split_matches_single_process(work, pp_gpipe, single_three):
    last = metrics(work["dir"] / "out_gpipe", 1)
    np.testing.assert_allclose(column(last, "loss"), single_three.losses, rtol=REL)
    np.testing.assert_allclose(column(last, "grad_norm"), single_three.grad_norms, rtol=REL)
    info = (work["dir"] / "out_gpipe" / "log" / "rank_0" / "info.log").read_text()
    assert "stage 0 of 2 holds decoder layers [0, 1], the embedding (schedule gpipe)" in info
