"""Layout enumeration against a brute-force count, and every rejection rule on a hand-picked layout."""
import pytest

from mftk.config.model import DeepseekV3ModelConfig
from mftk.derive import Layout
from mftk.derive import stage_layers
from mftk.plan.memory import PlanInputs
from mftk.plan.search import RULES, candidate_layouts, check_layout, factorisations, search, why_none
from tests.helpers.sizes import brute_count
from tests.helpers.config import small_qwen3


qwen = small_qwen3


def dsv3(**kw):
    base = dict(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=4,
                num_nextn_predict_layers=0, num_attention_heads=4, n_shared_experts=1, n_routed_experts=4,
                num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=8,
                kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4, moe_grouped_gemm=True,
                seq_length=16)
    return DeepseekV3ModelConfig(**{**base, **kw})


def inputs(model, **kw):
    base = dict(model=model, local_batch_size=1, global_batch_size=16, sequence_parallel=True)
    return PlanInputs(**{**base, **kw})


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 8, 12])
@pytest.mark.parametrize("moe,max_inter", [(False, 1), (True, 1), (False, 2), (True, 3)])
def test_enumeration_count_matches_brute_force(world, moe, max_inter):
    got = list(candidate_layouts(world, moe=moe, max_interleave=max_inter))
    assert len(got) == brute_count(world, moe, max_inter)
    assert len(set(got)) == len(got)                       # no duplicates
    assert all(l.product == world for l in got)


def test_factorisations_small():
    assert sorted(factorisations(4, 2)) == [(1, 4), (2, 2), (4, 1)]
    assert list(factorisations(1, 5)) == [(1, 1, 1, 1, 1)]


def rules_of(layout, inp, **kw):
    return {r.rule for r in check_layout(layout, inp, **kw)}


def test_valid_layout_has_no_rejection():
    assert rules_of(Layout(world=8, dp_shard=2, tp=2, pp=2), inputs(qwen())) == set()


@pytest.mark.parametrize("layout,model,extra,rule", [
    (Layout(world=8, tp=8), qwen(num_attention_heads=4), {}, "tp_heads"),
    (Layout(world=4, tp=4), qwen(num_key_value_heads=2), {}, "tp_kv_heads"),
    (Layout(world=2, tp=2), qwen(), {"sequence_parallel": False}, "tp_needs_sp"),
    (Layout(world=3, pp=3), qwen(num_hidden_layers=4), {}, "pp_layers"),
    (Layout(world=2, pp=2, interleave=4), qwen(num_hidden_layers=4), {}, "pp_layers"),
    (Layout(world=2, pp=2), qwen(), {"layers_per_stage": ["0-1", "3"]}, "pp_layers"),
    (Layout(world=8, dp_shard=8, ep=8), dsv3(), {}, "ep_experts"),
    (Layout(world=2, dp_shard=2, ep=2), qwen(), {}, "ep_dense"),
    (Layout(world=4, dp_replicate=2, dp_shard=2, ep=4), dsv3(n_routed_experts=8, n_group=4), {}, "ep_domain"),
    (Layout(world=3, cp=3), qwen(seq_length=21), {}, "cp_seq"),          # 21 % (2·3) = 3
    (Layout(world=4, cp=4), qwen(seq_length=14), {"cp_method": "ulysses"}, "cp_seq"),  # 14 % 4 = 2
    (Layout(world=3, dp_shard=3), qwen(), {}, "batch"),
    (Layout(world=32, dp_shard=32), qwen(), {}, "batch"),                  # 16 < 32
    (Layout(world=8, dp_shard=2, tp=2), qwen(), {}, "product"),
])
def test_each_rule_rejects(layout, model, extra, rule):
    got = check_layout(layout, inputs(model, **extra))
    assert rule in {r.rule for r in got}
    assert all(r.rule in RULES for r in got)


def test_cp_colossal_needs_twice_cp():
    inp = inputs(qwen(seq_length=12))
    assert "cp_seq" in rules_of(Layout(world=4, cp=4), inp)                  # 12 % 8 = 4
    assert "cp_seq" not in rules_of(Layout(world=4, cp=4), inputs(qwen(seq_length=12), cp_method="ulysses"))


def test_tp_inside_node():
    inp = inputs(qwen(num_attention_heads=8, num_key_value_heads=8))
    assert "tp_in_node" in rules_of(Layout(world=8, tp=8), inp, nodes=2)    # 4 devices per node
    assert "tp_in_node" not in rules_of(Layout(world=8, dp_shard=2, tp=4), inp, nodes=2)


def test_explicit_stage_list_allows_uneven_split():
    inp = inputs(qwen(num_hidden_layers=5), layers_per_stage=["0-2", "3-4"])
    assert rules_of(Layout(world=2, pp=2), inp) == set()
    assert stage_layers(5, 2, 1, ["0-2", "3-4"]) == [[0, 1, 2], [3, 4]]


def test_stage_layers_auto_and_interleaved():
    assert stage_layers(8, 2, 1) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # chunk c of rank r is virtual stage c·pp + r
    assert stage_layers(8, 2, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert stage_layers(7, 2, 1) is None


def test_prime_world_explains_each_dimension():
    cands = search(7, inputs(qwen()))
    assert not any(c.valid for c in cands)
    text = "\n".join(why_none(cands))
    for dim in ("tp:", "pp:", "cp:", "dp:"):
        assert dim in text
    assert "num_attention_heads % tp = 4 % 7 = 4" in text
