"""A fault injector FOR TESTS ONLY: ``MFTK_FAULT`` makes one rank fail at one step, on purpose.

The suite must exercise every failure path of a multi-process job (a worker that dies, hangs, raises, or
produces a NaN) without timing games; this is the switch it uses (in the spirit of the fault injector that
Megatron-LM's in-job restart is tested with, as issue 34 notes). Format: one or more faults separated by
``;``, each a comma list of ``key:value``::

    MFTK_FAULT="rank:1,step:3,kind:exit"                      # rank 1 exits (code 3) as step 3 begins
    MFTK_FAULT="rank:1,step:3,kind:kill;rank:0,step:5,kind:hang,attempt:1"

``kind``: ``exit`` (os._exit(3)), ``kill`` (SIGKILL itself, as ``kill -9``), ``hang`` (sleeps for ever; its
threads run on), ``raise`` (a RuntimeError), ``nan`` (the first trainable weight becomes NaN before the step).
``attempt`` (default 0) is the launch attempt it fires in (``--max-restarts`` relaunches are 1, 2, ...), so a
fault does not fire again in the job that resumed past it. It can never be on unnoticed: every rank logs a
warning naming it at start-up, and a bad value is an error.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any

import attrs

from mftk.errors import InputError

ENV = "MFTK_FAULT"
ATTEMPT_ENV = "MFTK_ATTEMPT"  # set by the launcher: which (re)launch of the job this worker belongs to
KINDS = ("exit", "kill", "hang", "raise", "nan")


@attrs.frozen
class Fault:
    rank: int
    step: int
    kind: str
    attempt: int = 0

    def describe(self) -> str:
        return f"rank {self.rank} will {self.kind} at step {self.step} (launch attempt {self.attempt})"


def parse(text: str) -> list[Fault]:
    """``MFTK_FAULT``'s value as faults; InputError naming the bad part."""
    faults = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        try:
            fields = dict(kv.split(":", 1) for kv in part.split(","))
            fault = Fault(rank=int(fields.pop("rank")), step=int(fields.pop("step")), kind=fields.pop("kind"),
                          attempt=int(fields.pop("attempt", 0)))
        except (ValueError, KeyError) as exc:
            raise InputError(message=f"{ENV}={text!r}: cannot read {part!r} ({exc})", path=ENV,
                             hint="e.g. MFTK_FAULT=rank:1,step:3,kind:exit (test-only; unset it)") from None
        if fields or fault.kind not in KINDS:
            raise InputError(message=f"{ENV}={text!r}: unknown {sorted(fields) or fault.kind!r} in {part!r}",
                             path=ENV, hint=f"keys rank, step, kind ({', '.join(KINDS)}), attempt")
        faults.append(fault)
    return faults


class Injector:
    """The faults of this rank in this launch attempt; `before_step` fires them."""

    def __init__(self, faults: list[Fault], rank: int, attempt: int) -> None:
        self.all = faults
        self.mine = {f.step: f for f in faults if f.rank == rank and f.attempt == attempt}

    @classmethod
    def from_env(cls, rank: int) -> "Injector | None":
        text = os.environ.get(ENV, "")
        if not text.strip():
            return None
        return cls(parse(text), rank, int(os.environ.get(ATTEMPT_ENV, "0") or 0))

    def announce(self, log: Any) -> None:
        log.warning("%s is set: TEST-ONLY FAULT INJECTION is active: %s. Unset %s for a real run.", ENV,
                    "; ".join(f.describe() for f in self.all), ENV)

    def before_step(self, step: int, model: Any = None) -> None:
        fault = self.mine.get(step)
        if fault is None:
            return
        import sys

        sys.stdout.write(f"MFTK_FAULT firing: {fault.describe()}\n")
        sys.stdout.flush()
        if fault.kind == "exit":
            os._exit(3)
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "hang":
            while True:
                time.sleep(3600)
        if fault.kind == "raise":
            raise RuntimeError(f"{ENV}: injected failure on rank {fault.rank} at step {step}")
        if fault.kind == "nan" and model is not None:
            import numpy as np
            from mindspore import Tensor

            p = next(iter(model.trainable_params()))
            p.set_data(Tensor(np.full(p.shape, np.nan, np.float32)))
