"""Turn a full model into this rank's tensor-parallel (with SP) / expert-parallel model.

Why from a full model: `models.build.build_model` draws the initial weights for the *global*
shapes from one seed, and a resumed checkpoint is assembled into global tensors too; cutting those
gives every layout the very same numbers as the single-process run (the basis of the equality
tests). The parallel model is then built from the same spec with the groups filled in
(`parallel_spec`), and `param_splits` says, per parameter name, which mesh axis splits which dim —
the one fact the optimizer state cut, the gradient sync, the grad norm and ``metadata.json`` need.

Splits (weights stored ``[out, in]``): column-parallel weight/bias and the vocab-parallel
embedding on dim 0 over ``tp``; row-parallel weight on dim 1 over ``tp``; routed expert weights
(``weight1``/``weight2``) on dim 0 over ``ep``. Everything else is replicated.
"""
from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from mftk.ckpt.names import param_of
from mftk.engine.spec import LayerSpec, ModelSpec, ModuleSpec

@attrs.frozen
class Split:
    """One parameter split ``group.size`` ways along ``dim``; this rank holds block ``group.rank``."""

    axis: str  # "tp" or "ep"
    dim: int
    group: Any  # AxisGroup


def parallel_spec(spec: ModelSpec, groups: Any) -> ModelSpec:
    """The spec with the TP group in every attention/MLP and the EP group in every MoE layer."""
    tp = groups.tp if groups.tp.size > 1 else None
    ep = groups.ep if groups.ep.size > 1 else None

    def with_group(m: ModuleSpec, key: str, group: Any) -> ModuleSpec:
        return m if group is None else ModuleSpec(m.module, {**m.params, key: group})

    def layer(ls: LayerSpec) -> LayerSpec:
        mlp = with_group(ls.mlp, "ep", ep) if ls.is_moe else with_group(ls.mlp, "tp", tp)
        return attrs.evolve(ls, attention=with_group(ls.attention, "tp", tp), mlp=mlp)

    return attrs.evolve(spec, layers=tuple(layer(s) for s in spec.layers),
                        mtp_layers=tuple(layer(s) for s in spec.mtp_layers), tp=tp)


def param_splits(model: Any) -> dict[str, Split]:
    """Parameter name → `Split`, for every split parameter of a (possibly parallel) model."""
    from mftk.engine.layers.moe import GroupedMLP
    from mftk.engine.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

    tp = getattr(model.spec, "tp", None)
    out: dict[str, Split] = {}
    for _, cell in model.cells_and_names():
        if isinstance(cell, (ColumnParallelLinear, VocabParallelEmbedding)):
            for p in (cell.weight, getattr(cell, "bias", None)):
                if p is not None:
                    out[p.name] = Split("tp", 0, tp)
        elif isinstance(cell, RowParallelLinear):
            out[cell.weight.name] = Split("tp", 1, tp)
        elif isinstance(cell, GroupedMLP) and cell.ep is not None:
            out[cell.weight1.name] = Split("ep", 0, cell.ep)
            out[cell.weight2.name] = Split("ep", 0, cell.ep)
    return out


def cut(tensors: dict[str, Any], splits: dict[str, Split]) -> dict[str, Any]:
    """Global tensors (model or optimizer names) → this rank's TP/EP blocks; others unchanged."""
    out = {}
    for key, value in tensors.items():
        s = splits.get(param_of(key))
        if s is None:
            out[key] = value
        else:
            out[key] = np.ascontiguousarray(np.split(np.asarray(value), s.group.size, axis=s.dim)[s.group.rank])
    return out


def to_parallel(full: Any, groups: Any) -> Any:
    """The TP/EP model of this rank, holding its blocks of ``full``'s weights and buffers."""
    from mftk.engine.models.build import load_state_dict, state_dict
    from mftk.engine.models.gpt import GPTModel

    model = GPTModel(parallel_spec(full.spec, groups))
    load_state_dict(model, cut(state_dict(full), param_splits(model)))
    model.set_train(full.training)
    return model


def tensor_parallel_problems(spec: ModelSpec, tp: int, seq_length: int) -> list[str]:
    """Why this model cannot run with tensor_parallel=tp (empty when it can)."""
    from mftk.engine.layers.attention import SelfAttention
    from mftk.engine.layers.mlp import MLP

    out = []
    kinds = {ls.attention.module.__name__ for ls in spec.layers if ls.attention.module is not SelfAttention}
    if kinds:
        out.append(f"tensor parallel supports GQA attention (Qwen3) only, not {', '.join(sorted(kinds))}")
    if any(ls.is_moe or ls.mlp.module is not MLP for ls in spec.layers) or spec.mtp_layers:
        out.append("tensor parallel does not support MoE or MTP layers yet")
    if out:
        return out
    att, mlp = spec.layers[0].attention.params, spec.layers[0].mlp.params
    for what, n in (("num_query_groups (num_key_value_heads)", att["num_groups"]),
                    ("ffn_hidden_size", mlp["ffn_hidden_size"]), ("vocab_size", spec.vocab_size),
                    ("seq_length (sequence parallel)", seq_length)):
        if n % tp:
            out.append(f"{what}={n} does not divide by tensor_parallel={tp}")
    return out


def expert_parallel_problems(spec: ModelSpec, ep: int, tp: int) -> list[str]:
    """Why this model cannot run with expert_parallel=ep (empty when it can)."""
    moe = [ls for ls in (*spec.layers, *spec.mtp_layers) if ls.is_moe]
    if not moe:
        return ["expert_parallel needs a model with MoE layers"]
    if any(ls.layer is not None for ls in spec.layers):
        return ["expert_parallel with hyper-connection layers (DeepSeek-V4) is not supported yet"]
    if tp > 1:
        return ["expert_parallel together with tensor_parallel is not supported yet"]
    e = moe[0].mlp.params["num_experts"]
    return [f"num_experts={e} does not divide by expert_parallel={ep}"] if e % ep else []
