"""`mftk train --nproc 2` with tensor parallel (+ sequence parallel) on Qwen3 and expert parallel on DeepSeek-V3:
the same losses, grad norms (each replicated parameter counted once), load-balancing and MTP losses as the
single-process run with the same global batch; per-rank checkpoints whose metadata.json describes the TP/EP
blocks, and a 2-process checkpoint resumed by one process (resharding tp2/ep2 → 1).

The 2-worker runs share one msrun job (its start-up is most of a tiny run's cost) and several tests read it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.msrun import SharedJobs, column, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5





def meta(step_dir: Path) -> dict:
    return json.loads((step_dir / "metadata.json").read_text())["state_dict_metadata"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("mp")
    corpus = write_corpus(d / "corpus" / "tiny_text_document")
    q = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_tp", steps=3, gbs=4)
    q["parallelism"].update({"tensor_parallel": 2, "sequence_parallel": True})  # dp = 1
    (d / "q.yaml").write_text(yaml.safe_dump(q))
    ds = tiny_raw("deepseek_v3_tiny.yaml", corpus, d / "ckpt_ep", steps=3, gbs=4)
    ds["parallelism"]["expert_parallel"] = 2  # with data_parallel_shard -1: FSDP2 for dense, EP2 for experts
    (d / "ds.yaml").write_text(yaml.safe_dump(ds))
    g = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_gpt", steps=3, gbs=4)  # GPT-style: non-gated GELU MLP
    g["model"].update({"hidden_act": "gelu", "gated_linear_unit": False})
    g["parallelism"].update({"tensor_parallel": 2, "sequence_parallel": True})
    (d / "g.yaml").write_text(yaml.safe_dump(g))
    return {"dir": d, "q": q, "ds": ds, "g": g}


@pytest.fixture(scope="module")
def jobs(work):
    """tp2 and ep2 in one shared msrun job (each worker runs `mftk train --nproc 2`'s body per run)."""
    d = work["dir"]
    shared = SharedJobs(d)
    return lambda: shared.results("2", 2, lambda: [{"config": str(d / "q.yaml"), "output_dir": str(d / "out_tp")},
                                                   {"config": str(d / "ds.yaml"), "output_dir": str(d / "out_ep")},
                                                   {"config": str(d / "g.yaml"), "output_dir": str(d / "out_gpt")}])


@pytest.fixture(scope="module")
def tp2(work, jobs):
    jobs()
    return (work["dir"] / "out_tp" / "log" / "rank_0" / "info.log").read_text()


@pytest.fixture(scope="module")
def ep2(work, jobs):
    jobs()
    return (work["dir"] / "out_ep" / "log" / "rank_0" / "info.log").read_text()


@pytest.fixture(scope="module")
def single_q(work):
    return single(work["q"], work["dir"] / "single_q")


@pytest.fixture(scope="module")
def single_ds(work):
    return single(work["ds"], work["dir"] / "single_ds")


def test_tp2_matches_single_process(work, tp2, single_q):
    m = metrics(work["dir"] / "out_tp")
    assert [r["step"] for r in m] == [1, 2, 3]
    np.testing.assert_allclose(column(m, "loss"), single_q.losses, rtol=REL)
    np.testing.assert_allclose(column(m, "grad_norm"), single_q.grad_norms, rtol=REL)
    assert "tensor_parallel=2" in tp2


def test_tp2_of_a_non_gated_gelu_mlp_matches_single_process(work, jobs):
    """linear_fc1 of a non-gated MLP is F plain rows: tensor parallel cuts them as it cuts whole gate/up pairs."""
    jobs()
    m = metrics(work["dir"] / "out_gpt")
    ref = single(work["g"], work["dir"] / "single_g")
    np.testing.assert_allclose(column(m, "loss"), ref.losses, rtol=REL)
    np.testing.assert_allclose(column(m, "grad_norm"), ref.grad_norms, rtol=REL)


def test_tp2_checkpoint_metadata_shard_layout(work, tp2):
    step = work["dir"] / "ckpt_tp" / "iteration_00000003"
    md = meta(step)

    def layout(name):
        t = md[name]
        return t["global_shape"], t["axis_fragmentations"], [c["local_shape"] for c in t["chunk"]]

    # qwen3_tiny: hidden 64, 4 heads / 2 groups × 16, ffn 192, vocab 256
    assert layout("decoder.layers.0.self_attention.linear_qkv.weight") == ([128, 64], [2, 1], [[64, 64], [64, 64]])
    assert layout("decoder.layers.0.self_attention.linear_proj.weight") == ([64, 64], [1, 2], [[64, 32], [64, 32]])
    assert layout("decoder.layers.1.mlp.linear_fc1.weight") == ([384, 64], [2, 1], [[192, 64], [192, 64]])
    assert layout("adam_v.decoder.layers.1.mlp.linear_fc2.weight") == ([64, 192], [1, 2], [[64, 96], [64, 96]])
    assert layout("embedding.word_embeddings.weight") == ([256, 64], [2, 1], [[128, 64], [128, 64]])
    assert layout("output_layer.weight") == ([256, 64], [2, 1], [[128, 64], [128, 64]])
    assert layout("decoder.final_layernorm.weight")[1] == [1]  # replicated: one chunk
    r = runner.invoke(app, ["inspect-ckpt", str(step), "--verify"])
    assert r.exit_code == 0, r.output


def test_tp2_checkpoint_resumes_in_one_process(work, tp2, single_q):
    d = work["dir"]
    res = single(work["q"], d / "resume_q", resume_from=d / "ckpt_tp" / "iteration_00000002")
    assert res.resume.saved_world == 2 and res.resume.world == 1
    np.testing.assert_allclose(res.losses, single_q.losses[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, single_q.grad_norms[2:], rtol=REL)


def test_ep2_matches_single_process(work, ep2, single_ds):
    one = metrics(work["dir"] / "single_ds")
    m = metrics(work["dir"] / "out_ep")
    assert len(m) == 3  # step 3 routes with the expert bias updated from both ranks' counts
    for key in ("loss", "grad_norm", "load_balancing_loss", "mtp_1_loss"):
        np.testing.assert_allclose(column(m, key), column(one, key), rtol=REL, err_msg=key)
    assert "expert_parallel=2" in ep2


def test_ep2_checkpoint_splits_experts_and_resumes_in_one_process(work, ep2, single_ds):
    d = work["dir"]
    md = meta(d / "ckpt_ep" / "iteration_00000003")
    for name in ("decoder.layers.1.mlp.experts.weight1", "adam_m.mtp.layers.0.transformer_layer.mlp.experts.weight2"):
        assert md[name]["axis_fragmentations"] == [2, 1, 1], name  # experts 0-3 on rank 0, 4-7 on rank 1
        assert [c["local_shape"][0] for c in md[name]["chunk"]] == [4, 4]
    assert md["decoder.layers.1.mlp.expert_bias"]["axis_fragmentations"] == [1]
    res = single(work["ds"], d / "resume_ds", resume_from=d / "ckpt_ep" / "iteration_00000002")
    np.testing.assert_allclose(res.losses, single_ds.losses[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, single_ds.grad_norms[2:], rtol=REL)


def test_fsdp2_x_tp2_on_four_workers_matches_and_reshards_to_one(work, single_q):
    """dp_shard 2 × tp 2: FSDP rows nested inside each TP block (metadata [4,1] / [2,2]), one 4-worker job."""
    d = work["dir"]
    raw = dict(work["q"], checkpoint={**work["q"]["checkpoint"], "save_path": str(d / "ckpt_dptp")})
    (d / "q4.yaml").write_text(yaml.safe_dump(raw))
    r = runner.invoke(app, ["train", str(d / "q4.yaml"), "--nproc", "4", "--output-dir", str(d / "out_dptp")])
    assert r.exit_code == 0, r.output
    assert "data_parallel=2(dp_shard[2] * dp_replicate[1]), tensor_parallel=2" in r.stdout
    m = metrics(d / "out_dptp")
    np.testing.assert_allclose(column(m, "loss"), single_q.losses, rtol=REL)
    np.testing.assert_allclose(column(m, "grad_norm"), single_q.grad_norms, rtol=REL)
    md = meta(d / "ckpt_dptp" / "iteration_00000003")
    assert md["decoder.layers.0.self_attention.linear_qkv.weight"]["axis_fragmentations"] == [4, 1]
    assert md["decoder.layers.0.self_attention.linear_proj.weight"]["axis_fragmentations"] == [2, 2]
    res = single(work["q"], d / "resume_dptp", resume_from=d / "ckpt_dptp" / "iteration_00000002")
    np.testing.assert_allclose(res.losses, single_q.losses[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, single_q.grad_norms[2:], rtol=REL)
