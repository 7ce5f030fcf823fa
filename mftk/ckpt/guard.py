"""Before a run writes into ``checkpoint.save_path``: never take over another run's checkpoints unasked.

A fresh run (or a weights-only start at step 0) pointed at a folder that already holds checkpoints
would overwrite its tracker and, step by step, its ``iteration_*`` dirs — the run the user meant to
``mftk resume`` loses its position. So such a start is refused unless the user says ``--new-run``,
and even then it is refused when one of the existing dirs lies on this run's path (a save would
replace it): mftk never deletes a checkpoint it did not write. A run continuing from a checkpoint
in the same folder is the same run going on; dirs newer than the resumed step are named in a note
(they are replaced when the run reaches their step, as in the reference).

`save_path_notes` is the one check a run makes (in its own process, or an msrun job's parent before any
worker starts); `check_writable` the probe before training.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

from mftk.ckpt.layout import TRACKER, iteration_dir_name, iteration_dirs, locate, parse_iteration_dir_name, read_tracker
from mftk.ckpt.resume import ResumePlan, ResumeScenario, continues_in, source_step, starts_weights_only
from mftk.errors import CheckpointError
from mftk.lock import LockInfo, exclusive_output

SAVE_LOCK_WHAT = "mftk training checkpoints (checkpoint.save_path)"


@contextlib.contextmanager
def hold_save_path(save_path: str | os.PathLike, enabled: bool = True) -> Iterator[LockInfo | None]:
    """The exclusive right to write checkpoints into ``save_path`` for a whole run (`mftk.lock`).

    Two runs saving into one folder would interleave trackers and iteration dirs, and each one's
    retention would count the other's saves. The process that owns the run holds it: a single-process
    run itself; an msrun job's parent on node 0 (it starts before any worker, so a second job is
    refused at once, and ends after the last one, so the lock outlives every save); rank 0 when the
    parent does not wait (``--no-join``). The second run gets an error naming the holder's pid. Yields the
    lock (None when not taken): its ``fd`` can be handed to the processes of the job, so that the lock lives
    as long as any of them.
    """
    if not enabled or not save_path:
        yield None
        return
    try:
        Path(save_path).mkdir(parents=True, exist_ok=True)  # the run needs it; the lock file sits beside it
    except OSError as exc:
        raise CheckpointError(message=f"cannot write checkpoints to {save_path}: {exc.strerror or exc}",
                              path=str(save_path), hint="set checkpoint.save_path to a writable directory, or "
                              "enable_save: false") from None
    with exclusive_output(os.path.realpath(save_path), SAVE_LOCK_WHAT) as lock:  # one lock however it is spelt
        yield lock


def check_save_path(save_path: str | os.PathLike, *, resume_dir: str | os.PathLike | None, weights_only: bool,
                    new_run: bool, total_steps: int) -> list[str]:
    """Refuse (CheckpointError) to start a run over another run's checkpoints; return notes for a continuing run.

    ``resume_dir`` is the step dir the run loads (None for a fresh run); ``weights_only`` starts at step 0.
    """
    root = Path(save_path)
    steps = list(iteration_dirs(root))
    try:
        tracked = read_tracker(root)
    except CheckpointError:
        tracked = None
    if not steps and tracked is None:
        return []
    continuing = (resume_dir is not None and not weights_only
                  and Path(resume_dir).resolve().parent == root.resolve())
    if continuing:
        resumed = parse_iteration_dir_name(Path(resume_dir).name)
        newer = [s for s in steps if resumed is not None and s > resumed]
        if not newer:
            return []
        return [f"{root} holds checkpoints newer than the resumed step {resumed}: "
                + ", ".join(iteration_dir_name(s) for s in newer)
                + "; each is replaced when this run saves the same step"]
    newest = max([*steps, *([tracked] if tracked is not None else [])])
    where = f"{iteration_dir_name(newest)}" if newest in steps else f"{TRACKER} names step {newest}"
    if not new_run:
        if resume_dir is None:
            start = "a fresh run would begin at step 0 and overwrite its tracker"
        elif weights_only:
            start = "a weights-only start would begin at step 0 and overwrite its tracker"
        else:
            start = (f"a run resumed from {resume_dir}, outside that folder, would save its steps there and "
                     "move its tracker")
        raise CheckpointError(
            message=f"checkpoint.save_path {root} already holds checkpoints (newest: step {newest}, {where}); "
                    f"{start}",
            path=str(root),
            hint="continue that run with `mftk resume CONFIG`; to start a new run in the same folder pass --new-run "
                 "(the existing iteration dirs are kept); or set checkpoint.save_path to a new directory")
    clash = [s for s in steps if 0 < s <= total_steps]
    if clash:
        names = ", ".join(iteration_dir_name(s) for s in clash[:5]) + (" ..." if len(clash) > 5 else "")
        raise CheckpointError(
            message=f"--new-run: {root} holds {names}, which this run (steps 1..{total_steps}) could overwrite; "
                    "mftk never deletes checkpoints it did not write",
            path=str(root), hint="move those iteration dirs away, or set checkpoint.save_path to a new directory")
    return [f"--new-run: starting a new run in {root}; the tracker will point at this run's checkpoints, the "
            f"{len(steps)} existing iteration dir(s) are kept"]


def save_path_notes(config: Any, *, new_run: bool, plan: ResumePlan | None = None,
                    source: str | os.PathLike | None = None, weights_only: bool = False) -> list[str]:
    """`check_save_path` for a run of ``config`` (nothing when it saves nothing); its notes for the run.

    A run in this process knows its resume ``plan``; an msrun job's parent checks before any worker has planned,
    from the resume ``source``'s location alone (``weights_only`` as given; `ckpt.resume.starts_weights_only`).
    With a plan, a run that starts below the step it resumes from in its own folder is told that the dir is kept.
    """
    ck = config.checkpoint
    if not ck.enable_save:
        return []
    if plan is None:
        located = locate(source) if source else None
        return check_save_path(ck.save_path, resume_dir=located.step_dir if located else None, new_run=new_run,
                               weights_only=starts_weights_only(config, weights_only, located and located.kind),
                               total_steps=config.training.steps)
    notes = check_save_path(ck.save_path, resume_dir=plan.step_dir, new_run=new_run, total_steps=config.training.steps,
                            weights_only=plan.scenario == ResumeScenario.WEIGHTS_ONLY)
    source = source_step(plan) if continues_in(plan, ck.save_path) else None
    if source is not None and plan.start_step < source <= config.training.steps:
        name = Path(plan.step_dir).name
        notes.append(f"this run starts at step {plan.start_step}, below {name}, the checkpoint it resumes from; when "
                     f"it saves step {source} again, {name} is kept as {name}.resume-source (never replaced)")
    return notes


def check_writable(save_path: str) -> None:
    """Fail before training, not at the first save, when checkpoints cannot be written."""
    root = Path(save_path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".mftk-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(message=f"cannot write checkpoints to {root}: {exc.strerror or exc}", path=str(root),
                              hint="set checkpoint.save_path to a writable directory, or enable_save: false") from None
