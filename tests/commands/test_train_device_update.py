"""The device-resident update (``mftk.update_on_device: true``, forced on CPU) under `mftk train --nproc 2`:
the same losses and grad norms as the host update in one process (1e-6 relative), for FSDP over 2 ranks (the
units' reduce-scattered gradients, the rest averaged on the device), plain data parallel over 2 (one
all-reduce of every gradient) and DeepSeek-V3 with tensor and expert parallel 2 (TP-whole gradients summed,
expert gradients over their EP group). One msrun launch per layout (~1 min each, ~4 min for DeepSeek-V3)."""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from tests.helpers.msrun import column, metrics, single, train_msrun
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-6
LAYOUTS = {"fsdp2": ("qwen3_tiny.yaml", {}),  # the template's data_parallel_shard: -1
           "dp2": ("qwen3_tiny.yaml", {"data_parallel_shard": 1}),
           "tp2_ep2": ("deepseek_v3_tiny.yaml", {"tensor_parallel": 2, "sequence_parallel": True, "expert_parallel": 2})}


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("device_update_msrun")
    write_corpus(d / "corpus" / "tiny_text_document")
    return d


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_device_update_under_two_workers_equals_host_update_in_one_process(corpus_dir, name):
    template, par = LAYOUTS[name]
    d = corpus_dir
    raw = tiny_raw(template, d / "corpus" / "tiny_text_document", d / f"ck_{name}", steps=5, gbs=4)
    raw["parallelism"].update(par)
    forced = dict(raw, mftk={"update_on_device": True})
    (d / f"{name}.yaml").write_text(yaml.safe_dump(forced))
    train_msrun(d / f"{name}.yaml", d / f"out_{name}")
    one = single(raw, d / f"single_{name}")  # the host update (the default on CPU)
    for rank in (0, 1):
        assert "Optimizer update: on the CPU device" in (d / f"out_{name}" / "log" / f"rank_{rank}" / "info.log").read_text()
    m = metrics(d / f"out_{name}")
    assert [r["step"] for r in m] == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(column(m, "loss"), one.losses, rtol=REL)
    np.testing.assert_allclose(column(m, "grad_norm"), one.grad_norms, rtol=REL if name != "tp2_ep2" else 5e-6)  # TP: the norm summed in another order
