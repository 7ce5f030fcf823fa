"""This process, set up for a run: its device, seeds and determinism (`setup_process`), its rank, and the
SIGTERM/SIGINT handlers that stop the run after a step, with a save (`StopSignals`)."""
from __future__ import annotations

import signal
import threading
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import communication
from mindspore.communication.management import GlobalComm

from mftk.engine import device
from mftk.engine.launch import take_pending_signal
from mftk.logs.sinks import log


def distributed() -> bool:
    """``communication.init()`` has run (an msrun worker)."""
    return bool(GlobalComm.INITED)


def rank() -> int:
    return communication.get_rank()


def setup_process(config: Any) -> Any:
    """The device (a worker's was set before ``init()``), the seeds and determinism of ``training``."""
    chosen = device.select(config.context.device_target)
    if ms.get_context("device_target") != chosen or not distributed():  # a worker's was set before init()
        device.apply(chosen)
    log.info("Device: %s (collective backend %s)", chosen, device.BACKENDS[chosen])
    seed = config.training.seed
    ms.set_seed(seed)
    ms.manual_seed(seed)
    np.random.seed(seed)
    if config.training.deterministic:
        ms.set_deterministic(True)
    return ms


class StopSignals:
    """SIGTERM/SIGINT set the stop flag (the loop saves after the current step, then exit 75); a second
    SIGINT interrupts at once. Installed for the whole run, so a signal during start-up stops the run
    after its first step; in an msrun worker, one that came before (`launch.take_pending_signal`) counts."""

    def __init__(self, stop: Any, enabled: bool) -> None:
        self.stop, self.enabled, self.old = stop, enabled and threading.current_thread() is threading.main_thread(), {}

    def __enter__(self) -> None:
        if not self.enabled:
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.old[sig] = signal.signal(sig, self._handle)
        early = take_pending_signal()
        if early is not None and not self.stop.requested:
            log.warning("%s received during start-up: the run stops after its first step, saving it", early)
            self.stop.request(early)

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stop.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.warning("%s received: saving a checkpoint after the current step, then stopping", name)
        self.stop.request(name)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

