"""`mftk resume`: continue (or initialise) training from a checkpoint; the same loop as `mftk train`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from commands._options import ConfigArg, DeviceOpt, JsonOpt, NprocOpt, OutputDirOpt, SetOpt, with_device
from commands.train import (HangTimeoutOpt, JoinOpt, LogDirOpt, MasterAddrOpt, MasterPortOpt, MaxRestartsOpt, NewRunOpt,
                            NnodesOpt, NodeRankOpt)

EPILOG = """Examples:

  mftk resume templates/qwen3_tiny.yaml                      # from checkpoint.load_path or save_path

  mftk resume my.yaml --from ./ckpt/iteration_00000010 --set training.steps=40

  mftk resume my.yaml --from ./hf_weights --weights-only     # step 0, fresh optimizer

  mftk resume my.yaml --dry-run                              # what would load, without loading

  mftk resume my.yaml --nproc 2                              # any number of workers: shards are re-cut

training.steps stays the absolute target step (below the checkpoint's step: an error). A changed
global_batch_size rescales the step to int(step·old/new) and keeps consumed_samples. A model: section
that differs from the checkpoint's saved config is an error listing the fields; --model-from-checkpoint
trains the checkpoint's architecture instead (a --dry-run decides the same way).
"""

FromOpt = Annotated[Optional[Path], typer.Option(
    "--from", help="Save root (latest via the tracker), an iteration_XXXXXXXX dir, or a Hugging Face weights dir.")]
WeightsOnlyOpt = Annotated[bool, typer.Option(
    "--weights-only", help="Load weights only: step 0, fresh optimizer (no_load_optim: true).")]
ModelFromCheckpointOpt = Annotated[bool, typer.Option(
    "--model-from-checkpoint", help="When the YAML's model: differs from the checkpoint's saved config, train the "
    "checkpoint's architecture (without it, that is an error listing the differing fields).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show what would be loaded and where training continues; load nothing.")]


def resume(config: ConfigArg, from_: FromOpt = None, weights_only: WeightsOnlyOpt = False, dry_run: DryRunOpt = False,
           overrides: SetOpt = None, output_dir: OutputDirOpt = None, nproc: NprocOpt = 1,
           nnodes: NnodesOpt = 1, node_rank: NodeRankOpt = 0, master_addr: MasterAddrOpt = "127.0.0.1",
           master_port: MasterPortOpt = None, log_dir: LogDirOpt = None, join: JoinOpt = True,
           json_out: JsonOpt = False, new_run: NewRunOpt = False, device: DeviceOpt = None,
           model_from_checkpoint: ModelFromCheckpointOpt = False,
           max_restarts: MaxRestartsOpt = 0, hang_timeout: HangTimeoutOpt = None) -> None:
    """Resume training from a checkpoint (bit-exact with mftk's own checkpoints; reshards to this layout)."""
    from commands.train import launcher_spec, run_command

    overrides = with_device(overrides, device)
    source = from_ or _default_source(config, overrides)
    result = run_command(config, overrides, output_dir, resume_from=source, weights_only=weights_only,
                         dry_run=dry_run, new_run=new_run, model_from_checkpoint=model_from_checkpoint,
                         max_restarts=max_restarts,
                         launcher=launcher_spec(nproc, nnodes, node_rank, master_addr, master_port, log_dir, join,
                                                hang_timeout))
    if dry_run:
        plan = result.resume
        _render_plan(plan, result.total_steps, json_out, [n for n in result.notes if n not in plan.notes])
        if plan.missing or plan.unexpected or plan.mismatched:
            from mftk.errors import CheckpointError

            raise CheckpointError(message=f"{plan.step_dir} does not fit the model; a resume would be refused",
                                  path=plan.step_dir, hint="check that the model: section matches the checkpoint")


def _default_source(config: Path, overrides: Optional[list[str]]) -> Optional[Path]:
    """``checkpoint.load_path``, else ``checkpoint.save_path`` (a run continuing itself)."""
    from mftk.config.load import load_config
    from mftk.errors import InputError

    ck = load_config(config, overrides=overrides or [], check_files=False).config.checkpoint
    path = ck.load_path or ck.save_path
    if not path:
        raise InputError(message="nothing to resume from: no --from, checkpoint.load_path or checkpoint.save_path",
                         hint="pass --from PATH")
    return Path(path)


def _render_plan(plan, total_steps: int, json_out: bool, run_notes: list[str]) -> None:
    """The plan as a table; ``run_notes`` are the run's warnings about it (an LR jump, a changed model)."""
    import attrs

    from commands._render import add_row, print_json, print_table, table

    if json_out:
        print_json(attrs.asdict(plan) | {"warnings": run_notes})
        return
    from mftk.ckpt.resume import ResumeScenario

    scenario = ResumeScenario(plan.scenario)
    t = table("what", "value", title=f"resume plan: scenario {scenario.value} ({scenario.title})", show_header=False)
    rows = [("source", f"{plan.step_dir} ({plan.kind})"), ("saved step", str(plan.saved_step)),
            ("global batch size", f"{plan.saved_global_batch_size} -> {plan.global_batch_size}"),
            ("world", f"{plan.saved_world} -> {plan.world}"),
            ("start step", f"{plan.start_step} (target {total_steps})"),
            ("consumed samples", str(plan.consumed_samples)),
            ("micro-batches skipped", str(plan.skip_micro_batches)), ("loads", ", ".join(plan.loads))]
    rows += [("missing", ", ".join(plan.missing) or "none"), ("unexpected", ", ".join(plan.unexpected) or "none")]
    rows += [("mismatched", m) for m in plan.mismatched]
    rows += [("note", n) for n in plan.notes]
    rows += [("warning", n) for n in run_notes]
    for k, v in rows:
        add_row(t, k, v)
    print_table(t)
