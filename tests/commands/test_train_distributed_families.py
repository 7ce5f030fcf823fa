"""DeepSeek-V4 trained with Muon on 2 msrun workers (FSDP over both: the Muon weights' rows are gathered
for the orthogonalisation) gives the losses and grad norms of one process with the same global batch."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from commands.app import app
from tests.helpers.cli import runner
from tests.helpers.msrun import column, metrics, run_single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]


def test_deepseek_v4_muon_fsdp2_matches_single_process(tmp_path):
    corpus = write_corpus(tmp_path / "corpus" / "tiny_text_document")
    raw = tiny_raw("deepseek_v4_tiny.yaml", corpus, tmp_path / "ckpt", steps=3, gbs=4)  # data_parallel_shard -1
    raw["checkpoint"]["enable_save"] = False
    (tmp_path / "v4.yaml").write_text(yaml.safe_dump(raw))
    single = run_single(raw, tmp_path / "out_single")
    r = runner.invoke(app, ["train", str(tmp_path / "v4.yaml"), "--nproc", "2", "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "FSDP:" in r.stdout and "Muon:" in r.stdout
    m = metrics(tmp_path / "out")
    np.testing.assert_allclose(column(m, "loss"), single.losses, rtol=1e-4)
    np.testing.assert_allclose(column(m, "grad_norm"), single.grad_norms, rtol=1e-4)
