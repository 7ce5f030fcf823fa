"""`config.runnable.layout_refusals`, the one decision on whether a layout runs, rule by rule on hand-picked
layouts (the arithmetic in each message checked by hand); what it accepts is run by the msrun layout tests."""
from __future__ import annotations

import attrs
import pytest

from mftk.config.model import DeepseekV3ModelConfig
from mftk.config.runnable import RULES, LayoutSettings, layout_refusals, ulysses_degree
from mftk.derive import Layout
from tests.helpers.config import small_qwen3


qwen = small_qwen3


def dsv3(**kw):
    base = dict(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=4,
                num_nextn_predict_layers=1, mtp_loss_scaling_factor=0.3, num_attention_heads=4, n_shared_experts=1,
                n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                q_lora_rank=8, kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4,
                moe_grouped_gemm=True, seq_length=16, moe_aux_loss_coeff=0.01,
                moe_router_load_balancing_type="seq_aux_loss")
    return DeepseekV3ModelConfig(**{**base, **kw})


def _template_model(name: str):
    from tests.helpers.config import load_dict, template_dict

    return load_dict(template_dict(name)).config.model


def v4():
    return _template_model("deepseek_v4_tiny")


def qwen3_moe():
    return _template_model("qwen3_moe_tiny")


def v4_mla():
    """The tiny V4 template with the legacy mla variant (as tests/engine/test_deepseek_v4_mla.py builds it)."""
    from tests.helpers.config import load_dict, template_dict

    raw = template_dict("deepseek_v4_tiny")
    raw["model"].update({"experimental_attention_variant": "mla", "kv_lora_rank": 16, "v_head_dim": 16})
    return load_dict(raw).config.model


def test_muon_plain_dp_and_expert_parallel_run():
    """Muon's refusals are QK-clip's only (on FSDP rows, and its tracking under TP/CP/PP); Muon itself runs under
    tensor parallel (whole matrices gathered, `engine.muon`); Qwen3-MoE and DeepSeek-V4 (its hash-routed layers,
    its MTP layer) run expert parallel, V4 with Muon on FSDP."""
    assert refused(small_qwen3(), Layout(world=2, tp=2), muon=True) == {}
    assert refused(dsv3(), Layout(world=8, dp_shard=2, tp=2, pp=2), muon=True) == {}
    got = [(r.rule, r.path) for r in layout_refusals(dsv3(), Layout(world=4, dp_shard=2, tp=2), LayoutSettings(
        global_batch_size=16, muon=True, qk_clip=True, track_max_logits=True))]
    assert got == [("muon_qk_clip", "optimizer.qk_clip_enabled")]  # one error at the path, naming both fixes
    assert refused(dsv3(), Layout(world=4, dp_replicate=2, dp_shard=2, ep=2), muon=True) == {}
    assert refused(dsv3(), Layout(world=2, dp_replicate=2), muon=True, qk_clip=True) == {}
    assert refused(qwen3_moe(), Layout(world=2, dp_shard=2, ep=2), global_batch_size=4) == {}
    assert refused(v4(), Layout(world=2, dp_shard=2, ep=2), muon=True, global_batch_size=4) == {}
    assert refused(v4(), Layout(world=4, dp_shard=4, ep=4), muon=True, global_batch_size=4) == {}
    assert refused(v4(), Layout(world=4, dp_replicate=2, dp_shard=2, ep=2), muon=True, global_batch_size=4) == {}


def test_deepseek_v4_takes_tensor_parallel_with_pipeline_and_fsdp():
    """DeepSeek-V4's TP plan (MindSpore Transformers 2.1.0's: only the query up-projection is split) composes with
    PP, EP and FSDP (Muon too: `engine.muon` gathers TP blocks), MF's own test layout tp2·pp2·dp_shard2 included (msrun:
    test_train_v4_tensor_parallel); its only width rule is the query rows (heads·v_head_dim) % tp."""
    m = v4()
    assert refused(m, Layout(world=2, tp=2), global_batch_size=4) == {}
    assert refused(m, Layout(world=4, tp=2, ep=2, dp_shard=2), global_batch_size=4) == {}
    assert refused(m, Layout(world=8, dp_shard=2, tp=2, pp=2), global_batch_size=4,
                   layers_per_stage=["0-1", "2"]) == {}
    assert refused(m, Layout(world=2, tp=2), muon=True, global_batch_size=4) == {}  # whole-matrix Muon


def test_deepseek_v4_mla_variant_takes_the_mla_plan_under_tensor_parallel():
    """DeepSeek-V4's legacy mla variant is DeepSeek-V3's MLA attention: its attention kind is "mla" and the MLA
    rules apply (heads % tp; V4's query-rows rule does not: 4·16 % 4 = 0 would pass it), with Muon and PP
    (msrun: test_train_v4_mla_tensor_parallel); context parallel is refused for the rest of the V4 layer."""
    from mftk.config.runnable import attention_kind

    m = v4_mla()
    assert (attention_kind(m), attention_kind(v4()), attention_kind(dsv3())) == ("mla", "csa", "mla")
    assert refused(m, Layout(world=2, tp=2), muon=True, global_batch_size=4) == {}
    assert refused(m, Layout(world=4, tp=2, pp=2), global_batch_size=4, layers_per_stage=["0-1", "2"]) == {}
    got = refused(attrs.evolve(m, num_attention_heads=2), Layout(world=4, tp=4), global_batch_size=4)
    assert "num_attention_heads % tp = 2 % 4 = 2" in got["tp_heads"] and "tp_csa_q" not in got, got
    got = refused(m, Layout(world=2, cp=2), global_batch_size=4)
    assert "DeepSeek-V4's legacy mla variant" in got["cp_family"], got


def test_qwen3_moe_takes_the_gqa_plan_and_every_dimension():
    """Qwen3-MoE is Qwen3's attention with the shared MoE parts: TP×EP, CP, PP (with global_aux_loss too, whose
    counts the pipeline replays from the first forward's) all run (msrun: test_train_qwen3_moe_layouts)."""
    m = qwen3_moe()
    assert refused(m, Layout(world=2, tp=2, ep=2), global_batch_size=4) == {}
    assert refused(m, Layout(world=2, cp=2, ep=2), global_batch_size=4) == {}
    assert set(refused(m, Layout(world=16, dp_shard=1, tp=4, pp=4, ep=4))) == {"tp_kv_heads", "pp_layers"}  # 2 kv heads, 3 layers
    g = attrs.evolve(m, num_hidden_layers=4, moe_router_load_balancing_type="global_aux_loss")
    assert refused(g, Layout(world=2, pp=2), global_batch_size=4) == {}


def refused(model, layout, **settings) -> dict[str, str]:
    s = LayoutSettings(**{"global_batch_size": 16, **settings})
    found = layout_refusals(model, layout, s)
    assert all(r.rule in RULES for r in found)
    return {r.rule: r.message for r in found}


def test_global_aux_loss_runs_under_pipeline_parallel():
    """The pipeline replays each chunk's forward from the counts its first forward started from
    (msrun: tests/commands/test_train_qwen3_moe_layouts.py, pp2 global_aux_loss)."""
    assert refused(dsv3(moe_router_load_balancing_type="global_aux_loss"), Layout(world=2, pp=2)) == {}


def test_dropout_runs_under_fsdp_and_context_parallel():
    """FSDP units no longer replay their forward (only recompute or pipeline stages do), so dropout is allowed
    there; tests/engine/test_fsdp_units.py checks the masks and gradients are the plain run's."""
    m = qwen(hidden_dropout=0.1)
    assert refused(m, Layout(world=2, dp_shard=2)) == {}
    assert refused(m, Layout(world=4, dp_shard=2, cp=2)) == {}
    assert set(refused(m, Layout(world=4, dp_shard=2, pp=2))) == {"pp_dropout"}


def test_every_dimension_composes_on_both_families():
    assert refused(qwen(), Layout(world=16, dp_shard=2, cp=2, tp=2, pp=2)) == {}
    assert refused(dsv3(), Layout(world=16, dp_shard=2, cp=2, tp=2, pp=2, ep=4)) == {}  # MLA, MoE, MTP
    assert refused(qwen(num_hidden_layers=8), Layout(world=4, dp_shard=2, pp=2, interleave=2)) == {}
    assert refused(qwen(tie_word_embeddings=True), Layout(world=4, pp=2, tp=2)) == {}


@pytest.mark.parametrize("model,layout,settings,rule,text", [
    (qwen(), Layout(world=2, tp=2), {"sequence_parallel": False}, "tp_needs_sp", "requires sequence_parallel"),
    (qwen(num_attention_heads=6, num_key_value_heads=6, head_dim=4), Layout(world=4, tp=4), {}, "tp_heads",
     "num_attention_heads % tp = 6 % 4 = 2"),
    (qwen(), Layout(world=4, tp=4), {}, "tp_kv_heads", "num_key_value_heads % tp = 2 % 4 = 2"),
    (dsv3(q_lora_rank=None), Layout(world=2, tp=2), {}, "tp_mla_q", "needs q_lora_rank"),
    (qwen(intermediate_size=30), Layout(world=4, tp=4, pp=1), {}, "tp_ffn", "30 % 4 = 2"),
    (dsv3(moe_shared_expert_intermediate_size=6), Layout(world=4, tp=4), {}, "tp_ffn", "6 % 4 = 2"),
    (qwen(vocab_size=65), Layout(world=2, tp=2), {}, "tp_vocab", "vocab_size % tp = 65 % 2 = 1"),
    (qwen(seq_length=12), Layout(world=8, cp=2, tp=4), {}, "tp_seq", "seq_length % (cp·tp) = 12 % 8 = 4"),
    (qwen(), Layout(world=2, dp_shard=2, ep=2), {}, "ep_dense", "no routed experts"),
    (dsv3(), Layout(world=8, dp_shard=8, ep=8), {}, "ep_experts", "n_routed_experts % ep = 4 % 8 = 4"),
    (dsv3(), Layout(world=4, dp_replicate=2, dp_shard=2, ep=4), {}, "ep_domain", "dp_shard·cp·tp = 2·1·1 = 2"),
    (qwen(seq_length=20), Layout(world=4, cp=4), {}, "cp_seq", "seq_length % 2·cp (load-balanced causal split) = 20 % 8"),
    (qwen(), Layout(world=4, cp=4), {"cp_method": "ulysses"}, "cp_heads", "num_key_value_heads % (tp·4) = 2 % 4"),
    (qwen(), Layout(world=2, pp=2), {"layers_per_stage": ["2-3", "0-1"]}, "pp_order", "after those of stage k−1"),
    (qwen(), Layout(world=2, pp=2), {"layers_per_stage": ["0-1", "3"]}, "pp_layers", "exactly once"),
    (qwen(hidden_dropout=0.1), Layout(world=2, pp=2), {}, "pp_dropout", "hidden_dropout must be 0"),
    (qwen(), Layout(world=2, pp=2, interleave=2), {"schedule": "gpipe"}, "pp_interleave", "gpipe does not"),
    (qwen(), Layout(world=4, dp_shard=2, pp=2, interleave=2), {"global_batch_size": 2}, "pp_interleave",
     "(dp·local_batch_size) = 1) to be a multiple of pipeline_parallel=2"),
    (qwen(), Layout(world=1, interleave=2), {}, "pp_interleave", "needs pipeline_parallel > 1"),
    (qwen(), Layout(world=2, tp=2), {"track_max_logits": True}, "track_logits", "would be split over ranks"),
    (qwen(), Layout(world=3, dp_shard=3), {}, "batch", "16 / (3·1)"),
    (qwen(), Layout(world=4, dp_shard=2, tp=1), {}, "product", "= 2 ≠ world size 4"),
    (dsv3(), Layout(world=2, tp=2), {"muon": True, "qk_clip": True, "track_max_logits": True}, "track_logits",
     "Muon's QK-clip needs max attention logit tracking with"),
    (dsv3(), Layout(world=2, dp_shard=2), {"muon": True, "qk_clip": True}, "muon_qk_clip", "data_parallel_shard = 2"),
    (v4(), Layout(world=16, dp_shard=16, ep=16), {}, "ep_experts", "n_routed_experts % ep = 8 % 16 = 8"),
    (v4(), Layout(world=3, tp=3), {"global_batch_size": 3}, "tp_csa_q",
     "num_attention_heads·v_head_dim % tp = 4·32 % 3 = 2"),
    (v4(), Layout(world=2, cp=2), {"cp_method": "ulysses"}, "cp_csa", "the ulysses method's head all-to-all"),
    (v4(), Layout(world=16, cp=16), {}, "cp_csa", "seq_length/cp = 128/16 = 8 positions must be divisible by "
     "every compress ratio (16 does not divide it"),
    (attrs.evolve(v4(), experimental_attention_variant="mla"), Layout(world=2, cp=2), {}, "cp_family",
     "DeepSeek-V4's legacy mla variant"),
    (qwen3_moe(), Layout(world=4, tp=4), {}, "tp_kv_heads", "num_key_value_heads % tp = 2 % 4 = 2"),
    (attrs.evolve(qwen3_moe(), intermediate_size=129), Layout(world=2, tp=2), {}, "tp_ffn",
     "ffn_hidden_size (intermediate_size) % tp = 129 % 2 = 1"),
])
def test_each_refusal_names_its_rule_and_arithmetic(model, layout, settings, rule, text):
    got = refused(model, layout, **settings)
    assert rule in got, got
    assert text in got[rule], got[rule]


def test_deepseek_v4_takes_colossal_context_parallel_alone_and_with_tp_and_pp():
    """DeepSeek-V4's CP plan (the attention whole on the gathered sequence): seq_length 128 over cp 2, 4 or 8
    leaves 64, 32 or 16 positions per rank, all multiples of the template's ratios 4 and 16."""
    for layout in (Layout(world=2, cp=2), Layout(world=8, cp=8), Layout(world=4, cp=2, tp=2),
                   Layout(world=4, cp=2, pp=2)):
        assert refused(v4(), layout, sequence_parallel=True, layers_per_stage=["0-1", "2"]) == {}, layout


def test_ulysses_degree_of_each_method():
    assert [ulysses_degree(m, 4, 2) for m in ("colossal", "Ulysses", "hybrid")] == [1, 4, 2]


def test_rampup_levels_are_checked():
    got = refused(qwen(), Layout(world=4, dp_shard=4), rampup=(2, 2, 100))
    assert "start 2 is not divisible by dp·local_batch_size = 4·1 = 4" in got["batch"]


def test_validate_config_says_what_the_device_update_still_moves_across_the_host():
    """A GPU run (and update_on_device: true) gets a note listing `DEVICE_HOST_TRAFFIC`; a CPU run none."""
    from pathlib import Path

    import yaml

    from mftk.config.load import load_data
    from mftk.config.runnable import DEVICE_HOST_TRAFFIC

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "templates" / "qwen3_tiny.yaml").read_text())
    assert "mftk.update_on_device" not in {p.path for p in load_data(raw, check_files=False).notes}
    raw["context"] = {"device_target": "GPU"}
    note = {p.path: p.message for p in load_data(raw, check_files=False).notes}["mftk.update_on_device"]
    assert all(item in note for item in DEVICE_HOST_TRAFFIC) and "MoE" in note and "FSDP" in note
    raw["mftk"] = {"update_on_device": False}
    assert "mftk.update_on_device" not in {p.path for p in load_data(raw, check_files=False).notes}
