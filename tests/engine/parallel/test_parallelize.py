"""`parallel.parallelize` without processes: on every rank of a layout, each tensor of the parallelized model is
exactly the block the placement table says (checked against hand-written numpy slices for the TP/EP layouts),
the names stay the reference's, and the cells that communicate are where Megatron's layouts put them.
The msrun equality tests are in tests/commands/test_train_layouts.py."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from mftk.derive import Layout, stage_chunks
from tests.helpers.models import make_dsv3, make_dsv4, make_qwen3

pytestmark = pytest.mark.engine


def _parallelized(cfg, layout: Layout, rank: int, ulysses: int = 1):
    from mftk.engine.models.build import build_model
    from mftk.engine.parallel.groups import mesh_groups
    from mftk.engine.parallel.parallelize import ParallelDims, parallelize

    model = build_model(cfg, seed=3)
    groups = mesh_groups(layout, rank, ulysses=ulysses)
    chunks = stage_chunks(cfg.num_hidden_layers, layout.pp, layout.interleave) if layout.pp > 1 else None
    return model, groups, parallelize(model, ParallelDims(layout=layout, groups=groups, ulysses=ulysses,
                                                          stage_chunks=chunks))


def test_tp_blocks_are_the_full_weights_slices():
    from mftk.engine.models.build import build_model, state_dict

    ref = state_dict(build_model(make_qwen3(), seed=3))
    model, _, par = _parallelized(make_qwen3(), Layout(world=2, tp=2), rank=1)
    got = state_dict(model)
    assert set(got) == set(ref)  # the same names: checkpoints stay reference-named
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    proj = "decoder.layers.0.self_attention.linear_proj.weight"
    fc1, emb = "decoder.layers.1.mlp.linear_fc1.weight", "embedding.word_embeddings.weight"
    np.testing.assert_array_equal(got[qkv], ref[qkv][ref[qkv].shape[0] // 2:])  # rank 1: the second half of the groups
    np.testing.assert_array_equal(got[proj], ref[proj][:, ref[proj].shape[1] // 2:])
    np.testing.assert_array_equal(got[fc1], ref[fc1][ref[fc1].shape[0] // 2:])  # whole (gate, up) pairs
    np.testing.assert_array_equal(got[emb], ref[emb][ref[emb].shape[0] // 2:])
    assert (par.table[qkv].splits, par.table[proj].splits) == (((0, "tp"),), ((1, "tp"),))
    norm = "decoder.layers.0.input_layernorm.weight"
    assert par.table[norm].splits == () and np.array_equal(got[norm], ref[norm])


def test_tp_cuts_a_non_gated_mlp_into_blocks_whose_sum_is_the_full_mlp(rng):
    """Non-gated ``linear_fc1`` ([F, H], plain rows): rank r keeps rows r·F/2…, ``linear_fc2`` the same columns, and
    Σ_r fc2_r(gelu(fc1_r x)) is the whole MLP (float64 NumPy; what the row-parallel reduce-scatter sums)."""
    from mftk.engine.models.build import build_model, state_dict
    from tests.helpers.activations import gelu64

    cfg = make_qwen3(hidden_act="gelu", gated_linear_unit=False)
    ref = state_dict(build_model(cfg, seed=3))
    fc1, fc2 = "decoder.layers.1.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc2.weight"
    assert ref[fc1].shape == (cfg.intermediate_size, cfg.hidden_size)
    x = rng.normal(0, 1, (5, cfg.hidden_size))
    partial = []
    for rank in (0, 1):
        model, _, par = _parallelized(cfg, Layout(world=2, tp=2), rank=rank)
        got = state_dict(model)
        half = cfg.intermediate_size // 2
        np.testing.assert_array_equal(got[fc1], ref[fc1][rank * half:(rank + 1) * half])
        np.testing.assert_array_equal(got[fc2], ref[fc2][:, rank * half:(rank + 1) * half])
        assert (par.table[fc1].splits, par.table[fc2].splits) == (((0, "tp"),), ((1, "tp"),))
        partial.append(gelu64(x @ got[fc1].astype(np.float64).T) @ got[fc2].astype(np.float64).T)
    whole = gelu64(x @ ref[fc1].astype(np.float64).T) @ ref[fc2].astype(np.float64).T
    np.testing.assert_allclose(partial[0] + partial[1], whole, rtol=1e-12, atol=1e-12)


def test_mla_tp_splits_heads_and_keeps_the_latent_whole():
    from mftk.engine.models.build import build_model, state_dict

    cfg = make_dsv3(num_attention_heads=4)
    ref = state_dict(build_model(cfg, seed=3))
    model, _, par = _parallelized(cfg, Layout(world=2, tp=2), rank=0)
    got, att = state_dict(model), "decoder.layers.0.self_attention."
    np.testing.assert_array_equal(got[att + "linear_qkv.weight"], ref[att + "linear_qkv.weight"])  # latent: whole
    np.testing.assert_array_equal(got[att + "k_layernorm.weight"], ref[att + "k_layernorm.weight"])
    for name in ("linear_qb.weight", "linear_kvb.weight"):  # heads 0-1 of 4: the first half of the rows
        np.testing.assert_array_equal(got[att + name], ref[att + name][: ref[att + name].shape[0] // 2])
    proj = ref[att + "linear_proj.weight"]
    np.testing.assert_array_equal(got[att + "linear_proj.weight"], proj[:, : proj.shape[1] // 2])
    moe = "decoder.layers.1.mlp."
    np.testing.assert_array_equal(got[moe + "router.weight"], ref[moe + "router.weight"])  # router whole
    np.testing.assert_array_equal(got[moe + "experts.weight1"], ref[moe + "experts.weight1"])  # no EP: whole
    fc1 = ref[moe + "shared_experts.linear_fc1.weight"]
    np.testing.assert_array_equal(got[moe + "shared_experts.linear_fc1.weight"], fc1[: fc1.shape[0] // 2])
    assert par.table["mtp.layers.0.transformer_layer.self_attention.linear_qb.weight"].splits == ((0, "tp"),)


def test_v4_tp_splits_only_the_query_up_projection_as_mf():
    """DeepSeek-V4 under TP (MindSpore Transformers 2.1.0 pynative/base_models/gpt/parallelize.py,
    ``_dsv4_attention_layer_plan``): the query up-projection's rows are split (rank 1: the second half), the rest of
    the attention, the hyper-connections, the router and the shared experts stay whole; the attention gathers the
    sequence after its input norm and keeps this rank's positions after ``linear_proj``; hash routing reads this
    rank's block of the token ids."""
    from mindspore import Tensor

    from mftk.engine.models.build import build_model, state_dict
    from mftk.engine.parallel import comm
    from mftk.engine.parallel.tensor_parallel import Sharded

    cfg = make_dsv4()
    ref = state_dict(build_model(cfg, seed=3))
    model, _, par = _parallelized(cfg, Layout(world=2, tp=2), rank=1)
    got = state_dict(model)
    assert set(got) == set(ref)
    layer = "decoder.layers.0."
    q_up = layer + "self_attention.linear_q_up_proj.weight"
    np.testing.assert_array_equal(got[q_up], ref[q_up][ref[q_up].shape[0] // 2:])
    assert par.table[q_up].splits == ((0, "tp"),)
    split = sorted(n for n, p in par.table.by_name.items() if p.split_over("tp"))
    assert [n for n in split if n.startswith(layer)] == [q_up], split
    for name in ("self_attention.linear_proj.weight", "self_attention.linear_o_group_proj",
                 "self_attention.linear_q_down_proj.weight", "self_attention.linear_kv_proj.weight",
                 "attn_hc.mapping_proj.weight", "input_layernorm.weight", "mlp.router.weight",
                 "mlp.shared_experts.linear_fc1.weight", "mlp.experts.weight1"):
        np.testing.assert_array_equal(got[layer + name], ref[layer + name], err_msg=name)
    tl = model.decoder.layers[0]
    assert isinstance(tl.input_layernorm.leave, comm.GatherFromGroup)
    assert isinstance(tl.self_attention.linear_proj.leave, comm.KeepSlice)
    q_up_cell = tl.self_attention.linear_q_up_proj
    assert isinstance(q_up_cell, Sharded) and q_up_cell.leave.dim == -1  # the heads gathered back
    ids = Tensor(np.arange(8, dtype=np.int32).reshape(1, 8))
    assert tl.mlp.tokens.ids(ids).asnumpy().tolist() == [[4, 5, 6, 7]]  # rank 1: the second half of the sequence


def test_ep_blocks_hold_this_ranks_experts():
    from mftk.engine.models.build import build_model, state_dict

    ref = state_dict(build_model(make_dsv3(), seed=3))
    model, groups, par = _parallelized(make_dsv3(), Layout(world=2, dp_shard=2, ep=2), rank=1)
    got = state_dict(model)
    w1 = [n for n in got if n.endswith("experts.weight1")]
    assert len(w1) == 2  # the MoE decoder layer and the MTP layer
    for n in w1:
        np.testing.assert_array_equal(got[n], ref[n][ref[n].shape[0] // 2:])  # experts 4-7 of 8
        assert par.table[n].splits == ((0, "ep"),)  # not FSDP-sharded: their replicas are the EDP group
    opt = par.table.cut({f"adam_m.{w1[0]}": ref[w1[0]], "global_step": np.array([5])}, groups)
    np.testing.assert_array_equal(opt[f"adam_m.{w1[0]}"], got[w1[0]])
    assert opt["global_step"].tolist() == [5]


@pytest.mark.parametrize("cfg,layout", [
    (make_qwen3(), Layout(world=8, dp_shard=2, tp=2, pp=2)),
    (make_qwen3(num_hidden_layers=4), Layout(world=4, dp_shard=2, pp=2, interleave=2)),
    (make_qwen3(tie_word_embeddings=True), Layout(world=4, cp=2, pp=2)),
    (make_dsv3(num_attention_heads=4), Layout(world=8, dp_replicate=2, tp=2, ep=2, dp_shard=2)),
    (make_dsv3(), Layout(world=8, pp=2, ep=2, dp_shard=2, cp=2)),
])
def test_every_rank_holds_the_table_block_of_every_tensor(cfg, layout):
    from mftk.engine.models.build import build_model, state_dict

    ref = state_dict(build_model(cfg, seed=3))
    for rank in range(layout.world):
        model, groups, par = _parallelized(cfg, layout, rank)
        got = state_dict(model)
        assert set(got) == set(ref)
        for name, array in got.items():
            held = par.table.held(name, groups) and par.table[name].trainable  # the Parameters hold their FSDP rows
            want = par.table[name].cut(ref[name], groups, upto=None if held else "fsdp")  # other stages': frozen
            assert want.shape == array.shape and np.array_equal(want, array), name
        held = {p.name for p in model.trainable_params()}
        assert held == {n for n in ref if par.table.held(n, groups) and par.table[n].trainable}


def test_pipeline_stages_hold_their_layers_and_share_the_embedding():
    cfg = make_dsv3()  # MTP: the last stage keeps a trainable copy of the embedding
    _, groups, first = _parallelized(cfg, Layout(world=2, pp=2), rank=0)
    _, _, last = _parallelized(cfg, Layout(world=2, pp=2), rank=1)
    emb = "embedding.word_embeddings.weight"
    assert first.table[emb].stages == (0, 1) and first.table[emb].owner == 0
    assert first.table["decoder.layers.1.mlp.router.weight"].stages == (1,)
    assert first.stage.my_layers == [0] and last.stage.my_layers == [1]
    assert any(p.name == emb for p in last.stage.chunk_params(0))
    assert first.table.norm_weight(emb, groups) == 1.0  # counted once: on its owner stage
    from mftk.engine.parallel.groups import mesh_groups

    assert last.table.norm_weight(emb, mesh_groups(Layout(world=2, pp=2), 1)) == 0.0


def test_cells_that_communicate():
    from mftk.engine.parallel.context_parallel import ContextAttention, ContextSequence, SequenceShards
    from mftk.engine.parallel.expert_parallel import ExpertParallelDispatch
    from mftk.engine.parallel.tensor_parallel import Sharded, VocabParallelEmbedding, VocabParallelHeadLoss

    model, _, _ = _parallelized(make_dsv3(num_attention_heads=4), Layout(world=8, tp=2, cp=2, ep=2, dp_shard=2), 0)
    att = model.decoder.layers[0].self_attention
    assert isinstance(att.linear_qkv, Sharded) and att.linear_qkv.enter is not None  # the sequence is gathered
    assert att.linear_qb.enter is None and att.linear_proj.leave is not None  # latent already whole; reduce-scatter
    assert isinstance(att.core_attention, ContextAttention) and isinstance(model.seq, ContextSequence)
    assert att.core_attention.scatter_heads is None and att.core_attention.gather is not None  # colossal
    assert isinstance(model.embedding.word_embeddings, VocabParallelEmbedding)
    assert isinstance(model.loss, VocabParallelHeadLoss)
    moe = model.decoder.layers[1].mlp
    assert isinstance(moe.experts.dispatcher, ExpertParallelDispatch) and isinstance(moe.tokens, SequenceShards)
    assert moe.tokens.shards == 4  # each sequence is spread over cp·tp ranks


def test_context_parallel_methods_positions_and_groups():
    """colossal (u = 1), hybrid (u = 2) and ulysses (u = cp = 4) on 4 CP ranks of a 16-token sequence: which
    positions each rank embeds, which queries and keys its attention sees, and over which ranks."""
    lay = Layout(world=4, cp=4)
    model, groups, _ = _parallelized(make_qwen3(num_attention_heads=8, num_key_value_heads=4), lay, rank=1, ulysses=2)
    mine, queries, keys = model.seq.positions(16)
    # chunks of 2: rank 1 holds chunks 1 and 6; its ulysses group is ranks 0-1 (chunks 0, 7 | 1, 6)
    assert mine.tolist() == [2, 3, 12, 13]
    assert queries.tolist() == [0, 1, 14, 15, 2, 3, 12, 13]
    assert sorted(keys.tolist()) == list(range(16)) and keys[:8].tolist() == queries.tolist()
    assert (groups.cp_ulysses.ranks, groups.cp_ring.ranks) == ((0, 1), (1, 3))
    model = _parallelized(make_qwen3(num_attention_heads=8, num_key_value_heads=4), lay, rank=1, ulysses=4)[0]
    mine, queries, keys = model.seq.positions(16)
    assert mine.tolist() == [4, 5, 6, 7] and queries.tolist() == keys.tolist() == list(range(16))  # contiguous
    att = model.decoder.layers[0].self_attention.core_attention
    assert att.scatter_heads is not None and att.gather is None
    mask = model.seq.mask(np.triu(np.ones((16, 16), bool), 1)[None, None])
    assert mask.shape == (1, 1, 16, 16)  # ulysses: every query position against every key


@pytest.mark.parametrize("layout,n", [(Layout(world=2, dp_shard=2), 2), (Layout(world=4, dp_shard=4), 4),
                                      (Layout(world=4, dp_replicate=2, dp_shard=2), 2)])
def test_fsdp_parameters_hold_one_nth_of_the_model(layout, n):
    """Between steps every rank's Parameters themselves hold 1/N of each unit's weights (N = dp_shard; HSDP
    replicates over dp_replicate): counted on ``trainable_params()``, the storage the optimizer, the gradients
    and the checkpoint follow; only the final norm (outside every unit) stays whole."""
    from mftk.engine.models.build import build_model, state_dict

    cfg = make_qwen3(hidden_size=64, intermediate_size=96, vocab_size=128)
    full = {k: v.size for k, v in state_dict(build_model(cfg, seed=3)).items()}
    whole = {"decoder.final_layernorm.weight"}
    for rank in range(layout.world):
        model, _, _ = _parallelized(cfg, layout, rank)
        params = {p.name: p for p in model.trainable_params()}
        assert set(params) == set(full)
        for name, p in params.items():
            assert int(np.prod(p.shape)) == (full[name] if name in whole else full[name] // n), name
            assert p.asnumpy().size == int(np.prod(p.shape))  # the storage, not only the shape
        held = sum(p.asnumpy().size for p in params.values())
        assert held == sum(full.values()) // n + sum(full[w] for w in whole) * (n - 1) // n


def test_the_config_sets_the_interleaved_stages_and_the_context_parallel_method(tmp_path):
    """What `run.distribute` builds on a rank from the *loaded* config (the proving test of
    pipeline_parallel_interleave_num, context_parallel_method and ulysses_degree_in_cp, cheap enough to run under
    each one's forgetting mutant): rank 0 of pp2 × v2 on 4 layers holds layers 0 and 2 (1f1b without interleave:
    0 and 1), and rank 1 of cp4 hybrid with ulysses 2 attends over its all-to-all pair's positions (colossal:
    its own chunks only). The msrun runs of both layouts are in tests/commands/test_train_layouts.py."""
    from mftk.config.runnable import ulysses_degree
    from mftk.derive import layout_from_config
    from mftk.config.load import load_data
    from mftk.engine.parallel.pipeline_model import stage_chunks_of
    from tests.helpers.tiny import tiny_raw

    raw = tiny_raw("qwen3_tiny.yaml", tmp_path / "corpus", tmp_path / "ckpt")
    raw["model"].update({"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4})

    def load(world: int, *overrides: str):
        return load_data(copy.deepcopy(raw), overrides=overrides, world_size=world, check_files=False).config

    pp = load(2, "parallelism.pipeline_parallel=2", "parallelism.pipeline_parallel_interleave_num=2",
              "parallelism.pipeline_parallel_schedule=interleaved_1f1b")
    layout = layout_from_config(pp.parallelism, 2)
    chunks = stage_chunks_of(pp)
    assert chunks[0] == [[0], [2]]
    *_, par = _parallelized(pp.model, layout, rank=0)
    assert par.stage.my_layers == [0, 2]
    cp = load(4, "parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid",
              "parallelism.ulysses_degree_in_cp=2")
    p = cp.parallelism
    u = ulysses_degree(p.context_parallel_method, p.context_parallel, p.ulysses_degree_in_cp)
    model, groups, _ = _parallelized(cp.model, layout_from_config(p, 4), rank=1, ulysses=u)
    mine, queries, _ = model.seq.positions(16)
    assert mine.tolist() == [2, 3, 12, 13] and queries.tolist() == [0, 1, 14, 15, 2, 3, 12, 13]
    assert groups.cp_ulysses.ranks == (0, 1)
