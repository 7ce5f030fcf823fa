"""Activation recompute with ``exclude_op`` under `mftk train --nproc 2` (where the reference applies recompute):
the losses and grad norms of the same layout without recompute (1e-6: the same arithmetic, the replays
give the plain gradients), with the exclusions really installed (the start-up log names them).

One shared msrun job (a job's start-up is most of a tiny run's cost), six runs on two workers: Qwen3 under FSDP
over both ranks without recompute; the same with every layer recomputed and layer 0's ``linear_proj`` excluded
(layer 0 a kept FSDP unit checkpointed inside, its replay gathering the weights again; layer 1 a replaying
unit); the same in select mode (both MLPs, layer 1's attention) with layer 1's ``linear_fc2`` excluded;
DeepSeek-V3 in plain data parallel, fully recomputed with the MoE layer's router and the MTP layer's shared
experts excluded; Qwen3 under tensor and sequence parallel 2, both attentions selected and their (row-parallel)
``linear_proj`` excluded; Qwen3 under pipeline parallel 2, fully recomputed with ``linear_fc1`` excluded (one
layer per stage) — these three against the single-process run (1e-5: another reduction order).
"""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from tests.helpers.msrun import SharedJobs, column, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]

# name -> (template, parallelism, recompute)
RUNS = {
    "plain": ("qwen3_tiny.yaml", {}, {"mode": "None"}),
    "full": ("qwen3_tiny.yaml", {}, {"mode": "full", "full_recompute_layer": ["0-1"],
                                     "exclude_op": {"*self_attention.linear_proj": ["0"]}}),
    "select": ("qwen3_tiny.yaml", {}, {"mode": "select", "select_module": {"mlp": ["0-1"], "self_attention": ["1"]},
                                       "exclude_op": {"mlp.linear_fc2": ["1"]}}),
    "deepseek": ("deepseek_v3_tiny.yaml", {"data_parallel_shard": 1},
                 {"mode": "full", "full_recompute_layer": ["0-2"],
                  "exclude_op": {"mlp.router": ["1"], "*shared_experts": ["2"]}}),
    "tp": ("qwen3_tiny.yaml", {"tensor_parallel": 2, "sequence_parallel": True},
           {"mode": "select", "select_module": {"self_attention": ["0-1"]},
            "exclude_op": {"*linear_proj": ["0-1"]}}),
    "pp": ("qwen3_tiny.yaml", {"pipeline_parallel": 2}, {"mode": "full", "full_recompute_layer": ["0-1"],
                                                        "exclude_op": {"*linear_fc1": ["0-1"]}}),
}
LOGGED = {
    "full": ["Recompute (full): 2 cells replayed in the backward: decoder.layers.0, decoder.layers.1",
             "Recompute exclude_op: 1 cell not replayed (outputs kept): "
             "decoder.layers.0.self_attention.linear_proj"],
    "select": ["Recompute (select): 3 cells replayed in the backward: decoder.layers.0, "
               "decoder.layers.1.mlp, decoder.layers.1.self_attention",  # layer 0: an FSDP unit replayed whole
               "Recompute exclude_op: 1 cell not replayed (outputs kept): decoder.layers.1.mlp.linear_fc2"],
    "deepseek": ["Recompute exclude_op: 2 cells not replayed (outputs kept): decoder.layers.1.mlp.router, "
                 "mtp.layers.0.transformer_layer.mlp.shared_experts"],
    "tp": ["Recompute exclude_op: 2 cells not replayed (outputs kept): decoder.layers.0.self_attention.linear_proj, "
           "decoder.layers.1.self_attention.linear_proj"],
    "pp": ["Recompute exclude_op: 1 cell not replayed (outputs kept): decoder.layers.0.mlp.linear_fc1",
           "Recompute exclude_op: 1 cell not replayed (outputs kept): decoder.layers.1.mlp.linear_fc1"],
}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("recompute_dist")
    corpus = write_corpus(d / "corpus" / "tiny_text_document")
    raws = {}
    for name, (template, parallel, recompute) in RUNS.items():
        raw = tiny_raw(template, corpus, d / f"ckpt_{name}", steps=3, gbs=4)
        raw["parallelism"].update(parallel)
        raw["recompute"] = recompute
        (d / f"{name}.yaml").write_text(yaml.safe_dump(raw))
        raws[name] = raw
    shared = SharedJobs(d)

    def job():
        return shared.results("2", 2, lambda: [{"config": str(d / f"{n}.yaml"), "output_dir": str(d / f"out_{n}")}
                                               for n in RUNS])
    return {"dir": d, "raws": raws, "job": job}


def _log(d, name: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (d / f"out_{name}").rglob("*.log"))


@pytest.mark.parametrize("name", ["full", "select"])
def test_exclude_op_under_fsdp_trains_as_the_run_without_recompute(work, name):
    work["job"]()
    d = work["dir"]
    plain, run = metrics(d / "out_plain"), metrics(d / f"out_{name}")
    assert [r["step"] for r in run] == [1, 2, 3]
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose(column(run, key), column(plain, key), rtol=1e-6, err_msg=key)
    text = _log(d, name)
    for line in LOGGED[name]:
        assert line in text
    assert "exclude_op" not in _log(d, "plain")


@pytest.mark.parametrize("name", ["deepseek", "tp", "pp"])
def test_exclude_op_with_other_layouts_trains_as_the_single_process_run(work, name):
    work["job"]()
    d = work["dir"]
    one = single(work["raws"][name], d / f"single_{name}")  # one process: recompute is not applied
    rank = 1 if name == "pp" else 0  # the last stage holds the loss
    m = metrics(d / f"out_{name}", rank)
    for key, ref in (("loss", one.losses), ("grad_norm", one.grad_norms)):
        np.testing.assert_allclose(column(m, key), ref, rtol=1e-5, err_msg=key)
    text = _log(d, name)  # every rank's log (under PP each names its own stage's layer)
    for line in LOGGED[name]:
        assert line in text
