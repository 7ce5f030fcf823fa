"""The parent's hang watchdog: a rank whose progress (`engine.heartbeat`) has not changed for the hang timeout
ends the job, with every worker's Python stack in its log and a message naming the ranks that stopped.

Who is blamed: when one rank stops, its peers soon wait for it inside a collective and make no progress
either. So the ranks at fault are those stopped by a signal (their state is ``T``), else those not waiting in
a collective; only when every silent rank waits in one (a rank on another node stopped, or a deadlock) are
they all named.

The timeout: ``--hang-timeout`` / ``mftk.hang_timeout_s`` when given; else derived from what this job
measured: ``max(DEFAULT_MIN_S, STEP_FACTOR × the slowest step, 2 × the start-up)``. Before a rank's first step
(until it has finished one step of its own: the first step compiles and warms up) the limit is at least
`STARTUP_MIN_S` (loading a large checkpoint makes no step progress; a start-up that truly hangs is ended by
msrun's own ``cluster_time_out``).
"""
from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

from mftk.engine.heartbeat import heartbeat_path, progress_key, read_heartbeat
from mftk.errors import JobFault

DEFAULT_MIN_S = 60.0
STEP_FACTOR = 10.0
STARTUP_MIN_S = 300.0
STACK_SIGNAL = signal.SIGUSR1  # workers dump every thread's Python stack on it (faulthandler.register)
STACK_WAIT_S = 2.0


class Watchdog:
    """Tracks the local ranks' progress; `check` returns the ranks at fault once one has been silent too long."""

    def __init__(self, log_dir: Path, ranks: list[int], timeout_s: float | None, started: float) -> None:
        self.log_dir, self.ranks, self.explicit = Path(log_dir), list(ranks), timeout_s
        self.started = started
        self.last: dict[int, tuple[Any, float]] = {}  # rank -> (progress key, when it last changed)
        self.records: dict[int, dict[str, Any]] = {}
        self.step_at: dict[int, tuple[int, float]] = {}  # rank -> (last step, when it was seen)
        self.slowest_step_s = 0.0
        self.startup_s: float | None = None
        self.fault: JobFault | None = None
        self.done: set[int] = set()  # ranks that reported done (as of the last poll)

    def timeout_s(self) -> float:
        if self.explicit is not None:
            return float(self.explicit)
        return max(DEFAULT_MIN_S, STEP_FACTOR * self.slowest_step_s, 2.0 * (self.startup_s or 0.0))

    def poll(self, now: float, done: set[int]) -> list[int]:
        """Read every heartbeat; the ranks silent past their limit (empty when all is well)."""
        silent = []
        self.done = set(done)
        for rank in self.ranks:
            rec = read_heartbeat(heartbeat_path(self.log_dir, rank))
            if rec is None:
                continue
            self.records[rank] = rec
            key = progress_key(rec)
            if rank not in self.last or self.last[rank][0] != key:
                self.last[rank] = (key, now)
                if int(rec.get("steps_done") or 0) > 0:  # the first step (compiling, warming up) is start-up too
                    self._note_step(rank, int(rec.get("step") or 0), now)
            if rank in done:
                continue
            limit = self.timeout_s() if rank in self.step_at else max(self.timeout_s(), STARTUP_MIN_S)
            if now - self.last[rank][1] > limit:
                silent.append(rank)
        return silent

    def _note_step(self, rank: int, step: int, now: float) -> None:
        prev = self.step_at.get(rank)
        if prev is not None and prev[0] == step:
            return
        if prev is None:
            self.startup_s = max(self.startup_s or 0.0, now - self.started)
        else:
            self.slowest_step_s = max(self.slowest_step_s, (now - prev[1]) / max(step - prev[0], 1))
        self.step_at[rank] = (step, now)

    def reached(self) -> int | None:
        """The last step any local rank finished (re-read from disk: the job may have just ended)."""
        steps = [s for s in (self.last_step(r) for r in self.ranks) if s is not None]
        for rank in self.ranks:
            rec = read_heartbeat(heartbeat_path(self.log_dir, rank))
            if rec is not None and isinstance(rec.get("step"), int):
                steps.append(rec["step"])
        return max(steps) if steps else None

    def last_step(self, rank: int, fresh: bool = False) -> int | None:
        """The last step ``rank`` finished, as last polled (``fresh``: as on disk now)."""
        rec = read_heartbeat(heartbeat_path(self.log_dir, rank)) if fresh else None
        rec = rec or self.records.get(rank)
        return int(rec["step"]) if rec and "step" in rec else None

    def blame(self, silent: list[int], states: dict[int, str], now: float) -> list[int]:
        """The ranks at fault among those silent past the limit and those nearly so (which crosses the limit
        first is up to a second of heartbeat timing: the stopped rank and the peer waiting for it go quiet
        together)."""
        near = [r for r, (_, t) in self.last.items() if r not in self.done and now - t >= 0.5 * self.timeout_s()]
        candidates = sorted(set(silent) | set(near))
        stopped = [r for r in candidates if states.get(r) == "stopped"]
        if stopped:
            return stopped
        busy = [r for r in candidates if (self.records.get(r) or {}).get("phase") != "collective"]
        return busy or silent

    def hang_fault(self, silent: list[int], states: dict[int, str], now: float, logs: dict[int, Path]) -> JobFault:
        """The error naming the ranks that stopped, the last step each finished, and where the stacks are."""
        culprits = self.blame(silent, states, now)
        parts = []
        for r in culprits:
            how = "is stopped by a signal (SIGSTOP?)" if states.get(r) == "stopped" else "stopped making progress"
            phase = (self.records.get(r) or {}).get("phase", "?")
            parts.append(f"rank {r} {how}: last finished step {self.last_step(r)}, no progress for "
                         f"{now - self.last[r][1]:.0f} s (in: {phase})")
        waiting = [r for r in self.ranks if r not in culprits and (self.records.get(r) or {}).get("phase") == "collective"]
        text = "; ".join(parts)
        if waiting:
            text += "; " + ", ".join(f"rank {r}" for r in waiting) + " waited for it in a collective"
        where = ", ".join(str(logs[r]) for r in sorted(logs))
        return JobFault(message=f"hang detected (no progress for {self.timeout_s():.0f} s, the hang timeout): {text}",
                        hint=f"every worker's Python stack is in its log ({where}); raise --hang-timeout "
                        "(mftk.hang_timeout_s) if the steps are legitimately this slow",
                        step=self.reached(), kind="hang", ranks=culprits)


_COLLECTIVE_FAILED = re.compile(r"\b(all_?reduce|all_?gather|broadcast|reduce_?scatter|all_?to_?all|send|recv|"
                                r"barrier)\w*\s+failed", re.IGNORECASE)


def is_collective_failure(text: str) -> bool:
    """True for MindSpore's ``AllReduce failed.``-style errors: what a rank reports when a peer it was exchanging
    with stopped or died (mindspore-cpu.md §4) -- a fault of the job, not of this rank's input."""
    return bool(_COLLECTIVE_FAILED.search(text))


def process_states(pids: dict[int, int]) -> dict[int, str]:
    """rank -> "running" | "stopped" | "dead" for the workers whose pid is known (``pids``: pid -> rank)."""
    import psutil

    out = {}
    for pid, rank in pids.items():
        try:
            st = psutil.Process(pid).status()
        except psutil.Error:
            out[rank] = "dead"
            continue
        out[rank] = {psutil.STATUS_ZOMBIE: "dead", psutil.STATUS_DEAD: "dead",
                     psutil.STATUS_STOPPED: "stopped", psutil.STATUS_TRACING_STOP: "stopped"}.get(st, "running")
    return out


def dump_stacks(pids: dict[int, int], states: dict[int, str]) -> None:
    """Ask every live worker to write its Python stacks into its log; a stopped one is continued to do it."""
    for pid, rank in pids.items():
        if states.get(rank) == "dead":
            continue
        try:
            os.kill(pid, STACK_SIGNAL)
            if states.get(rank) == "stopped":
                os.kill(pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
