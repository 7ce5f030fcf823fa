"""DeepSeek-V4 under pipeline parallel: the tiny V4 template (hash- and learned-routed MoE inside hyper-connection
layers, CSA/HCA attention with the indexer loss, MTP, Muon) on 2 workers as 2 stages gives the losses, grad norms,
load-balancing, indexer and MTP losses of the single-process run with the same global batch (1e-5 relative,
fp32), on the last stage's log and on the first's. Stages pass all residual streams ``(B, S, n, H)``; each stage
adds its own layers' indexer losses to its objective, and the logged indexer loss is their mean over every stage's
layers, as one process logs it. Its step-2 checkpoint continues in one process with the single-process step 3."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from tests.helpers.msrun import SharedJobs, column, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
KEYS = ("loss", "grad_norm", "load_balancing_loss", "indexer_loss", "mtp_1_loss")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("v4_pp")
    corpus = write_corpus(d / "corpus" / "tiny_text_document")
    raw = tiny_raw("deepseek_v4_tiny.yaml", corpus, d / "ckpt_pp", steps=3, gbs=4)
    raw["parallelism"].update({"pipeline_parallel": 2, "data_parallel_shard": 1,  # 3 layers: 2 + 1
                               "pipeline_parallel_layers_per_stage": ["0-1", "2"]})
    (d / "pp2.yaml").write_text(yaml.safe_dump(raw))
    v2 = tiny_raw("deepseek_v4_tiny.yaml", corpus, d / "ckpt_v2", steps=2, gbs=4)  # 4 layers: 2 chunks of 1 a stage
    v2["model"].update({"num_hidden_layers": 4, "compress_ratios": [0, 4, 4, 16, 0]})
    v2["checkpoint"]["enable_save"] = False
    v2["parallelism"].update({"pipeline_parallel": 2, "data_parallel_shard": 1, "pipeline_parallel_interleave_num": 2})
    (d / "v2.yaml").write_text(yaml.safe_dump(v2))
    shared = SharedJobs(d)
    shared.results("2", 2, lambda: [{"config": str(d / "pp2.yaml"), "output_dir": str(d / "out_pp2")},
                                    {"config": str(d / "v2.yaml"), "output_dir": str(d / "out_v2")}])
    return {"dir": d, "raw": raw, "single": single(raw, d / "single"), "v2": v2}


def test_v4_pp2_matches_single_process(work):
    d = work["dir"]
    one = metrics(d / "single")
    assert {"indexer_loss", "mtp_1_loss", "load_balancing_loss"} <= one[0].keys()
    assert "pipeline_parallel=2" in (d / "out_pp2" / "log" / "rank_0" / "info.log").read_text()
    last, first = metrics(d / "out_pp2", 1), metrics(d / "out_pp2", 0)
    assert [r["step"] for r in last] == [1, 2, 3]
    for key in KEYS:
        np.testing.assert_allclose(column(last, key), column(one, key), rtol=REL, err_msg=f"last stage: {key}")
    key0 = {"loss": "pipeline_loss"}  # the first stage's line is the reference's N/A; the value stays in the JSON
    for key in KEYS:
        np.testing.assert_allclose(column(first, key0.get(key, key)), column(one, key), rtol=REL,
                                   err_msg=f"first stage: {key}")


def test_v4_interleaved_pp2_matches_single_process(work):
    """Interleaved 1F1B, two chunks a stage (layers 0, 2 on the first, 1, 3 on the last): the CSA layers 1 and 2
    with their indexers in a middle chunk of each stage."""
    d = work["dir"]
    one = metrics(_single_v2(work))
    last = metrics(d / "out_v2", 1)
    assert [r["step"] for r in last] == [1, 2]
    for key in KEYS:
        np.testing.assert_allclose(column(last, key), column(one, key), rtol=REL, err_msg=f"interleaved: {key}")


def _single_v2(work):
    out = work["dir"] / "single_v2"
    if not out.exists():
        single(work["v2"], out)
    return out


def test_v4_pp2_checkpoint_continues_in_one_process(work):
    d = work["dir"]
    one = metrics(d / "single")
    res = single(work["raw"], d / "continue", resume_from=d / "ckpt_pp" / "iteration_00000002")
    assert res.resume.saved_world == 2 and res.resume.world == 1
    np.testing.assert_allclose(res.losses, column(one, "loss")[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, column(one, "grad_norm")[2:], rtol=REL)
