"""Multi-process jobs through MindSpore's own `msrun`, and the worker entry point it starts.

Parent side (`launch`): builds the `msrun` command (`python -m mftk.engine.launch worker ...` as
the task, so no Typer and no script path tricks), runs it in its own session, follows rank 0's
`worker_<rank>.log` line by line into a callback, and watches every local worker log for the
failure marker the worker entry writes. msrun alone is too slow to report a failure: after a
worker dies it kills the others but then waits ~30 s for the scheduler's heartbeat timeout
(mindspore-cpu.md §4). So on the first failure the launcher kills the whole process tree itself
and raises `TrainingError` with that rank's last error lines within seconds.

Ownership (`engine.ownership`): msrun is started through ``python -m mftk.engine.launch msrun``, which ties it to
this process with a parent-death signal and lets the scheduler and workers inherit the save path's lock; each
of them dies with msrun in turn, and `end_job` sweeps up by job id whatever is left, so nothing of the job
outlives the parent, however the parent or msrun ends. They inherit the job's port claim (`engine.ports`) the
same way, so no other mftk job on the machine starts on its ports while any of them lives. Hangs
(`engine.watchdog`): each worker keeps a progress file (`engine.heartbeat`); a rank silent past the hang timeout
ends the job with every worker's Python stack in its log and the stopped ranks named (`JobFault`, which
`--max-restarts` relaunches on, `engine.workers`).

Signals: msrun runs in its own session and each worker in its own, so neither a terminal's Ctrl-C nor a
``kill`` of the parent reaches them; and msrun's own SIGINT handler SIGKILLs every worker. So while it
supervises, the parent catches SIGTERM/SIGINT itself and forwards SIGTERM to every worker (those that
announce themselves later too, so a signal during start-up is not lost), never to msrun or the
scheduler. The workers stop together after their current step, save, and report it; the parent then
raises `TrainingInterrupted` (exit 75) with the saved step. A second Ctrl-C stops the tree at once.

Worker side (`python -m mftk.engine.launch worker --target pkg.mod:fn --payload file.json`):
initialises the `mccl` collective backend, patches the send/recv default-group bug, calls
``fn(**payload)`` and writes its JSON-able return value to ``result_<rank>.json``. A signal that
arrives before the target installs its own handler is kept (`take_pending_signal`). A
`TrainingInterrupted` (the target saved and stopped on a signal) is a clean stop: it goes to
``stopped_<rank>.json`` with a marker and the worker exits 0, so msrun does not kill the ranks still
saving. A library error (`MftkError`: the user's, not a bug) goes to ``error_<rank>.json`` and the parent
raises it as it is, with the message and exit code one process would give. Any other exception prints
the traceback; either way a one-line marker follows and the worker hard-exits so no rank hangs in
finalisation.
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable

import attrs

from mftk.engine.heartbeat import BEAT, heartbeat_path
from mftk.engine.ownership import JOB_ENV, PARENT_ENV, end_job, own_by_parent
from mftk.engine.ports import PortClaim, claim_free_range, claim_master_port
from mftk.engine.watchdog import (STACK_SIGNAL, STACK_WAIT_S, Watchdog, dump_stacks, is_collective_failure,
                                  process_states)
from mftk.errors import InputError, JobFault, MftkError, TrainingError, TrainingInterrupted
from mftk.files import write_atomic

START_MARK = "MFTK_WORKER_START"
DONE_MARK = "MFTK_WORKER_DONE"
ERROR_MARK = "MFTK_WORKER_ERROR"
STOPPED_MARK = "MFTK_WORKER_STOPPED"  # stopped by a signal after saving (stopped_<rank>.json says where)
_ERROR_TAIL_LINES = 24
_POLL_S = 0.2

LineCallback = Callable[[str], None]


@attrs.frozen(kw_only=True)
class LaunchSpec:
    """Where and how many: the `msrun` flags of one node of a job."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: pick a free one (single node only)
    log_dir: Path | None = None  # None: a fresh temporary directory
    join: bool = True
    cluster_time_out_s: int = 120
    kill_grace_s: float = 3.0  # SIGTERM → SIGKILL delay when the user interrupts
    hang_timeout_s: float | None = None  # None: derived from the measured step and start-up times (`Watchdog`)

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes


@attrs.frozen(kw_only=True)
class LaunchResult:
    """What a finished (or detached, with ``join=False``) job left behind."""

    log_dir: Path
    master_port: int
    world: int
    returncode: int
    elapsed_s: float
    worker_logs: dict[int, Path]
    results: dict[int, Any]  # rank -> the target's JSON return value (local ranks only)
    detached: bool = False


# ---------------------------------------------------------------- parent side


def launch(target: str, payload: dict[str, Any] | None = None, *, spec: LaunchSpec,
           on_line: LineCallback | None = None, timeout_s: float | None = None,
           env: dict[str, str] | None = None, follow_rank: int | None = None,
           keep_fds: tuple[int, ...] = ()) -> LaunchResult:
    """Run ``target`` (``"pkg.module:function"``) on every worker of ``spec`` through msrun.

    ``payload`` must be JSON-serialisable; each worker calls ``function(**payload)``. The log lines of
    ``follow_rank`` (default rank 0 on the node holding it, else this node's first rank) go to ``on_line``.
    Raises `TrainingError` when a worker fails or ``timeout_s`` passes, `JobFault` when a worker died or a
    rank hung (the watchdog, ``spec.hang_timeout_s``); nothing of the job is left running when it returns.
    ``keep_fds`` (the save path's lock) are inherited by the msrun launcher, so that the lock stays held
    while it lives even if this process is killed.
    """
    _check_spec(spec, target)
    with _claim_ports(spec) as claim:  # held by msrun's processes too, until the job's last one is gone
        return _run_job(target, payload, spec, claim, on_line=on_line, timeout_s=timeout_s, env=env,
                        follow_rank=follow_rank, keep_fds=keep_fds)


def _run_job(target: str, payload: dict[str, Any] | None, spec: LaunchSpec, claim: PortClaim, *,
             on_line: LineCallback | None, timeout_s: float | None, env: dict[str, str] | None,
             follow_rank: int | None, keep_fds: tuple[int, ...]) -> LaunchResult:
    """`launch`'s job on ``claim``'s port range, which the job's processes inherit."""
    log_dir = Path(spec.log_dir) if spec.log_dir is not None else Path(tempfile.mkdtemp(prefix="mftk-msrun-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    _clear_old_outputs(log_dir)
    port = claim.port
    payload_path = log_dir / "launch_payload.json"
    write_atomic(payload_path, json.dumps(payload or {}))
    cmd = build_msrun_command(spec, port, log_dir, target, payload_path)
    first = spec.node_rank * spec.nproc
    logs = {first + i: log_dir / f"worker_{first + i}.log" for i in range(spec.nproc)}
    started = time.monotonic()
    if not spec.join:
        proc = _start(cmd, log_dir, spec, env, owned=False)
        proc.wait()
        return LaunchResult(log_dir=log_dir, master_port=port, world=spec.world, returncode=proc.returncode,
                            elapsed_s=time.monotonic() - started, worker_logs=logs, results={}, detached=True)
    follow = follow_rank if follow_rank is not None and follow_rank in logs else first
    watcher = _Watcher(logs, log_dir / "msrun.log", follow_rank=follow, on_line=on_line)
    watchdog = Watchdog(log_dir, list(logs), spec.hang_timeout_s, started)
    forward = _Forwarder(watcher)
    job = uuid.uuid4().hex
    with forward:  # from before msrun starts: a signal can never leave it running without us
        proc = _start(cmd, log_dir, spec, {**(env or {}), JOB_ENV: job}, keep_fds=keep_fds + claim.fds)
        try:
            rc = _supervise(proc, watcher, started, timeout_s, forward, done_grace_s=_done_grace_s(spec),
                            watchdog=watchdog)
        except BaseException:
            _stop_tree(proc.pid, grace_s=spec.kill_grace_s)
            raise
        finally:
            _stop_tree(proc.pid, grace_s=0.0)
            end_job(job)  # whatever msrun left (its own death orphans the scheduler and workers) goes too
    elapsed = time.monotonic() - started
    failure = watcher.failure()
    if watchdog.fault is not None:
        raise watchdog.fault
    if failure is not None or rc != 0:
        raise _failure_error(failure, watcher, rc, log_dir, elapsed, watchdog)
    stopped = _read_rank_files(log_dir, logs, "stopped")
    if stopped:  # (a signal that came as every worker was finishing changed nothing: the job completed)
        raise _interrupted_error(stopped, forward.signal)
    return LaunchResult(log_dir=log_dir, master_port=port, world=spec.world, returncode=rc, elapsed_s=elapsed,
                        worker_logs=logs, results=_read_rank_files(log_dir, logs, "result"))


def _claim_ports(spec: LaunchSpec) -> PortClaim:
    """The job's port range: node 0 (which runs the scheduler) claims ``--master-port``; a range is picked and
    claimed when there is none (`engine.ports`); the other nodes of a multi-node job claim nothing."""
    if spec.master_port is None:
        return claim_free_range()
    if spec.node_rank == 0:
        return claim_master_port(spec.master_port)
    return PortClaim(spec.master_port)


def _start(cmd: list[str], log_dir: Path, spec: LaunchSpec, env: dict[str, str] | None, *, owned: bool = True,
           keep_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """msrun in its own session; ``owned``: through `_msrun_main`, which ties its life to this process's."""
    if owned:
        cmd = [sys.executable, "-m", "mftk.engine.launch", "msrun", "--parent", str(os.getpid()),
               "--keep-fds", ",".join(map(str, keep_fds)), "--", *cmd[3:]]
    with open(log_dir / "msrun.log", "w", encoding="utf-8") as msrun_out:
        return subprocess.Popen(cmd, stdout=msrun_out, stderr=subprocess.STDOUT, env=_worker_env(spec, env),
                                start_new_session=True, pass_fds=keep_fds)


def _check_spec(spec: LaunchSpec, target: str) -> None:
    if ":" not in target:
        raise InputError(message=f"launch target {target!r} is not 'package.module:function'", path=target)
    if spec.nproc < 1 or spec.nnodes < 1 or not 0 <= spec.node_rank < spec.nnodes:
        raise InputError(message=(f"bad launch shape: nproc={spec.nproc}, nnodes={spec.nnodes}, "
                                  f"node_rank={spec.node_rank}"),
                         hint="--nproc ≥ 1, --nnodes ≥ 1 and 0 ≤ --node-rank < --nnodes")
    if spec.nnodes > 1 and spec.master_port is None:
        raise InputError(message="a multi-node job needs --master-port (every node must use the same one)",
                         hint="pass the same --master-port P (1024..65535) to every node")


def build_msrun_command(spec: LaunchSpec, port: int, log_dir: Path, target: str, payload_path: Path) -> list[str]:
    """The msrun argv; the task is ``python -m mftk.engine.launch worker`` (msrun runs 'python' from PATH)."""
    cmd = [sys.executable, "-m", "mindspore.parallel.cluster.run",
           "--worker_num", str(spec.world), "--local_worker_num", str(spec.nproc),
           "--master_port", str(port), "--log_dir", str(log_dir), "--join", "True",
           "--cluster_time_out", str(spec.cluster_time_out_s), "--tail_worker_log", str(2**30)]  # a rank that does not exist: no `tail -f` children
    if spec.nnodes > 1:
        cmd += ["--master_addr", spec.master_addr, "--node_rank", str(spec.node_rank)]
    if not spec.join:
        cmd[cmd.index("--join") + 1] = "False"
    return cmd + ["python", "-m", "mftk.engine.launch", "worker", "--target", target, "--payload", str(payload_path)]


# glibc malloc for msrun workers: two arenas (MindSpore's many threads would otherwise each keep freed blocks in
# arenas of their own that other threads never reuse), blocks of 256 KiB and up mapped (returned when freed
# instead of raising the mmap threshold to the largest freed tensor) and the heap top trimmed past 1 MiB. The
# 4-layer 1024-hidden FSDP2 model of bench/memory.py's family peaks 6 % lower per worker (2,186 vs 2,317 MiB).
MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "262144", "MALLOC_TRIM_THRESHOLD_": "1048576"}


def _worker_env(spec: LaunchSpec, extra: dict[str, str] | None) -> dict[str, str]:
    """PATH/PYTHONPATH so msrun's bare 'python' is this interpreter and finds mftk; quiet GLOG."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("GLOG_v", "3")
    for key, value in MALLOC_ENV.items():  # glibc's allocator for the workers (a user's own setting wins)
        env.setdefault(key, value)
    env["MFTK_NODE_RANK"] = str(spec.node_rank)
    env.update(extra or {})
    return env


class _Watcher:
    """Incremental reader of the worker logs and msrun's own output."""

    def __init__(self, logs: dict[int, Path], msrun_log: Path, *, follow_rank: int,
                 on_line: LineCallback | None) -> None:
        self.logs, self.msrun_log, self.follow_rank, self.on_line = logs, msrun_log, follow_rank, on_line
        self.offsets = {r: 0 for r in logs}
        self.partial = {r: "" for r in logs}
        self.errors: dict[int, str] = {}  # rank -> marker text, in order of detection
        self.done: set[int] = set()
        self.pids: dict[int, int] = {}  # worker pid -> rank
        self.dead_pid: int | None = None
        self.dead_code: int | None = None
        self.dead_ranks: set[int] = set()  # workers found dead (psutil) while another rank reported an error
        self.stopped: list[int] = []  # workers found stopped by a signal when the job failed

    def poll(self) -> None:
        for rank, path in self.logs.items():
            for line in self._new_lines(rank, path):
                self._scan(rank, line)
                if rank == self.follow_rank and self.on_line is not None:
                    self.on_line(line)
        self._scan_msrun()

    def _new_lines(self, rank: int, path: Path) -> list[str]:
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets[rank])
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offsets[rank] += len(chunk)
        text = self.partial[rank] + chunk.decode("utf-8", errors="replace")
        *lines, self.partial[rank] = text.split("\n")
        return lines

    def _scan(self, rank: int, line: str) -> None:
        if line.startswith(START_MARK):
            pid = _field(line, "pid")
            if pid is not None:
                self.pids[int(pid)] = rank
        elif line.startswith(ERROR_MARK) and rank not in self.errors:
            reason = line[len(ERROR_MARK):].strip()
            self.errors[rank] = reason.split(" ", 1)[1] if reason.startswith("rank=") and " " in reason else reason
        elif line.startswith((DONE_MARK, STOPPED_MARK)):
            self.done.add(rank)

    def _scan_msrun(self) -> None:
        """msrun logs 'Worker process PID exit with exception. Error code: N.' for a killed worker."""
        if self.dead_pid is not None:
            return
        try:
            text = self.msrun_log.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        key = "Worker process "
        for line in text.splitlines():
            if key in line and "exit with exception" in line:
                parts = line.split(key, 1)[1].split()
                self.dead_pid = int(parts[0]) if parts and parts[0].isdigit() else -1
                code = line.rsplit("Error code:", 1)[-1].strip().rstrip(".")
                self.dead_code = int(code) if code.lstrip("-").isdigit() else None
                return

    def failure(self) -> tuple[int | None, str] | None:
        """(rank, reason) of the first failure seen, else None; a worker that died comes before the errors of
        its peers (theirs are the echo of its death: a collective with a dead peer fails). A rank's own
        exception (not a collective that lost its peer) comes before workers found dead without msrun's word
        that they exited first: msrun ends every other worker when one exits with an error, and on a busy
        machine they are found gone before msrun's log says whose exit came first."""
        dead_rank = self.pids.get(self.dead_pid) if self.dead_pid is not None else None
        if dead_rank is not None and (dead_rank not in self.errors):
            return dead_rank, (f"rank {dead_rank} died: worker process exited with code {self.dead_code} "
                               "(killed or crashed without a traceback)")
        own = [r for r, text in self.errors.items() if r >= 0 and not is_collective_failure(text)]
        if own:
            return own[0], self.errors[own[0]]
        if self.dead_ranks - set(self.errors):
            rank = min(self.dead_ranks - set(self.errors))
            return rank, f"rank {rank} died: worker process gone without a traceback"
        if self.errors:
            rank = next(iter(self.errors))
            return rank, self.errors[rank]
        if self.dead_pid is not None:
            rank = self.pids.get(self.dead_pid)
            return rank, f"worker process exited with code {self.dead_code} (killed or crashed without a traceback)"
        return None

    def all_done(self) -> bool:
        return len(self.done) == len(self.logs)


class _Forwarder:
    """While the parent supervises: SIGTERM/SIGINT are forwarded to the workers as SIGTERM (each worker
    once, as it announces itself); a second SIGINT raises KeyboardInterrupt (the tree is then killed)."""

    def __init__(self, watcher: _Watcher) -> None:
        self.watcher = watcher
        self.signal: str | None = None
        self.sent: set[int] = set()
        self.old: dict[int, Any] = {}

    def __enter__(self) -> "_Forwarder":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = self.signal or signal.Signals(signum).name
        self.deliver()

    def deliver(self) -> None:
        """SIGTERM to every announced worker not signalled yet (no-op before a signal came)."""
        if self.signal is None:
            return
        for pid in list(self.watcher.pids):
            if pid not in self.sent:
                self.sent.add(pid)
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


def _done_grace_s(spec: LaunchSpec) -> float:
    """How long msrun may take to exit once every local worker has reported done.

    On one node nothing is left to wait for: every result is written, and MindSpore's teardown (the scheduler
    and the workers deregistering) takes 1-10 s on a loaded machine for nothing. On several nodes node 0's
    scheduler still serves ranks elsewhere that may be finishing their last save, so it is given longer."""
    return 1.0 if spec.nnodes == 1 else 10.0


def _supervise(proc: subprocess.Popen, watcher: _Watcher, started: float, timeout_s: float | None,
               forward: _Forwarder | None, *, done_grace_s: float, watchdog: Watchdog | None = None) -> int:
    """Poll logs until msrun exits, a worker fails or hangs, or the time limit passes; returns msrun's code."""
    done_at: float | None = None
    while True:
        watcher.poll()
        if forward is not None:
            forward.deliver()
        rc = proc.poll()
        if rc is not None:
            watcher.poll()
            _settle_blame(watcher)
            return rc
        if watcher.failure() is not None:
            _settle_blame(watcher)
            return 1
        if watchdog is not None and forward is not None and forward.signal is None:
            silent = watchdog.poll(time.monotonic(), watcher.done)
            if silent:
                _end_hung(watcher, watchdog, silent)
                return 1
        if watcher.all_done():
            # every worker finished; msrun only waits for MindSpore's teardown now
            done_at = done_at or time.monotonic()
            if time.monotonic() - done_at > done_grace_s:
                return 0
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            watcher.errors.setdefault(-1, f"job exceeded its time limit of {timeout_s:g} s")
            return 124
        time.sleep(_POLL_S)


def _settle_blame(watcher: _Watcher, wait_s: float = 2.5) -> None:
    """A rank's error may be the echo of a peer's death (its collective failed because the peer is gone): before
    the first error is blamed, look for a dead worker and give msrun a moment to report its exit code."""
    deadline = time.monotonic() + wait_s
    while True:
        states = process_states(watcher.pids)
        if not watcher.stopped and any(st == "stopped" for st in states.values()):
            watcher.stopped = sorted(r for r, st in states.items() if st == "stopped")
            dump_stacks(watcher.pids, states)  # a collective timed out on a stopped peer: its stack, and the others'
            time.sleep(STACK_WAIT_S)
        dead = [r for r, st in states.items() if st == "dead" and r not in watcher.done and r not in watcher.errors]
        if not dead:
            return
        if watcher.dead_pid is not None or time.monotonic() > deadline:
            watcher.dead_ranks.update(dead)
            return
        time.sleep(_POLL_S)
        watcher.poll()


def _end_hung(watcher: _Watcher, watchdog: Watchdog, silent: list[int]) -> None:
    """Stacks of every worker into its log (a stopped one is continued for it), then the error naming the hung."""
    states = process_states(watcher.pids)
    watchdog.fault = watchdog.hang_fault(silent, states, time.monotonic(), watcher.logs)
    dump_stacks(watcher.pids, states)
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline:  # faulthandler writes at once; the logs are read for the record
        time.sleep(_POLL_S)
        watcher.poll()


def _stop_tree(pid: int, *, grace_s: float) -> None:
    """Stop msrun, its scheduler and its workers (each worker leads its own session)."""
    import psutil  # a mindspore dependency; engine-only

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    alive = [p for p in procs if p.is_running()]
    if not alive:
        return
    for sig in ((signal.SIGTERM,) if grace_s > 0 else ()) + (signal.SIGKILL,):
        for p in alive:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(alive, timeout=grace_s if sig == signal.SIGTERM else 5.0)
        if not alive:
            break
    try:
        os.waitpid(pid, os.WNOHANG)  # reap msrun (our child) if Popen did not
    except ChildProcessError:
        pass


def _failure_error(failure: tuple[int | None, str] | None, watcher: _Watcher, rc: int, log_dir: Path,
                   elapsed: float, watchdog: Watchdog | None = None) -> MftkError:
    rank, reason = failure if failure is not None else (None, f"msrun exited with code {rc}")
    if rank == -1:
        return TrainingError(message=f"distributed job stopped: {reason}", hint=f"worker logs are in {log_dir}")
    if rc < 0 and not watcher.errors and watcher.dead_pid is None:  # msrun itself was killed: its workers died with it
        return JobFault(message=f"the msrun launcher was killed (signal {-rc}); every worker of the job was ended "
                        "with it", hint=f"worker logs are in {log_dir}", kind="died",
                        step=watchdog.reached() if watchdog is not None else None)
    died = rank is not None and reason.startswith(f"rank {rank} died")
    typed = _read_error(log_dir / f"error_{rank}.json") if rank is not None and not died else None
    if typed is not None and not is_collective_failure(typed.message):  # the user's error: as in one process
        return typed
    stopped = [r for r in watcher.stopped if r != rank]
    if typed is not None and stopped:  # the peer it waited for is here, stopped by a signal
        reason = (", ".join(f"rank {r}" for r in stopped) + " is stopped by a signal (SIGSTOP?): "
                  + f"rank {rank}'s collective failed waiting for it: {typed.message.splitlines()[0]}")
    elif typed is not None:  # a collective failed: a peer (here or on another node) stopped or died
        reason = (f"rank {rank}'s collective failed: a peer rank stopped or died (on another node, or before "
                  f"this node saw it): {typed.message.splitlines()[0]}")
    log = watcher.logs.get(rank) if rank is not None else None
    tail = _error_tail(log) if log is not None else ""
    who = f"worker {rank}" if rank is not None else "a worker"
    step = watchdog.last_step(rank, fresh=True) if watchdog is not None and rank is not None else None
    text = f"{who} failed after {elapsed:.1f} s: {reason}" + (f"; last finished step {step}" if step is not None else "")
    echoed = sorted(r for r in watcher.errors if r != rank)
    if died and echoed:
        text += "; " + ", ".join(f"rank {r}" for r in echoed) + " then failed as a consequence"
    if tail:
        text += "\n" + tail
    where = log if log is not None else log_dir / "msrun.log"
    kind = "died" if died or rc < 0 else ("hang" if stopped else "peer") if typed is not None else "crashed"
    reached = watchdog.reached() if watchdog is not None else None
    ranks = tuple(stopped) if kind == "hang" else (rank,) if rank is not None and kind != "peer" else ()
    return JobFault(message=text, hint=f"full log: {where}", step=reached, kind=kind, ranks=ranks)


def _error_tail(path: Path, n: int = _ERROR_TAIL_LINES) -> str:
    """The worker's last Python traceback (markers and MindSpore's C++ stack dropped), else its last lines."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    keep = lines[starts[-1]:] if starts else lines
    keep = [ln for ln in keep if not ln.startswith((START_MARK, ERROR_MARK, DONE_MARK)) and ln.strip()]
    cut = next((i for i, ln in enumerate(keep) if ln.startswith("- C++ Call Stack")), None)
    if cut is not None:
        keep = keep[:max(cut - 1, 0)]
        keep = [ln for ln in keep if not set(ln.strip()) <= {"-"}]
    return "\n".join(keep[:2] + ["  ..."] + keep[-(n - 2):] if len(keep) > n else keep)


def _write_error(path: Path, exc: MftkError) -> None:
    """A worker's typed error as JSON (its class name and fields), for the parent to raise again."""
    try:
        write_atomic(path, json.dumps({"type": type(exc).__name__, "fields": exc.as_dict()}, default=str))
    except (OSError, TypeError, ValueError, MftkError):
        pass  # the marker and the log still report it, as a generic failure


def _read_error(path: Path) -> MftkError | None:
    """The typed error a worker wrote (`_write_error`), rebuilt; None when there is none or it cannot be."""
    from mftk import errors

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        cls = getattr(errors, data["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, MftkError)):
            return None
        fields = dict(data["fields"])
        if cls is errors.ConfigError:
            fields["problems"] = [errors.Problem(**p) for p in fields.get("problems", [])]
        return cls(**fields)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _interrupted_error(stopped: dict[int, dict[str, Any]], parent_signal: str | None) -> TrainingInterrupted:
    """The job stopped on a signal: the lowest rank's report (the one holding rank 0's checkpoint dir)."""
    first = stopped[min(stopped)]
    step, path = first.get("step"), first.get("saved_path") or ""
    what = parent_signal or first.get("signal") or "a signal"
    text = (f"{what} received: the job stopped after step {step}"
            + (f", checkpoint saved to {path}" if path else " (checkpoints disabled: nothing saved)"))
    return TrainingInterrupted(message=text, step=step, saved_path=path,
                               hint="continue with: mftk resume CONFIG" if path else "")


def _read_rank_files(log_dir: Path, logs: dict[int, Path], kind: str) -> dict[int, Any]:
    """rank -> the JSON a local worker left in ``<kind>_<rank>.json`` (``result``: its return value;
    ``stopped``: where it saved when a signal stopped it)."""
    out = {}
    for rank in logs:
        path = log_dir / f"{kind}_{rank}.json"
        if path.exists():
            out[rank] = json.loads(path.read_text(encoding="utf-8"))
    return out


def _clear_old_outputs(log_dir: Path) -> None:
    """A reused --log-dir must not let a previous job's markers or results look like this job's."""
    for pattern in ("worker_*.log", "result_*.json", "stopped_*.json", "error_*.json", "hb_*.json", "scheduler.log",
                    "msrun.log"):
        for p in log_dir.glob(pattern):
            p.unlink()


def _field(line: str, key: str) -> str | None:
    for tok in line.split():
        if tok.startswith(key + "="):
            return tok.split("=", 1)[1]
    return None


# ---------------------------------------------------------------- worker side


def resolve_target(target: str) -> Callable[..., Any]:
    """``"pkg.mod:fn"`` → the function (imported in the worker)."""
    module, _, name = target.partition(":")
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


def init_distributed() -> tuple[int, int]:
    """The parent's device (`device.worker_device`), ``communication.init()`` (mccl on CPU, nccl on GPU, hccl on
    Ascend) plus the send/recv default-group patch.

    The patch: ``get_cache_group_rank`` binds its default group ('hccl_world_group') at import,
    before ``init()`` renames the world group, so every P2P call fails (mindspore-cpu.md §4).
    """
    from mindspore import communication
    from mindspore.communication.management import GlobalComm

    from mftk.engine import device

    device.apply(device.worker_device())  # before init(): the backend follows the device (mccl on CPU)
    communication.init()
    from mindspore.mint.distributed import distributed as _dist

    _dist.get_cache_group_rank.__defaults__ = (GlobalComm.WORLD_COMM_GROUP,)
    return communication.get_rank(), communication.get_group_size()


def worker_main(target: str, payload_path: str) -> int:
    """The body msrun runs on every rank (and on the scheduler, which only joins the cluster)."""
    parent = os.environ.get(PARENT_ENV)
    if parent:  # an owned job (not --no-join, whose msrun exits at once): die with msrun, which dies with mftk
        own_by_parent(int(parent))
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        if os.environ.get("MFTK_NODE_RANK", "0") != "0":
            return 0  # msrun starts a scheduler on every node whose master_addr is local; only node 0 may
        from mindspore import communication

        communication.init()  # serves the cluster until every worker is gone
        return 0
    rank = int(os.environ.get("RANK_ID", "-1"))
    _keep_signals()  # before the parent can know our pid: a signal from now on is never lost
    faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True)  # the watchdog's stack dump
    _emit(f"{START_MARK} rank={rank} pid={os.getpid()}")
    try:
        if rank >= 0:
            BEAT.start(heartbeat_path(Path(payload_path).parent, rank))
        rank, _ = init_distributed()
        if BEAT.path is None:
            BEAT.start(heartbeat_path(Path(payload_path).parent, rank))
        payload = json.loads(Path(payload_path).read_text(encoding="utf-8"))
        result = resolve_target(target)(**payload)
        out = Path(payload_path).with_name(f"result_{rank}.json")
        write_atomic(out, json.dumps(result))
    except TrainingInterrupted as exc:  # saved and stopped on a signal: a clean stop, so exit 0
        out = Path(payload_path).with_name(f"stopped_{rank}.json")
        write_atomic(out, json.dumps({"message": exc.message, "step": exc.step, "saved_path": exc.saved_path,
                                      "signal": exc.message.split(" ", 1)[0]}))
        _emit(f"{STOPPED_MARK} rank={rank} step={exc.step}")
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent as a marker
        if isinstance(exc, MftkError):  # the user's error, not a bug: the parent raises it as it is
            _write_error(Path(payload_path).with_name(f"error_{rank}.json"), exc)
            sys.stderr.write(f"{type(exc).__name__}: {exc.message}\n")
        else:
            traceback.print_exc()
        summary = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        sys.stderr.flush()
        _emit(f"{ERROR_MARK} rank={rank} {summary}")
        os._exit(1)  # never hang in collective teardown while peers wait
    _emit(f"{DONE_MARK} rank={rank}")
    return 0


_PENDING: list[str] = []  # signals that arrived before the target installed its own handler


def _keep_signals() -> None:
    """Until the target installs its handler, SIGTERM/SIGINT are recorded, not fatal."""
    def keep(signum: int, frame: Any) -> None:
        _PENDING.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, keep)


def take_pending_signal() -> str | None:
    """The first signal this worker received before its target took over signal handling (then forgotten)."""
    name = _PENDING[0] if _PENDING else None
    _PENDING.clear()
    return name


def _emit(line: str) -> None:
    """A protocol line in this worker's log (msrun sends the worker's stdout to worker_<rank>.log)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _msrun_main(parent: int, msrun_args: list[str], keep_fds: tuple[int, ...] = ()) -> int:
    """msrun itself, tied to the `mftk` parent (`own_by_parent`); the processes it starts learn its pid and
    inherit ``keep_fds`` (the save path's lock: held, as one lock, until the last of them is gone)."""
    import runpy

    own_by_parent(parent)
    os.environ[PARENT_ENV] = str(os.getpid())
    if keep_fds:
        _popen_init = subprocess.Popen.__init__

        def popen_init(self: subprocess.Popen, *args: Any, pass_fds: Any = (), **kw: Any) -> None:
            _popen_init(self, *args, pass_fds=tuple(pass_fds) + keep_fds, **kw)

        subprocess.Popen.__init__ = popen_init  # msrun's own Popen calls close every other descriptor
    sys.argv = ["msrun", *msrun_args]
    runpy.run_module("mindspore.parallel.cluster.run", run_name="__main__", alter_sys=True)
    return 0


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["msrun"]:  # msrun --parent PID -- MSRUN_ARGS...
        rest, head = argv[argv.index("--") + 1:], argv[:argv.index("--")]
        fds = head[head.index("--keep-fds") + 1] if "--keep-fds" in head else ""
        return _msrun_main(int(head[head.index("--parent") + 1]), rest, tuple(int(f) for f in fds.split(",") if f))
    parser = argparse.ArgumentParser(prog="python -m mftk.engine.launch")
    sub = parser.add_subparsers(dest="role", required=True)
    w = sub.add_parser("worker", help="entry point msrun starts on every rank")
    w.add_argument("--target", required=True, help="package.module:function to call")
    w.add_argument("--payload", required=True, help="JSON file with the keyword arguments")
    args = parser.parse_args(argv)
    return worker_main(args.target, args.payload)


if __name__ == "__main__":  # the process entry msrun starts; its status is the worker's exit code
    # Run the importable module's copy, not this __main__ one: the worker's state (the signals kept before
    # the target took over, `take_pending_signal`) must be the one `mftk.engine.launch` importers see.
    from mftk.engine import launch as _launch

    raise SystemExit(_launch._main())
