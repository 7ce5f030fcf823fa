"""DeepSeek-V4's legacy ``experimental_attention_variant: mla`` under tensor parallel (issue 36): DeepSeek-V3's MLA
attention inside V4's hyper-connection layers takes DeepSeek-V3's MLA plan (the latent down-projection and its
norms whole on the gathered sequence, ``linear_qb``/``linear_kvb`` by heads, ``linear_proj`` by columns), the rest
of each layer V4's (hyper-connections, norms, router and shared experts whole on this rank's positions; hash
routing reads its block of ids). The tiny V4 template with the variant, trained with its default optimizer (Muon:
TP blocks gathered into whole matrices) at tp2 with sequence parallel on 2 msrun workers, gives the losses, grad
norms, load-balancing and MTP losses of the single-process run with the same global batch (1e-5 relative, fp32)
over 3 steps, on both ranks; its checkpoint splits exactly the MLA plan's weights.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers.msrun import column, launch_many, metrics, single
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
REL = 1e-5
KEYS = ("loss", "grad_norm", "load_balancing_loss", "mtp_1_loss")
# the variant as tests/engine/test_deepseek_v4_mla.py builds it (value head narrower than the query head)
MLA = {"experimental_attention_variant": "mla", "kv_lora_rank": 16, "v_head_dim": 16,
       "max_position_embeddings": 64, "rotary_scaling_factor": 4.0, "mscale": 0.7, "mscale_all_dim": 0.5}
TP2 = {"tensor_parallel": 2, "data_parallel_shard": 1, "sequence_parallel": True}


class Runs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.corpus = write_corpus(root / "corpus" / "tiny_text_document")
        self.out, self.ckpt = root / "out_tp2", root / "ckpt_tp2"

    def raw(self) -> dict:
        raw = tiny_raw("deepseek_v4_tiny.yaml", self.corpus, self.ckpt, steps=3, gbs=4)
        raw["model"].update(MLA)
        raw["parallelism"].update(TP2)
        return raw


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    r = Runs(tmp_path_factory.mktemp("v4_mla_tp"))
    assert r.raw()["optimizer"]["type"] == "Muon"  # the template's default
    cfg = r.root / "tp2.yaml"
    cfg.write_text(yaml.safe_dump(r.raw()))
    launch_many([{"config": str(cfg), "output_dir": str(r.out)}], 2, r.root / "msrun", timeout_s=1200)
    single(r.raw(), r.root / "single")
    return r


def test_v4_mla_tp2_matches_single_process(runs):
    one = metrics(runs.root / "single")
    assert [r["step"] for r in one] == [1, 2, 3] and "indexer_loss" not in one[0]  # plain MLA: no indexer
    assert "tensor_parallel=2" in (runs.out / "log" / "rank_0" / "info.log").read_text()
    for rank in (0, 1):
        m = metrics(runs.out, rank)
        assert [r["step"] for r in m] == [1, 2, 3]
        for key in KEYS:
            np.testing.assert_allclose(column(m, key), column(one, key), rtol=REL, err_msg=f"rank {rank}: {key}")


def test_v4_mla_tp2_checkpoint_splits_the_mla_plan_weights_only(runs):
    """Tiny V4 with the variant: 4 heads, query head 24 + 8, value head 16, hidden 64. ``linear_qb`` (4·32 rows)
    and ``linear_kvb`` (4·(24+16) rows) by rows, ``linear_proj`` (in 4·16) by columns, in two chunks; the
    latent down-projection, the hyper-connections and the shared experts whole."""
    md = json.loads((runs.ckpt / "iteration_00000002" / "metadata.json").read_text())["state_dict_metadata"]
    for layer in ("decoder.layers.1", "mtp.layers.0.transformer_layer"):
        att = f"{layer}.self_attention"
        expect = {f"{att}.linear_qb.weight": ([128, 32], [2, 1]), f"{att}.linear_kvb.weight": ([160, 16], [2, 1]),
                  f"{att}.linear_proj.weight": ([64, 64], [1, 2])}
        for name, (shape, frag) in expect.items():
            assert (md[name]["global_shape"], md[name]["axis_fragmentations"]) == (shape, frag), name
        split = sorted(k for k, t in md.items() if k.startswith(layer + ".")
                       and any(f > 1 for f in t["axis_fragmentations"]))
        assert split == sorted(expect), split
        assert f"{layer}.attn_hc.mapping_proj.weight" in md and f"{layer}.mlp.shared_experts.linear_fc1.weight" in md
