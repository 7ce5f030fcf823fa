"""`profiler`: MindSpore's profiler over training steps ``start_step..end_step`` (reference §5.2).

Steps are counted 1-based from the start of *this run* (after a resume at step 100, ``start_step: 2``
is the run's second step, global step 102), as in the reference. Output goes to
``<output_path>/rank_<id>`` (``<cwd>/profile/rank_<id>`` when ``output_path`` is null), in
MindSpore's own layout: one ``<host>_<pid>_<time>_ascend_ms/`` directory holding
``ASCEND_PROFILER_OUTPUT/trace_view.json`` (Chrome trace) and ``FRAMEWORK/cpu_op_*`` files on CPU.

It is a `StepSink`: the window opens when step ``start_step − 1`` has been reported (or before the
loop when ``start_step`` is 1) and closes when step ``end_step`` has been reported, or at `close`
when the run ends earlier (error, SIGTERM, ``training.steps`` reached). A checkpoint saved at step
``start_step − 1`` therefore lands in the trace; one saved at ``end_step`` does not. The reference
instead drives a torch-like ``schedule(skip_first=start_step)`` with an extra ``step()`` at start.

Profiling is diagnostic: a profiler that fails to start or writes nothing logs a warning and the
run carries on (MindSpore's own start/stop swallow their exceptions, so the output is checked).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from mftk.progress import BaseSink

log = logging.getLogger("mftk.train")

_LEVELS = {0: "Level0", 1: "Level1", 2: "Level2"}


def profiler_dir(output_path: str | None, rank: int, cwd: str | None = None) -> Path:
    """``<output_path>/rank_<id>``, or ``<cwd>/profile/rank_<id>`` when ``output_path`` is null/empty."""
    root = Path(output_path) if output_path else Path(cwd or os.getcwd()) / "profile"
    return root / f"rank_{rank}"


def wants_profiler(cfg: Any, rank: int) -> bool:
    """``enable_profiling`` and this rank in ``profiler_rank`` (null: every rank)."""
    return bool(cfg.enable_profiling) and (cfg.profiler_rank is None or rank in cfg.profiler_rank)


def _mindspore_profile(cfg: Any, out_dir: Path, steps: int) -> Any:
    """A not-yet-started ``mindspore.profiler.profile`` recording ``steps`` steps into ``out_dir``."""
    from mindspore import profiler as P
    from mindspore.profiler import ProfilerActivity, ProfilerLevel

    level = _LEVELS.get(cfg.profiler_level)
    if level is None:
        log.warning("profiler.profiler_level=%s is not 0, 1 or 2; LevelNone is used", cfg.profiler_level)
        level = "LevelNone"
    activities = [ProfilerActivity.CPU] if cfg.profile_cpu else []
    return P.profile(activities=activities, with_stack=bool(cfg.with_stack), profile_memory=bool(cfg.profile_memory),
                     start_profile=False,
                     schedule=P.schedule(wait=0, warmup=0, active=steps, repeat=1, skip_first=0),
                     on_trace_ready=P.tensorboard_trace_handler(str(out_dir)),
                     experimental_config=P._ExperimentalConfig(profiler_level=getattr(ProfilerLevel, level),
                                                               mstx=bool(cfg.mstx)))


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """MindSpore's trace parser prints a progress bar on fd 1 (from a child process); the library
    must not write to stdout (``--json`` output goes there), so fd 1 points at fd 2 meanwhile."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class StepProfiler(BaseSink):
    """Starts and stops the profiler around the run's steps ``start_step..end_step``."""

    def __init__(self, cfg: Any, *, rank: int = 0, cwd: str | None = None,
                 factory: Callable[[Any, Path, int], Any] = _mindspore_profile) -> None:
        self.start_step, self.end_step = int(cfg.start_step), int(cfg.end_step)
        self.out_dir = profiler_dir(cfg.output_path, rank, cwd)
        self._cfg, self._factory = cfg, factory
        self._prof: Any = None
        self._seen = 0  # steps reported in this run
        self.done = False
        self.ok: bool | None = None  # None: never ran; then whether output was written
        log.info("Profiler initialized: start_step=%d, end_step=%d, profile_memory=%s, profiler_level=%s",
                 self.start_step, self.end_step, cfg.profile_memory, cfg.profiler_level)
        if self.start_step <= 1:
            self._start()

    def _start(self) -> None:
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._prof = self._factory(self._cfg, self.out_dir, self.end_step - self.start_step + 1)
            self._prof.start()
        except Exception as exc:  # noqa: BLE001 — profiling must never stop training
            log.warning("Profiler could not start (%s: %s); training continues without profiling",
                        type(exc).__name__, exc)
            self._prof, self.done, self.ok = None, True, False
            return
        log.info("Profiler started.")

    def _stop(self) -> None:
        prof, self._prof, self.done = self._prof, None, True
        if prof is None:
            return
        try:
            with _stdout_to_stderr():
                if self._seen >= self.end_step:
                    prof.step()  # closes the schedule's last active step
                prof.stop()  # (early, at close: stops mid-window; what was recorded is still written)
        except Exception as exc:  # noqa: BLE001
            log.warning("Profiler failed while stopping (%s: %s); its output in %s may be incomplete",
                        type(exc).__name__, exc, self.out_dir)
            self.ok = False
            return
        self.ok = any(self.out_dir.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json"))
        if self.ok:
            log.info("Profiler stopped. Output: %s", self.out_dir)
        else:
            log.warning("Profiler stopped but wrote no trace under %s (MindSpore's profiler reports its own errors "
                        "in its log); training continues", self.out_dir)

    def on_step(self, metrics: dict[str, Any]) -> None:
        if self.done:
            return
        self._seen += 1
        if self._prof is None and self._seen == self.start_step - 1:
            self._start()
        elif self._prof is not None:
            if self._seen >= self.end_step:
                self._stop()
            else:
                self._prof.step()

    def close(self) -> None:
        if self._prof is not None:
            self._stop()
