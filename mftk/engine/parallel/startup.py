"""The "process groups" phase of a run's start-up on several processes: the groups, the model parallelized for
this rank (`parallelize`, then the ``recompute`` sections), its `DistContext`, and one log line per dimension."""
from __future__ import annotations

from typing import Any

from mftk.config.runnable import ulysses_degree
from mftk.engine.distributed import make_context
from mftk.engine.memstat import release_freed_memory
from mftk.engine.parallel.groups import create_groups
from mftk.engine.parallel.parallelize import ParallelDims, parallelize
from mftk.engine.parallel.pipeline_model import stage_chunks_of
from mftk.engine.recompute import apply_exclusions, apply_recompute, excluded_cells, replayed_layers
from mftk.logs.sinks import log
from mftk.units import plural


def distribute(model: Any, layout: Any, config: Any) -> tuple[Any, Any]:
    """Process groups, the model parallelized for this rank (`parallel.parallelize`), and its `DistContext`."""
    p = config.parallelism
    ulysses = ulysses_degree(p.context_parallel_method, layout.cp, p.ulysses_degree_in_cp)
    groups = create_groups(layout, ulysses=ulysses)
    chunks = None
    if layout.pp > 1:
        chunks = stage_chunks_of(config)
    replay = replayed_layers(model, config.recompute, config.recompute_comm)
    par = parallelize(model, ParallelDims(layout=layout, groups=groups, ulysses=ulysses, stage_chunks=chunks,
                                          fsdp_replay=replay, before_fsdp=lambda m: apply_exclusions(
                                              m, config.recompute, config.recompute_comm)))
    _log_parallel(par, layout, groups, p)
    _recompute(model, config)
    release_freed_memory()
    dist = make_context(groups, par.table, list(model.trainable_params()), stage=par.stage, grad_sink=par.grad_sink)
    return model, dist


def _log_parallel(par: Any, layout: Any, groups: Any, p: Any) -> None:
    """One start-up line per parallel dimension that is on: what this rank holds."""
    table = par.table
    if layout.tp > 1 or layout.ep > 1:
        split = sum(1 for t in table if t.split_over("tp") or t.expert)
        log.info("Model parallel: tensor_parallel=%d (sequence parallel), expert_parallel=%d; %d parameters split "
                 "(column/vocab on dim 0, row on dim 1, experts on dim 0)", layout.tp, layout.ep, split)
    if layout.cp > 1:
        method = p.context_parallel_method.lower()
        if method == "ulysses":
            held = f"positions {groups.cp.rank} of {layout.cp} contiguous parts; heads all-to-all"
        else:
            held = (f"sequence chunks {groups.cp.rank} and {2 * layout.cp - 1 - groups.cp.rank} of {2 * layout.cp}; "
                    + ("KV all-gathered" if method == "colossal" else
                       f"heads all-to-all over {groups.cp_ulysses.size}, KV all-gathered over {groups.cp_ring.size}"))
        log.info("Context parallel: context_parallel=%d (%s: rank %d holds %s)", layout.cp, method, groups.cp.rank,
                 held)
    stage = par.stage
    if stage is not None:
        chunks = f" in {len(stage.chunks)} chunks {stage.chunks}" if len(stage.chunks) > 1 else ""
        log.info("Pipeline parallel: stage %d of %d holds decoder layers %s%s%s%s (schedule %s)", stage.stage,
                 layout.pp, stage.my_layers, chunks, ", the embedding" if stage.is_first else "",
                 ", the final norm and output layer" if stage.is_last else "",
                 "interleaved_1f1b" if len(stage.chunks) > 1 else (p.pipeline_parallel_schedule or "1f1b"))
    fsdp = sum(1 for t in table if t.split_over("fsdp"))
    if fsdp:
        log.info("FSDP: %s along dim 0 over %d ranks, with their gradients and optimizer states; each unit (layer, "
                 "embedding, output layer) gathers them for its forward and again for its backward",
                 sharded_phrase(fsdp, sum(1 for t in table if t.trainable)), groups.fsdp.size)


def sharded_phrase(sharded: int, total: int) -> str:
    """'all 19 parameters sharded' or '17 of 19 parameters sharded (the other 2 replicated: dim 0 does not
    divide evenly)'."""
    if sharded == total:
        return f"all {plural(total, 'parameter')} sharded"
    rest = total - sharded
    return (f"{sharded} of {plural(total, 'parameter')} sharded (the other {rest} replicated: outside every unit, "
            "or dim 0 does not divide evenly)")


def _recompute(model: Any, config: Any) -> None:
    """The ``recompute`` / ``recompute_comm`` sections on the parallelized model (several processes, as the
    reference applies them; `engine.recompute`)."""
    replayed = apply_recompute(model, config.recompute, config.recompute_comm)
    if replayed:
        log.info("Recompute (%s): %s replayed in the backward: %s", config.recompute.mode,
                 plural(len(replayed), "cell"), ", ".join(replayed[:8]) + (" ..." if len(replayed) > 8 else ""))
    excluded = excluded_cells(model)
    if excluded:
        log.info("Recompute exclude_op: %s not replayed (outputs kept): %s", plural(len(excluded), "cell"),
                 ", ".join(excluded[:8]) + (" ..." if len(excluded) > 8 else ""))
