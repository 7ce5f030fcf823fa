"""Every process of an msrun job dies with the process that owns it (Linux).

The chain: the `mftk` parent starts msrun through ``python -m mftk.engine.launch msrun`` (`own_by_parent`
there: msrun gets SIGKILL when the parent dies, however it dies, ``kill -9`` included); msrun starts the
scheduler and the workers with ``subprocess.Popen`` (``preexec_fn=os.setsid`` for the workers, so neither a
process group nor a session reaches them), and each of them calls `own_by_parent` first thing in
``launch.worker_main``: it dies with msrun. ``PR_SET_PDEATHSIG`` (prctl(2)) is the kernel's own mechanism and
needs no thread or polling; it is inherited by no child and survives ``execve``. The race it leaves (the
parent dying before the child sets it) is closed by checking the parent pid right after.

Each process also carries ``MFTK_JOB=<id>`` in its environment; `end_job` finds and kills whatever of a job
is still alive (orphans of a killed msrun) and waits until none is, so the parent releases the save-path lock
only after the last process that could write there is gone.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

JOB_ENV = "MFTK_JOB"  # the job's id, in the environment of msrun, the scheduler and every worker
PARENT_ENV = "MFTK_MSRUN_PID"  # msrun's pid, set by `_msrun_main` for the processes it starts
_PR_SET_PDEATHSIG = 1


def own_by_parent(expected_parent: int | None) -> None:
    """Die (SIGKILL) when the parent process dies; exit at once if it already has (``expected_parent``)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # the owner died before we could tie ourselves to it


def job_processes(job: str) -> list:
    """Live (non-zombie) processes whose environment names ``job`` (this user's; others cannot be read)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(JOB_ENV) == job:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def end_job(job: str, timeout_s: float = 15.0) -> list[int]:
    """SIGKILL every process of ``job`` still alive and wait (up to ``timeout_s``) until none is; returns the pids
    that had to be killed."""
    import psutil

    procs = job_processes(job)
    for p in procs:
        try:
            p.send_signal(signal.SIGCONT)  # a stopped process dies of SIGKILL too, but is reaped sooner awake
            p.kill()
        except psutil.Error:
            pass
    deadline = time.monotonic() + timeout_s
    alive = procs
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=0.5)
        alive = [p for p in alive if _alive(p)]
    return [p.pid for p in procs]


def _alive(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
