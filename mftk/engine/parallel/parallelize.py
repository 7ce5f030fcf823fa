"""Parallelize a built model, torchtitan-style: one function applies TP (+SP), EP, CP, PP and FSDP to the
`GPTModel` that `models.build.build_model` built with plain layers and global shapes, unit by unit
(a transformer layer; the embedding and the head), from one `ParallelDims`.

Why from the full model: it is initialised from one seed with global shapes, and a resumed checkpoint is
assembled into global tensors too; cutting those gives every layout the very numbers of the
single-process run (the basis of the equality tests), and any checkpoint loads into any layout.

Order (the reference's, §2.1 step 8): tensor parallel → expert parallel → context parallel → pipeline
stages → FSDP (`fsdp.apply_fsdp`: each unit's parameters cut to this rank's rows, gathered per unit for its
forward and its replayed backward). Each step records in the `placement.PlacementTable` which dims it split over which
mesh axis; the gradient sync, the optimizer sharding, the norm and ``metadata.json`` read only that table.
Parameter names are the reference's throughout (`rename_parameters`).

Tensor parallel per layer (Megatron's layouts; weights ``[out, in]``):
- GQA attention: ``linear_qkv`` column-wise (rows are group-major: a row block is whole groups),
  ``linear_proj`` row-wise;
- MLA: the latent down-projection ``linear_qkv`` and its norms whole (the sequence is gathered before it),
  ``linear_qb``/``linear_kvb`` column-wise by heads, ``linear_proj`` row-wise; RoPE parts unchanged;
- dense MLP and shared experts: ``linear_fc1`` column-wise (interleaved gate/up rows: a row block is
  whole pairs), ``linear_fc2`` row-wise; router and shared-expert gate whole;
- routed experts: expert parallel over the EP group (the reference's sparse mesh carves EP out of
  dp_shard·cp·tp, so with ``ep = tp`` the EP group is the TP group); otherwise whole, data-parallel over
  TP like every other whole parameter;
- embedding vocabulary-parallel, output layer by vocabulary rows, the vocabulary-parallel loss;
- MTP layers: their transformer layer as above, ``eh_proj`` and norms whole;
- DeepSeek-V4 (`tensor_parallel_v4_attention`, as MindSpore Transformers 2.1.0): the attention whole on the
  gathered sequence but ``linear_q_up_proj`` column-wise; hyper-connections, norms, router and shared
  experts whole on this rank's positions; routed experts as above. Its legacy ``mla`` variant: the MLA plan
  above for the attention, the rest as V4's.
Every activation between those cells is split along the sequence (sequence parallel). Context parallel
(colossal, ulysses, hybrid) swaps the model's ``seq`` part and each core attention (`context_parallel`);
DeepSeek-V4's (colossal only) swaps its ``seq`` part and runs each attention whole on the sequence gathered
over CP·TP (`whole_sequence_v4_attention`);
expert parallel each MoE layer's dispatcher (`expert_parallel`); pipeline parallel freezes what other
stages hold (`pipeline_model`).
"""
from __future__ import annotations

from typing import Any

import attrs

from mftk.derive import Layout
from mftk.engine.parallel.placement import PlacementTable, axis_sizes


@attrs.frozen
class ParallelDims:
    """One rank's view of the mesh (torchtitan's ``ParallelDims``): the layout, this rank's groups, and the
    settings that pick how a dimension is applied."""

    layout: Layout
    groups: Any  # groups.ParallelGroups
    ulysses: int = 1  # the all-to-all degree inside CP: 1 colossal, cp ulysses, in between hybrid
    stage_chunks: Any = None  # [rank][chunk] -> decoder layer ids, under PP (`derive.stage_chunks`)
    fsdp_replay: frozenset = frozenset()  # FSDP units that replay their forward (recompute's layers)
    # called on the cut model before FSDP wraps its units (`recompute.apply_exclusions`: exclude_op's checkpoints
    # must sit inside the units' gathers)
    before_fsdp: Any = None


@attrs.frozen
class Parallelized:
    model: Any
    table: PlacementTable
    stage: Any = None  # pipeline_model.StageModel under PP
    grad_sink: Any = None  # fsdp.GradSink under FSDP: the units put their gradients in the trainer's buffer


def parallelize(model: Any, dims: ParallelDims) -> Parallelized:
    """Apply every parallel dimension of ``dims`` to ``model`` in place; returns it with its placement table."""
    g, lay = dims.groups, dims.layout
    table = PlacementTable.of_model(model)
    if lay.tp > 1:
        apply_tensor_parallel(model, g.tp, table)
    if lay.ep > 1:
        apply_expert_parallel(model, g.ep, table)
    if lay.cp > 1:
        apply_context_parallel(model, g, dims.ulysses)
    if lay.tp > 1 or lay.cp > 1:
        apply_whole_sequence_attention(model, g, lay.cp)
        apply_sequence_shards(model, g.tp_cp, lay.cp, g.tp)
    rename_parameters(model)
    stage = sink = None
    if lay.pp > 1:
        from mftk.engine.parallel.pipeline_model import StageModel

        stage = StageModel(model, dims.stage_chunks, g.pp.rank, table)
    if dims.before_fsdp is not None:
        dims.before_fsdp(model)
    if g.fsdp.size > 1:
        from mftk.engine.parallel import fsdp

        table.add_fsdp_rows(g.fsdp.size, axis_sizes(g), only=fsdp.shardable(model, table))
        sink = fsdp.GradSink()
        fsdp.apply_fsdp(model, g, table, dims.fsdp_replay, sink)
    return Parallelized(model=model, table=table, stage=stage, grad_sink=sink)


def rename_parameters(model: Any) -> None:
    """Every parameter named by its path in the model (the reference's checkpoint names): swapping a cell
    renames its parameters relative to the new parent (MindSpore prefixes on assignment)."""
    for name, p in model.parameters_and_names():
        p.name = name


# ------------------------------------------------------------------------------------ tensor parallel
def apply_tensor_parallel(model: Any, group: Any, table: PlacementTable) -> None:
    from mftk.engine.parallel import tensor_parallel as T

    _split(table, model.embedding.word_embeddings.weight, 0, "tp")
    model.embedding.word_embeddings = T.VocabParallelEmbedding(model.embedding.word_embeddings, group)
    if model.output_layer is not None:
        _split(table, model.output_layer.weight, 0, "tp")
        T.cut_parameter(model.output_layer.weight, group, 0)
        _split_adapters(model.output_layer, "column", group, table)  # a LoRA head: lora_b by vocabulary rows
    model.loss = T.VocabParallelHeadLoss(group)
    for layer in model.transformer_layers():
        tensor_parallel_layer(layer, group, table)


def tensor_parallel_layer(layer: Any, group: Any, table: PlacementTable) -> None:
    """One transformer layer (a unit): its attention and its MLP or MoE."""
    from mftk.engine.layers.attention import SelfAttention
    from mftk.engine.layers.csa import DeepseekV4Attention
    from mftk.engine.layers.hyper import HyperConnectionTransformerLayer
    from mftk.engine.layers.mla import MLASelfAttention
    from mftk.engine.layers.mlp import MLP
    from mftk.engine.layers.moe import MoELayer
    from mftk.engine.parallel import tensor_parallel as T

    att = layer.self_attention
    if isinstance(att, DeepseekV4Attention):
        tensor_parallel_v4_attention(layer, group, table)
        return  # its MoE: routed experts EP or whole, shared experts whole on this rank's positions (as MF)
    if isinstance(att, SelfAttention):
        _columnwise(att, "linear_qkv", group, table, gather_input=True)
    elif isinstance(att, MLASelfAttention):
        if not att.has_q_lora:  # refused by config.runnable: q is projected with the latent in one weight
            raise ValueError("tensor parallel MLA needs q_lora_rank")
        att.linear_qkv = T.replicated(att.linear_qkv, group)
        _columnwise(att, "linear_qb", group, table, gather_input=False)
        _columnwise(att, "linear_kvb", group, table, gather_input=False)
    else:
        raise ValueError(f"tensor parallel does not know {type(att).__name__}")  # refused by config.runnable
    _rowwise(att, "linear_proj", group, table)
    if isinstance(layer, HyperConnectionTransformerLayer):
        return  # DeepSeek-V4's legacy mla variant: DeepSeek-V3's MLA plan above, its MoE as V4's (shared experts whole)
    mlp = layer.mlp
    if isinstance(mlp, MoELayer):
        if mlp.shared_experts is not None:
            _mlp(mlp.shared_experts, group, table)
    elif isinstance(mlp, MLP):
        _mlp(mlp, group, table)
    else:
        raise ValueError(f"tensor parallel does not know {type(mlp).__name__}")


def tensor_parallel_v4_attention(layer: Any, group: Any, table: PlacementTable) -> None:
    """DeepSeek-V4's hybrid attention as MindSpore Transformers 2.1.0 splits it (pynative/base_models/gpt/
    parallelize.py, ``_dsv4_attention_layer_plan``: "Keep CSA/indexer/output projection replicated and use TP only
    for Q-up"): the attention runs whole on the gathered sequence on every TP rank, its query up-projection
    ``linear_q_up_proj`` column-wise (this rank's heads, gathered back before the compressed attention, which
    reads every head), everything else whole; this rank keeps its positions of the output.

    The gather and the slice are `whole_sequence_v4_attention`'s (with context parallel's too). The indexer's
    KL loss (detached inputs: it trains only the indexer) is computed alike on every rank: its gradient enters
    each rank's objective divided by tp (`tensor_parallel.ScaleGradient`). The hyper-connections, the norms
    and the MoE (router, shared experts) stay whole on this rank's positions (MF: ``SequenceParallel`` on
    ``attn_hc``, ``ffn_hc`` and ``mlp.shared_experts``)."""
    from mftk.engine.parallel import tensor_parallel as T

    att = layer.self_attention
    _split(table, att.linear_q_up_proj.weight, 0, "tp")
    att.linear_q_up_proj = T.columnwise_gathered(att.linear_q_up_proj, group)
    core = att.core_attention
    if core.with_indexer_loss:
        _divide_indexer_loss_gradient(core, group.size)


def _divide_indexer_loss_gradient(core: Any, tp: int) -> None:
    """After each forward of the compressed attention ``core``, its indexer loss with the gradient / ``tp``
    (the cell's ``construct`` wrapped on the instance, as `units.install` wraps a unit's)."""
    from mftk.engine.parallel.tensor_parallel import ScaleGradient

    scale, plain = ScaleGradient(1.0 / tp), core.construct

    def construct(*args):
        out = plain(*args)
        if core.indexer_loss is not None:
            core.indexer_loss = scale(core.indexer_loss)
        return out

    core.construct = construct


def _mlp(mlp: Any, group: Any, table: PlacementTable) -> None:
    _columnwise(mlp, "linear_fc1", group, table, gather_input=True)
    _rowwise(mlp, "linear_fc2", group, table)


def _split(table: PlacementTable, p: Any, dim: int, axis: str) -> None:
    if p is not None:
        table.split(p.name, dim, axis)


def _columnwise(parent: Any, attr: str, group: Any, table: PlacementTable, *, gather_input: bool) -> None:
    from mftk.engine.parallel import tensor_parallel as T

    cell = getattr(parent, attr)
    _split(table, cell.weight, 0, "tp")
    _split(table, getattr(cell, "bias", None), 0, "tp")
    _split_adapters(cell, "column", group, table)
    setattr(parent, attr, T.columnwise(cell, group, gather_input=gather_input))


def _rowwise(parent: Any, attr: str, group: Any, table: PlacementTable) -> None:
    from mftk.engine.parallel import tensor_parallel as T

    cell = getattr(parent, attr)
    _split(table, cell.weight, 1, "tp")
    _split_adapters(cell, "row", group, table)
    setattr(parent, attr, T.rowwise(cell, group))


def _split_adapters(cell: Any, role: str, group: Any, table: PlacementTable) -> None:
    """A LoRA-wrapped cell's adapters, cut like its base (`engine.lora.TP_SPLITS`: column-parallel → lora_b
    by rows, row-parallel → lora_a by columns)."""
    from mftk.engine.parallel import tensor_parallel as T

    for attr, dim in getattr(cell, "tp_splits", {}).get(role, ()):
        p = getattr(cell, attr)
        _split(table, p, dim, "tp")
        T.cut_parameter(p, group, dim)


# ------------------------------------------------------------------------------------ expert parallel
def apply_expert_parallel(model: Any, group: Any, table: PlacementTable) -> None:
    """Each MoE layer's routed experts: this rank's block of ``weight1``/``weight2``, tokens by all-to-all."""
    from mftk.engine.parallel.expert_parallel import ExpertParallelDispatch
    from mftk.engine.parallel.tensor_parallel import cut_parameter

    for moe in model.moe_layers():
        experts = moe.experts
        for p in experts.get_parameters():  # weight1, weight2 (and their LoRA adapters): dim 0 is the expert
            _split(table, p, 0, "ep")
            cut_parameter(p, group, 0)
        experts.dispatcher = ExpertParallelDispatch(group, experts.e)


# ------------------------------------------------------------------------------------ context parallel
def apply_context_parallel(model: Any, groups: Any, ulysses: int) -> None:
    """This rank's positions of every sequence (the model's ``seq``); attention over the whole sequence."""
    from mftk.engine.parallel import context_parallel as C

    from mftk.engine.layers.csa import DeepseekV4Attention

    if any(isinstance(layer.self_attention, DeepseekV4Attention) for layer in model.transformer_layers()):
        model.seq = C.WholeAttentionSequence(groups.cp)  # its attention: `whole_sequence_v4_attention`
        return
    model.seq = C.ContextSequence(groups.cp, ulysses)
    for layer in model.transformer_layers():
        att = layer.self_attention
        att.core_attention = C.ContextAttention(att.core_attention, groups.cp_ulysses, groups.cp_ring)


def apply_whole_sequence_attention(model: Any, groups: Any, cp: int) -> None:
    """DeepSeek-V4's attention under TP and/or CP: each layer's attention whole on the gathered sequence."""
    from mftk.engine.layers.csa import DeepseekV4Attention

    for layer in model.transformer_layers():
        if isinstance(layer.self_attention, DeepseekV4Attention):
            whole_sequence_v4_attention(layer, groups, model.seq if cp > 1 else None)


def whole_sequence_v4_attention(layer: Any, groups: Any, seq: Any = None) -> None:
    """One DeepSeek-V4 layer's attention run whole on the full sequence by every rank of the TP·CP group (MF
    2.1.0's TP plan, `tensor_parallel_v4_attention`; the same under CP): the sequence gathered after
    ``input_layernorm`` (a per-token norm, so the same numbers) and this rank's positions kept after
    ``linear_proj`` (the gradient of those positions only), so each rank's gradients inside are its part of the
    sum: the whole parameters' are summed over TP (and averaged over CP, where each rank's loss is ×cp) like
    every other, the gather's input gradient reduce-scattered. The indexer KL loss, computed alike on every
    rank, needs its gradient / tp only (the average over CP already counts it once).

    Under CP (``seq``: `context_parallel.WholeAttentionSequence`) each rank holds colossal's positions, cut in
    TP blocks: the gather puts them back in sequence order and the slice takes this rank's
    (`context_parallel.GatherPositions` / `KeepPositions`); the attention sees the whole sequence's RoPE and
    mask. Unlike MindSpore Transformers 2.1.0's CSA context parallel (pynative/distributed/
    csa_context_parallel.py: each rank's queries against a window halo and the gathered compressed entries),
    every CP rank computes the whole attention: CP splits the activations outside the attention only."""
    from mftk.engine.parallel import context_parallel as C
    from mftk.engine.parallel import tensor_parallel as T

    att = layer.self_attention
    if seq is None:
        group = groups.tp
        layer.input_layernorm = T.gather_sequence_after(layer.input_layernorm, group)
        att.linear_proj = T.keep_sequence_block_after(att.linear_proj, group)
        return
    group = groups.tp_cp  # member (cp c, tp t) holds TP block t of CP rank c's positions: seq.order in a row
    layer.input_layernorm = T.Sharded(layer.input_layernorm, leave=C.GatherPositions(group, seq.order))
    att.linear_proj = T.Sharded(att.linear_proj, leave=C.KeepPositions(group, seq.order))


def apply_sequence_shards(model: Any, group: Any, cp: int, tp_group: Any = None) -> None:
    """MoE load-balancing sums over the ranks holding the other parts of each sequence (SP and CP); hash
    routing reads the token ids of this rank's positions (SP: its block of the sequence)."""
    from mftk.engine.parallel.context_parallel import SequenceShards

    for moe in model.moe_layers():
        moe.tokens = SequenceShards(group, cp, tp_group)
