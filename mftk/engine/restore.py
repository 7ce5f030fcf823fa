"""Resume, the engine's half: the plan for a built model (`plan_start`, deciding with `ckpt.resume`), then its
tensors into the model, optimizer and train state.

The plan (pure, `mftk.ckpt.resume`) decided what to load; this module reads the tensors (one file,
shards assembled through ``metadata.json``, or balanced loading) into the full model, and returns
the optimizer tensors (global; the caller cuts this rank's share) and the extra state (RNG, data
position) for `restore_state` to apply once the loader and optimizer exist.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import attrs

from mftk.ckpt.names import is_optimizer_name
from mftk.ckpt.resume import (ResumePlan, ResumeScenario, check_target_step, fit_architecture, plan_resume,
                              saved_schedule, skipped_warnings)
from mftk.engine.schedule import lr_change_at_resume
from mftk.engine.state import TrainState, restore_rng
from mftk.errors import CheckpointError

log = logging.getLogger("mftk.train")


@attrs.frozen
class LoadedCheckpoint:
    """What a checkpoint gave beyond the model weights (already in the model)."""

    optimizer: dict | None  # global optimizer tensors (None: weights only)
    extra: dict | None  # mftk's extra state of the saving rank (None: a reference checkpoint)


def param_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The model's parameter names and shapes: what a resume plan checks a checkpoint against."""
    return {p.name: tuple(p.shape) for p in model.get_parameters()}


def plan_for(config: Any, model: Any, path: str, *, weights_only: bool, layout: Any) -> ResumePlan:
    """`ckpt.resume.plan_resume` for ``model`` in this run's layout."""
    return plan_resume(config, path, weights_only=weights_only, params=param_shapes(model), world=layout.world,
                       dp=layout.dp)


def plan_start(config: Any, model: Any, path: str, *, weights_only: bool, layout: Any, build: Callable[[Any], Any],
               model_from_checkpoint: bool) -> tuple[Any, Any, ResumePlan, list[str]]:
    """(config, model, plan, warnings) of a resume from ``path``: the architecture it trains
    (`ckpt.resume.fit_architecture`; ``build`` builds the checkpoint's when that is taken), a target step below
    the checkpoint's refused, and the warnings, logged as they are found: differing ``model:`` fields, damaged
    newer checkpoints passed over, an LR schedule that does not continue the saved run's."""
    built: list[Any] = []

    def replan(candidate: Any) -> ResumePlan:
        built.append(build(candidate))
        return plan_for(candidate, built[-1], path, weights_only=weights_only, layout=layout)

    arch = fit_architecture(config, plan_for(config, model, path, weights_only=weights_only, layout=layout),
                            replan=replan, model_from_checkpoint=model_from_checkpoint)
    config, plan, warnings = arch.config, arch.plan, list(arch.warnings)
    for w in warnings:
        log.warning(w)
    check_target_step(plan, config.training.steps)
    for w in skipped_warnings(plan):
        warnings.append(w)
        log.warning(w)
    for n in plan.notes:
        log.info(n)
    saved = saved_schedule(plan)
    jump = saved and lr_change_at_resume(saved[0], saved[1], plan.saved_step, config.lr_scheduler,
                                         config.training.steps, plan.start_step)
    if jump:
        warnings.append(jump)
        log.warning(jump)
    return config, built[-1] if arch.from_checkpoint else model, plan, warnings


def load_checkpoint(plan: ResumePlan, model: Any, config: Any, *, rank: int = 0) -> LoadedCheckpoint:
    """Load the plan's tensors into ``model``; multi-process checkpoints are assembled through metadata.json."""
    from mftk.ckpt.extra_state import read_extra_state
    from mftk.ckpt.load import load_global, load_rank
    from mftk.engine.models.build import load_state_dict as load_all

    def load_state_dict(m: Any, tensors: dict) -> None:
        load_all(m, _with_kept(m, tensors))

    if plan.problems:
        raise CheckpointError(message=f"{plan.step_dir} does not fit the model ({len(plan.problems)} problems)",
                              path=plan.step_dir, problems=plan.problems[:50],
                              hint="check that the model: section matches the run that saved the checkpoint")
    with_opt = plan.loads_optimizer
    balanced = None
    if config.checkpoint.load_balanced and plan.world > 1:  # scenario 4: each shard read once
        from mftk.engine.balanced_load import load_balanced

        balanced = load_balanced(plan.step_dir, rank=rank, world=plan.world,
                                 kinds=("model", "opt") if with_opt else ("model",))
    same_rank = rank if rank < plan.saved_world else 0  # the data position and RNG are the same on every rank
    if plan.kind == "hf":
        from mftk.config.families import family_of

        hf = balanced.model if balanced else load_global(plan.step_dir)
        load_state_dict(model, _with_buffers(model, family_of(config.model).hf_to_mf(hf, config.model)))
        return LoadedCheckpoint(None, None)
    if balanced is not None:
        load_state_dict(model, balanced.model)
        return LoadedCheckpoint(balanced.optimizer if with_opt else None,
                                read_extra_state(plan.step_dir, same_rank, plan.saved_world))
    if plan.saved_world == 1:
        one = load_rank(plan.step_dir, optimizer=with_opt)
        load_state_dict(model, one.model)
        return LoadedCheckpoint(one.optimizer, one.extra)
    from mftk.ckpt.metadata import read_metadata

    tensors = load_global(plan.step_dir, list(read_metadata(plan.step_dir)))
    load_state_dict(model, {n: a for n, a in tensors.items() if not is_optimizer_name(n)})
    opt = {n: a for n, a in tensors.items() if is_optimizer_name(n)} if with_opt else None
    return LoadedCheckpoint(opt, read_extra_state(plan.step_dir, same_rank, plan.saved_world))


def restore_state(plan: ResumePlan | None, loaded: LoadedCheckpoint | None, *, epoch_micro_batches: int,
                  start_batch: int) -> TrainState:
    """The train state a run starts from: step and samples from the plan, the rest from the extra state."""
    if plan is None:
        return TrainState(micro_batches_read=start_batch)
    state = TrainState(global_step=plan.start_step, consumed_samples=plan.consumed_samples,
                       common_extra=dict(plan.common_extra))
    extra = loaded.extra if loaded is not None else None
    if extra:
        state.epoch = int(extra.get("epoch", 0))
        state.consecutive_skipped = int(extra.get("consecutive_skipped", 0))
        state.skipped_steps = int(extra.get("skipped_steps", 0))
        if plan.scenario == ResumeScenario.STANDARD:
            restore_rng(extra)
    elif plan.scenario == ResumeScenario.STANDARD:
        log.info("no mftk extra state in %s (a reference checkpoint?): RNG re-seeded from training.seed", plan.step_dir)
    state.micro_batches_read = start_batch + state.epoch * epoch_micro_batches
    return state


def _with_kept(model: Any, tensors: dict) -> dict:
    """The model's own values for the tensors a LoRA-aware load keeps (`ckpt.lora.optional_names`): fresh
    adapters from a base checkpoint, the base (loaded from base_load_path) under an adapter-only one."""
    from mftk.ckpt.lora import optional_names

    params = {p.name: p for p in model.get_parameters()}
    keep, why = optional_names(params, tensors)
    missing = [n for n in keep if n not in tensors]
    if missing and why:
        log.info(why)
    return {**tensors, **{n: params[n].asnumpy() for n in missing}}


def _with_buffers(model: Any, tensors: dict) -> dict:
    """HF dirs hold no MindSpore Transformers buffers (expert_bias, tokens_per_expert...): keep the model's."""
    out = dict(tensors)
    for p in model.get_parameters():
        if not p.requires_grad and p.name not in out:
            out[p.name] = p.asnumpy()
    return out
