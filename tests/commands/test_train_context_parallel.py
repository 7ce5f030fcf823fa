"""`mftk train --nproc 2` with context_parallel=2 (colossal) on Qwen3 tiny: the same losses and grad norms as the
single-process run, and the cp2 checkpoint resumes in one process. Plus the chunk assignment, checked by hand.

The msrun job (~25 s) runs once (module fixture) and several tests read it.
"""
from __future__ import annotations


import numpy as np
import pytest
import yaml
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.msrun import column, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

REL = 1e-5


def test_colossal_positions_balance_the_causal_work():
    from mftk.engine.parallel.context_parallel import colossal_positions

    # seq 8, cp 2: chunks [0 1] [2 3] [4 5] [6 7]; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert colossal_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert colossal_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    # every rank attends to the same number of (query, key) pairs under the causal mask
    work = [int((colossal_positions(16, 4, r) + 1).sum()) for r in range(4)]
    assert len(set(work)) == 1
    with pytest.raises(ValueError):
        colossal_positions(10, 2, 0)





@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("cp")
    corpus = write_corpus(d / "corpus" / "tiny_text_document")
    q = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_cp", steps=3, gbs=4)
    q["parallelism"].update({"context_parallel": 2})
    (d / "cp.yaml").write_text(yaml.safe_dump(q))
    return {"dir": d, "q": q}


@pytest.fixture(scope="module")
def cp2(work):
    r = runner.invoke(app, ["train", str(work["dir"] / "cp.yaml"), "--nproc", "2", "--output-dir",
                            str(work["dir"] / "out_cp")])
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def single_q(work):
    return single(work["q"], work["dir"] / "single_q")


@pytest.mark.slow
@pytest.mark.engine
def test_cp2_matches_single_process(work, cp2, single_q):
    for rank in (0, 1):  # the loss is averaged over the CP group: the same line on both ranks
        m = metrics(work["dir"] / "out_cp", rank)
        assert [r["step"] for r in m] == [1, 2, 3]
        np.testing.assert_allclose(column(m, "loss"), single_q.losses, rtol=REL)
        np.testing.assert_allclose(column(m, "grad_norm"), single_q.grad_norms, rtol=REL)
    info = (work["dir"] / "out_cp" / "log" / "rank_1" / "info.log").read_text()
    assert "rank 1 holds sequence chunks 1 and 2 of 4" in info
    assert "context_parallel=2" in cp2.stdout


@pytest.mark.slow
@pytest.mark.engine
def test_cp2_checkpoint_resumes_in_one_process(work, cp2, single_q):
    d = work["dir"]
    res = single(work["q"], d / "resume_q", resume_from=d / "ckpt_cp" / "iteration_00000002")
    assert res.resume.saved_world == 2 and res.resume.world == 1
    np.testing.assert_allclose(res.losses, single_q.losses[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, single_q.grad_norms[2:], rtol=REL)
