"""LoRA under `mftk train --nproc 2`: the same losses and grad norms as one process, the base still frozen.

Five runs, in one shared msrun job: Qwen3 with plain data parallel over 2 ranks (replicated adapters, their
gradients all-reduced), Qwen3 with FSDP over 2 data-parallel ranks (adapters sharded, base whole and frozen), DeepSeek-V3 with tensor parallel 2 and expert parallel 2 (each adapter cut with its base:
column-parallel lora_b by rows, row-parallel lora_a by columns, expert adapters by expert), Qwen3 with
context parallel 2, and DeepSeek-V3 with pipeline parallel 2.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from tests.helpers.msrun import SharedJobs, column, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
RUNS = {"dp": "out_dp2", "q": "out_dp", "ds": "out_tp", "cp": "out_cp", "pp": "out_pp"}  # config -> output dir
LORA = {"target_modules": r"(linear_qkv|linear_proj|linear_fc1|linear_fc2|linear_qb|linear_kvb|experts|output_layer)$",
        "lora_rank": 4, "lora_alpha": 8, "lora_a_std": 0.05, "lora_b_std": 0.02}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_dist")
    corpus = write_corpus(d / "corpus" / "tiny_text_document")
    q = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_dp", steps=3, gbs=4)  # data_parallel_shard -1: FSDP over 2
    q["lora_config"] = dict(LORA)
    (d / "q.yaml").write_text(yaml.safe_dump(q))
    ds = tiny_raw("deepseek_v3_tiny.yaml", corpus, d / "ckpt_tp", steps=3, gbs=4)
    ds["parallelism"].update({"tensor_parallel": 2, "sequence_parallel": True, "expert_parallel": 2})
    ds["lora_config"] = dict(LORA)
    (d / "ds.yaml").write_text(yaml.safe_dump(ds))
    cp = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_cp", steps=3, gbs=4)
    cp["parallelism"]["context_parallel"] = 2
    cp["lora_config"] = dict(LORA)
    (d / "cp.yaml").write_text(yaml.safe_dump(cp))
    pp = tiny_raw("deepseek_v3_tiny.yaml", corpus, d / "ckpt_pp", steps=3, gbs=4)
    pp["parallelism"]["pipeline_parallel"] = 2
    pp["lora_config"] = dict(LORA)
    (d / "pp.yaml").write_text(yaml.safe_dump(pp))
    dp = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_dp2", steps=3, gbs=4)
    dp["parallelism"]["data_parallel_shard"] = 1  # dp_replicate = 2
    dp["lora_config"] = dict(LORA)
    (d / "dp.yaml").write_text(yaml.safe_dump(dp))
    return {"dir": d, "q": q, "ds": ds, "cp": cp, "pp": pp, "dp": dp}


def _same_as_single(work, name: str, out: str, rank: int = 0) -> None:
    """``rank``: the rank whose metrics hold the loss (the last stage under PP)."""
    d = work["dir"]
    one = single(work[name], d / f"single_{name}")
    m = metrics(d / out, rank)
    assert [r["step"] for r in m] == [1, 2, 3]
    np.testing.assert_allclose(column(m, "loss"), one.losses, rtol=REL)
    np.testing.assert_allclose(column(m, "grad_norm"), one.grad_norms, rtol=REL)
    from mftk.ckpt.load import load_global

    from mftk.ckpt.names import is_optimizer_name

    many = {n: a for n, a in load_global(d / out.replace("out", "ckpt") / "iteration_00000003").items()
            if not is_optimizer_name(n)}
    ref = {n: a for n, a in load_global(Path(f"{d / f'single_{name}'}_ckpt") / "iteration_00000003").items()
           if not is_optimizer_name(n)}
    assert many.keys() == ref.keys()
    for n in ref:  # base bit-identical to the single run's (frozen: the initial weights); adapters close
        if "lora" in n:
            np.testing.assert_allclose(many[n], ref[n], rtol=1e-4, atol=1e-6)
        elif not n.endswith(("tokens_per_expert", "expert_bias")):
            assert np.array_equal(many[n], ref[n]), n


@pytest.fixture(scope="module")
def trained(work):
    """All five runs in one shared msrun job (each worker runs `mftk train --nproc 2`'s body per run)."""
    d, shared = work["dir"], SharedJobs(work["dir"])
    return lambda: shared.results("2", 2, lambda: [{"config": str(d / f"{name}.yaml"), "output_dir": str(d / out)}
                                                   for name, out in RUNS.items()])


def test_lora_under_dp2_equals_one_process(work, trained):
    trained()
    _same_as_single(work, "dp", "out_dp2")


def test_lora_under_fsdp2_equals_one_process(work, trained):
    trained()
    info = (work["dir"] / "out_dp" / "log" / "rank_0" / "info.log").read_text()
    assert "FSDP:" in info or "dp_shard[2]" in info
    _same_as_single(work, "q", "out_dp")


def test_lora_under_tp2_ep2_equals_one_process(work, trained):
    trained()
    _same_as_single(work, "ds", "out_tp")


def test_lora_under_cp2_equals_one_process(work, trained):
    trained()
    _same_as_single(work, "cp", "out_cp")


def test_lora_under_pp2_equals_one_process(work, trained):
    trained()
    _same_as_single(work, "pp", "out_pp", rank=1)
