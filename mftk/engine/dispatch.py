"""Which thread dispatches the step's MindSpore ops, and at what scheduling priority.

With ``launch_blocking`` on CPU, MindSpore's ops run on its actor and kernel threads while two other
threads busy-wait for them: the Python thread that dispatched the op and MindSpore's ``frontend_queue``
relay (both spin in ``sched_yield``). On the 2-core machines this project targets the spinners took
~0.75 CPU-s of every 1.8 s step of bench/train_step.py from the GEMMs, which then ran at half speed.
Moving both spinners to the ``SCHED_IDLE`` class gives the cores to the kernel threads whenever they
have work, and to the spinners only when a core is free: 1.06–1.19× faster steps (same bench, variant
``mftk`` vs ``mftk_spin``).

Two Linux rules shape the code. A new thread inherits its creator's scheduling class, and MindSpore
creates its actor/kernel threads lazily on the first op — so the dispatch thread is lowered only after
its first call has run. An unprivileged thread can never be raised back — so the lowering happens on a
dispatch thread of our own, never on the caller's (e.g. the main thread of a test process or notebook).
MindSpore's relay thread is shared by the whole process: ``close`` puts it back where the OS allows
(a privileged process); otherwise it stays lowered, which only costs a later dispatch-bound workload
in the same process a little speed.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")

RELAY_THREADS = ("frontend_queue",)  # MindSpore 2.10's PyNative relay (runtime/pipeline AsyncRQueue)
IDLE_CLASS = hasattr(os, "SCHED_IDLE")  # Linux only; elsewhere the dispatcher runs everything inline


def low_priority_applies() -> bool:
    """``SCHED_IDLE`` exists and MindSpore runs on CPU, where the kernels and the spinners share cores."""
    if not IDLE_CLASS:
        return False
    import mindspore as ms

    return ms.get_context("device_target") == "CPU"


def set_policy(tid: int, policy: int) -> bool:
    """Scheduling ``policy`` for thread ``tid`` (0: the calling thread); False where the OS refuses."""
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def threads_named(names: tuple[str, ...]) -> list[int]:
    """Thread ids of this process whose kernel name (``comm``) is one of ``names``."""
    tids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if comm in names:
            tids.append(int(task.name))
    return tids


class Dispatcher:
    """Runs callables that dispatch MindSpore ops: inline, or — ``low_priority`` — on one long-lived
    thread of its own that is moved, with MindSpore's relay thread, to ``SCHED_IDLE`` after its first
    call. ``call`` blocks the caller (asleep, not spinning) and re-raises the callable's exception."""

    def __init__(self, low_priority: bool) -> None:
        self.low_priority = low_priority and IDLE_CLASS
        self._pool: ThreadPoolExecutor | None = None
        self.lowered: list[str] | None = None  # moved to SCHED_IDLE ("dispatch", "relay:<tid>"); None: not yet
        self._relays: list[int] = []

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        if not self.low_priority:
            return fn(*args)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="mftk-dispatch")
        result = self._pool.submit(fn, *args).result()
        if self.lowered is None:
            self.lowered = self._pool.submit(self._lower).result()
        return result

    def _lower(self) -> list[str]:
        """Runs on the dispatch thread, after its first call (see the module docstring)."""
        done = ["dispatch"] if set_policy(0, os.SCHED_IDLE) else []
        self._relays = [tid for tid in threads_named(RELAY_THREADS) if set_policy(tid, os.SCHED_IDLE)]
        return done + [f"relay:{tid}" for tid in self._relays]

    def close(self) -> None:
        """Ends the dispatch thread and restores the relay where allowed; a later ``call`` starts over."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            for tid in self._relays:
                set_policy(tid, os.SCHED_OTHER)
            self._pool, self.lowered, self._relays = None, None, []
