"""Activation recompute under `mftk train --nproc 2` (where the reference applies it): the losses and grad norms
of the run without recompute (one process, 1e-5), with the checkpoints and exclusions really installed (the
start-up log names them). Three runs in one shared msrun job: Qwen3 with FSDP over both ranks, every layer
recomputed and layer 0's ``linear_proj`` excluded (the replays gather the units' weights again); DeepSeek-V3
with tensor, sequence and expert parallel 2 in select mode (attention and the MoE MLP, the shared experts
excluded); DeepSeek-V3 with pipeline parallel 2, fully recomputed (the MTP layer, id 2, included).
"""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from tests.helpers.msrun import SharedJobs, column, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
RUNS = {"fsdp": ("qwen3_tiny.yaml", {}, {"mode": "full", "full_recompute_layer": ["0-1"],
                                         "exclude_op": {"*self_attention.linear_proj": ["0"]}}),
        "tp": ("deepseek_v3_tiny.yaml", {"tensor_parallel": 2, "sequence_parallel": True, "expert_parallel": 2},
               {"mode": "select", "select_module": {"self_attention": ["0-1"], "mlp": ["1"]},
                "exclude_op": {"*shared_experts": ["1"]}}),
        "pp": ("deepseek_v3_tiny.yaml", {"pipeline_parallel": 2}, {"mode": "full", "full_recompute_layer": ["0-2"]})}
LOGGED = {"fsdp": ["Recompute (full): 2 cells", "decoder.layers.0.self_attention.linear_proj"],
          "tp": ["Recompute (select): 3 cells", "decoder.layers.1.mlp.shared_experts"],
          "pp": ["Recompute (full): 2 cells replayed in the backward: decoder.layers.1, "
                 "mtp.layers.0.transformer_layer", "Recompute (full): 1 cell replayed"]}


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
    job = lambda: shared.results("2", 2, lambda: [{"config": str(d / f"{n}.yaml"), "output_dir": str(d / f"out_{n}")}
                                                  for n in RUNS])
    return {"dir": d, "raws": raws, "job": job}


@pytest.mark.parametrize("name", list(RUNS))
def test_recomputed_runs_train_as_the_plain_single_process_run(work, name):
    work["job"]()
    d = work["dir"]
    one = single(work["raws"][name], d / f"single_{name}")  # one process: recompute is not applied (the plain run)
    rank = 1 if name == "pp" else 0  # the last stage holds the loss
    m = metrics(d / f"out_{name}", rank)
    assert [r["step"] for r in m] == [1, 2, 3]
    np.testing.assert_allclose(column(m, "loss"), one.losses, rtol=REL)
    np.testing.assert_allclose(column(m, "grad_norm"), one.grad_norms, rtol=REL)
    text = "\n".join(p.read_text(errors="replace") for p in (d / "msrun_2").rglob("*.log"))
    for line in LOGGED[name]:
        assert line in text
