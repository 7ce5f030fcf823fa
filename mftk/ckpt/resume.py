"""What a resume will do, decided from ``common.json``, ``metadata.json`` and file headers (no tensor data).

The reference's scenarios (§4.2): 1 standard (weights + optimizer + step + data position; bit-exact
with mftk's extra state), 2 weights only (step 0, fresh optimizer, masters from the loaded weights;
also from a Hugging Face dir), 3 changed global batch size (step rescaled ``int(step·old/new)``,
``consumed_samples`` kept, the optimizer's own step counter kept as the reference keeps it), 4
balanced loading (each unique shard read once; a way of loading, combinable with 1–3). Everything
the reference only warns about is an error here. Pure: MindSpore is never imported.

Around the plan, the decisions a resume makes from the checkpoint's saved config: which architecture it
trains (`fit_architecture`), whether it starts weights-only (`starts_weights_only`), whether it continues the
save folder's checkpoints (`continues_in`), a target below its step (`check_target_step`), and the saved LR
schedule the LR-jump warning compares with (`saved_schedule`).
"""
from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import attrs

from mftk.ckpt.layout import Located, iteration_dirs, locate, parse_iteration_dir_name, scan_step_dir
from mftk.ckpt.names import is_optimizer_name
from mftk.ckpt.run_config import read_run_config, saved_model_section
from mftk.derive import skip_micro_batches
from mftk.errors import CheckpointError, ConfigError, Problem
from mftk.units import plural


class ResumeScenario(enum.IntEnum):
    """The reference's resume scenarios, numbered as its guide numbers them."""

    STANDARD = 1
    WEIGHTS_ONLY = 2
    BATCH_CHANGED = 3
    BALANCED = 4

    @property
    def title(self) -> str:
        return {1: "standard resume", 2: "weights-only initialisation", 3: "resume with a changed batch size",
                4: "balanced loading"}[self.value]


@attrs.frozen
class ResumePlan:
    """What a resume will do: where from, which scenario, where training continues."""

    source: str
    kind: str  # "mf" or "hf"
    step_dir: str
    scenario: ResumeScenario
    saved_step: int
    saved_global_batch_size: int | None
    global_batch_size: int
    saved_world: int
    world: int
    start_step: int
    consumed_samples: int
    skip_micro_batches: int
    loads: tuple[str, ...]
    notes: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()
    common_extra: dict = attrs.field(factory=dict)  # common.json keys beyond the reference's 7: written back on save
    skipped: tuple[str, ...] = ()  # newer checkpoints passed over because they failed verification, and why

    @property
    def loads_optimizer(self) -> bool:
        return self.kind == "mf" and self.scenario != ResumeScenario.WEIGHTS_ONLY

    @property
    def problems(self) -> list[str]:
        """Why the checkpoint does not fit the model (empty when it does)."""
        return ([f"missing in checkpoint: {n}" for n in self.missing]
                + [f"unexpected in checkpoint: {n}" for n in self.unexpected]
                + [f"shape mismatch: {m}" for m in self.mismatched])


def optional_buffer(name: str) -> bool:
    """``max_logits_val`` is a statistic reset every step: a checkpoint may have it or not either way."""
    return name.endswith(".max_logits_val")


@attrs.frozen
class Selected:
    """The checkpoint dir a resume loads, after verification (`select_checkpoint`)."""

    step_dir: Path
    skipped: tuple[str, ...] = ()  # "iteration_00000006: <file>: <tensor>: checksum mismatch ..."
    notes: tuple[str, ...] = ()


def select_checkpoint(loc: Located) -> Selected:
    """The newest checkpoint of ``loc`` that verifies (`mftk.ckpt.verify.check_step_dir`: every tensor's bytes
    against its recorded CRC-32, no NaN/Inf, the rank files complete); a damaged one is never loaded.

    A save root reached through its tracker falls back, newest first, to the older ``iteration_*`` dirs beside
    the tracker's (each one skipped is named with its first problem); an ``iteration_*`` dir named explicitly
    is the user's choice and has no fallback. With nothing left: `CheckpointError` naming the damaged tensors
    and files. Every resume goes through here — `mftk resume`, and a job restarting itself."""
    from mftk.ckpt.verify import check_step_dir

    candidates = [Path(loc.step_dir)]
    if loc.root is not None and loc.step is not None:
        candidates += [d for s, d in sorted(iteration_dirs(loc.root).items(), reverse=True) if s < loc.step]
    skipped: list[str] = []
    problems: list[str] = []
    for d in candidates:
        check = check_step_dir(d)
        if check.ok:
            note = check.note()
            return Selected(step_dir=d, skipped=tuple(skipped), notes=(note,) if note else ())
        more = f" (and {len(check.problems) - 1} more problem(s))" if len(check.problems) > 1 else ""
        skipped.append(f"skipped {d.name}: {check.problems[0]}{more}")
        problems += [f"{d.name}: {p}" for p in check.problems]
    where = loc.root if loc.root is not None else loc.step_dir
    raise CheckpointError(
        message=(f"no checkpoint in {where} verifies ({len(candidates)} checked): " if len(candidates) > 1 else
                 f"{loc.step_dir} does not verify: ") + problems[0],
        path=str(where), problems=problems[:50],
        hint="the files were damaged after they were written; resume from a copy of an earlier checkpoint, or "
             "start again (`mftk inspect-ckpt DIR --verify` checks one)")


def plan_resume(config: Any, path: str, *, weights_only: bool, params: Mapping[str, tuple[int, ...]],
                world: int = 1, dp: int = 1) -> ResumePlan:
    """Decide the scenario and positions for resuming ``config``'s run (``params``: the model's names and
    shapes) from ``path``; check names and shapes. A checkpoint saved by another number of processes is
    resharded (global tensors → this layout). The checkpoint loaded is the newest one that verifies
    (`select_checkpoint`; this reads every tensor once)."""
    from mftk.ckpt.common import read_common
    from mftk.ckpt.load import hf_weight_files
    from mftk.ckpt.metadata import read_metadata
    from mftk.ckpt.safetensors_io import read_header

    tr = config.training
    gbs, lbs = tr.global_batch_size, tr.local_batch_size
    loc = locate(path)
    if loc.kind == "file":
        raise CheckpointError(message=f"{path} is a single file; resume needs a checkpoint directory", path=str(path),
                              hint="pass the save_path of a run, an iteration_* dir or a Hugging Face weights dir")
    notes: list[str] = []
    if loc.kind == "hf":
        if not weights_only:
            raise CheckpointError(message=f"{path} is a Hugging Face weights dir: it holds no optimizer state",
                                  path=str(path), hint="use --weights-only (no_load_optim: true) to initialise from it")
        names = {n for f in hf_weight_files(loc.step_dir) for n in read_header(f).tensors}
        return ResumePlan(source=str(path), kind="hf", step_dir=str(loc.step_dir), scenario=ResumeScenario.WEIGHTS_ONLY,
                          saved_step=0, saved_global_batch_size=None, global_batch_size=gbs, saved_world=1, world=world,
                          start_step=0, consumed_samples=0, skip_micro_batches=0,
                          loads=("model weights (HF names mapped)",),
                          notes=(f"weights-only init from Hugging Face dir {loc.step_dir} ({len(names)} tensors)",))
    chosen = select_checkpoint(loc)
    if chosen.step_dir != loc.step_dir:
        loc = attrs.evolve(loc, step_dir=chosen.step_dir, step=None)
    notes += chosen.notes
    files = scan_step_dir(loc.step_dir)
    if files.problems:
        raise CheckpointError(message=f"{loc.step_dir}: inconsistent rank files", path=str(loc.step_dir),
                              problems=list(files.problems))
    common = read_common(loc.step_dir)
    notes += common.notes()
    if not weights_only and "global_step" in common.missing:
        raise CheckpointError(message=f"{loc.step_dir}/common.json has no global_step: the step to resume from is "
                              "unknown", path=str(loc.step_dir), hint="resume with --weights-only (no_load_optim: true)")
    if missing_ranks := files.missing_model_ranks:
        raise CheckpointError(message=f"{loc.step_dir}: model files of ranks {missing_ranks} are missing "
                              f"(saved by {files.world} processes)", path=str(loc.step_dir))
    if not weights_only and files.missing_opt_ranks:
        raise CheckpointError(message=f"no optimizer file for ranks {files.missing_opt_ranks} in {loc.step_dir}",
                              path=str(loc.step_dir),
                              hint="resume with --weights-only (no_load_optim: true) for a fresh optimizer at step 0")
    if files.world > 1:
        meta = read_metadata(loc.step_dir)
        if meta is None:
            raise CheckpointError(message=f"{loc.step_dir} was saved by {files.world} processes but has no "
                                  "metadata.json, so its shards cannot be put together", path=str(loc.step_dir))
        shapes = {n: t.global_shape for n, t in meta.items() if not is_optimizer_name(n)}
        if files.world != world:
            notes.append(f"Resharding: saved by {files.world} processes, loading into {world}; global tensors "
                         "are assembled from metadata.json and cut for this layout")
    else:
        shapes = {n: tuple(h.shape) for n, h in read_header(files.model[0]).tensors.items()}
        if world > 1:
            notes.append(f"Resharding: saved by 1 process, loading into {world}")
    from mftk.ckpt.lora import optional_names

    optional, why = optional_names(params, shapes)
    if why and any(n not in shapes for n in optional):
        notes.append(why)
    missing = tuple(sorted(n for n in params if n not in shapes and not optional_buffer(n) and n not in optional))
    unexpected = tuple(sorted(n for n in shapes if n not in params and not optional_buffer(n)))
    if any(optional_buffer(n) for n in set(params) ^ set(shapes)):
        notes.append("max_logits_val: tracking differs from the saved run; the running max starts from 0")
    mismatched = tuple(f"{n}: model {params[n]}, checkpoint {shapes[n]}" for n in sorted(params)
                       if n in shapes and tuple(shapes[n]) != tuple(params[n]))
    saved_step, saved_gbs = common.step, common.global_batch_size
    loads = ["model weights"]
    if weights_only:
        scenario, start, consumed = ResumeScenario.WEIGHTS_ONLY, 0, 0
        notes.append("no_load_optim=True: refreshing fp32 master weights from loaded model params.")
    else:
        states = "muon_m, adam_m, adam_v" if config.optimizer.type == "Muon" else "adam_m, adam_v"
        loads += [f"optimizer states ({states}, global_step)"]
        consumed = common.consumed_samples if common.consumed_samples is not None else saved_step * (saved_gbs or gbs)
        if tr.rampup_batch_size or not saved_gbs or saved_gbs == gbs:
            scenario, start = ResumeScenario.STANDARD, saved_step
        else:
            scenario, start = ResumeScenario.BATCH_CHANGED, int(saved_step * saved_gbs / gbs)
            notes.append(f"Scaled global step: {saved_step} -> {start} (batch size changed from {saved_gbs} to {gbs}); "
                         "training.steps and the LR schedule's total steps are not rescaled")
            notes.append(f"LR position: the optimizer keeps its own step counter {saved_step} (as the reference "
                         "does), so the LR schedule and Adam's bias correction continue from it")
        if files.state.get(0) is not None:
            loads += ["mftk extra state (RNG, data position)"]
    skip = skip_micro_batches(consumed, dp, lbs)
    if not weights_only:
        notes.append(f"Resume from {loc.step_dir}: step {saved_step} -> start at step {start}, "
                     f"consumed_samples={consumed}, skip {skip} micro-batches")
    return ResumePlan(source=str(path), kind="mf", step_dir=str(loc.step_dir), scenario=scenario,
                      saved_step=saved_step, saved_global_batch_size=saved_gbs, global_batch_size=gbs,
                      saved_world=files.world, world=world, start_step=start, consumed_samples=consumed,
                      skip_micro_batches=skip, loads=tuple(loads), notes=tuple(notes), missing=missing,
                      unexpected=unexpected, mismatched=mismatched, common_extra=dict(common.extra),
                      skipped=chosen.skipped)


def starts_weights_only(config: Any, weights_only: bool, kind: str | None = None) -> bool:
    """Whether a start loads weights alone (step 0, fresh optimizer): ``--weights-only``, ``checkpoint.no_load_optim``,
    or a Hugging Face dir (``kind`` "hf": it holds no optimizer state). The one answer for the planner, the
    save-path guard and the msrun parent."""
    return weights_only or config.checkpoint.no_load_optim or kind == "hf"


def continues_in(plan: ResumePlan | None, save_path: str | os.PathLike) -> bool:
    """The run goes on with the checkpoints of ``save_path``: it resumes (not weights-only) from a dir in it."""
    return (plan is not None and plan.scenario != ResumeScenario.WEIGHTS_ONLY
            and Path(plan.step_dir).parent.resolve() == Path(save_path).resolve())


def source_step(plan: ResumePlan) -> int | None:
    """The step of the ``iteration_*`` dir a run resumed from (None for any other dir): the one dir its saves
    must never replace (`Checkpointer.source_step`)."""
    return parse_iteration_dir_name(Path(plan.step_dir).name) if plan.kind == "mf" else None


def check_target_step(plan: ResumePlan, steps: int) -> None:
    """A resume whose ``training.steps`` (the absolute target) is below the step it starts from is refused:
    there is nothing to train, and the summary would read "trained steps 4..4 of 2"."""
    if plan.start_step <= steps:
        return
    problem = Problem(path="training.steps", value=steps,
                      message=f"{steps} is below the step this resume starts from ({plan.start_step}, "
                              f"{plan.step_dir}): nothing to train",
                      hint=f"training.steps is the absolute target step: set it above {plan.start_step} "
                           f"(e.g. --set training.steps={plan.start_step + steps})")
    raise ConfigError(message=problem.render(), problems=[problem])


def saved_architecture(plan: ResumePlan, current: Any) -> tuple[Any, list[str]]:
    """The ``model:`` section a checkpoint was saved with (typed) and the keys where it differs from ``current``."""
    if plan.kind != "mf":
        return None, []
    # lazy: the config model costs ~1 s of imports; `inspect-ckpt` imports this module for `ResumeScenario` alone
    from mftk.config.load import build_model_section
    from mftk.config.report import resolved

    section, _ = saved_model_section(plan.step_dir, plan.saved_world)
    if section is None:
        return None, []
    saved, problems = build_model_section(dict(section))
    if saved is None or any(p.severity == "error" for p in problems):
        return None, []
    a, b = resolved(current), resolved(saved)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return saved, [f"model.{k}: YAML {a.get(k)!r}, checkpoint {b.get(k)!r}" for k in keys]


@attrs.frozen
class Architecture:
    """Which ``model:`` a resume trains: the YAML's, or the checkpoint's saved one; and the plan for it."""

    config: Any  # the run's config, its model: section the one trained
    plan: ResumePlan
    warnings: tuple[str, ...] = ()
    from_checkpoint: bool = False  # the checkpoint's architecture replaced the YAML's


def fit_architecture(config: Any, plan: ResumePlan, *, replan: Callable[[Any], ResumePlan],
                     model_from_checkpoint: bool) -> Architecture:
    """The architecture a resume trains. When the YAML's model does not fit the checkpoint (``plan.problems``)
    but the checkpoint's saved config does (``replan``: the plan for a config with that ``model:``), the
    differing fields are an error, unless ``model_from_checkpoint`` asks for the checkpoint's architecture
    (issue 35: it used to be taken silently, so a Qwen3 YAML trained a DeepSeek-V3 checkpoint). Differing fields
    that do not change the fit are a warning. A dry run decides the same way."""
    saved, differences = saved_architecture(plan, config.model)
    if plan.problems and saved is not None:
        candidate = attrs.evolve(config, model=saved)
        replanned = replan(candidate)
        if not replanned.problems:
            if not model_from_checkpoint:
                raise CheckpointError(
                    message=f"the model: section differs from the checkpoint's ({plan.step_dir}, saved config): "
                            f"{plural(len(differences), 'field')}", path=plan.step_dir, problems=differences,
                    hint="make the model: section match the checkpoint, or resume with `mftk resume "
                         "--model-from-checkpoint` to train the checkpoint's architecture")
            return Architecture(candidate, replanned, ("the model: section does not fit the checkpoint; its "
                                                       "architecture is taken from the checkpoint's saved config "
                                                       f"({'; '.join(differences)})",), from_checkpoint=True)
    elif differences:
        return Architecture(config, plan, ("model: keys differ from the checkpoint's saved config (the YAML's are "
                                           "used): " + "; ".join(differences),))
    return Architecture(config, plan)


def skipped_warnings(plan: ResumePlan) -> list[str]:
    """Damaged newer checkpoints passed over (`select_checkpoint`), each with the dir the resume loads instead."""
    return [f"{n}; resuming from {Path(plan.step_dir).name}" for n in plan.skipped]


def saved_schedule(plan: ResumePlan) -> tuple[dict, int] | None:
    """The saved run's ``lr_scheduler`` section and ``training.steps`` (its resolved config), for the LR-jump
    check (`engine.schedule.lr_change_at_resume`); None for a weights-only start or when the config is not saved."""
    if plan.kind != "mf" or plan.scenario == ResumeScenario.WEIGHTS_ONLY:
        return None
    saved = read_run_config(plan.step_dir) or {}
    section, steps = saved.get("lr_scheduler"), (saved.get("training") or {}).get("steps")
    if not isinstance(section, dict) or not isinstance(steps, int):
        return None
    return section, steps
