"""Progress reports of an msrun worker (``hb_<rank>.json`` in the job's log dir), read by the parent's watchdog.

Why a file written by a thread: a rank that hangs (a peer stopped, a collective that never completes) makes no
more progress, but nothing in it can say so; the parent must notice from outside. Each worker keeps its
progress in memory (`BEAT`: the last finished step, the phase it is in, how many collectives it entered and
whether it is inside one) and a daemon thread writes it once a second. The parent (`engine.launch`) calls a
rank hung when that progress has not changed for the hang timeout; a rank whose file stops changing at all is
frozen (stopped, or its interpreter blocked). Updating the counters costs a few attribute writes per
collective; the file is ~150 bytes a second.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

HEARTBEAT_PREFIX = "hb_"
INTERVAL_S = 1.0


class Beat:
    """This process's progress (one per worker; the parent reads what `write` leaves on disk)."""

    def __init__(self) -> None:
        self.step = 0  # the last step this rank finished
        self.phase = "start-up"  # start-up | step | collective | save
        self.collectives = 0  # collectives entered so far
        self.saves = 0
        self.steps_done = 0  # steps this process finished (the resumed step it starts from is not one)
        self.path: Path | None = None
        self._thread: threading.Thread | None = None

    def start(self, path: Path) -> None:
        """Begin writing ``path`` every `INTERVAL_S` seconds (a daemon thread: it never keeps a worker alive)."""
        self.path = path
        self.write()
        self._thread = threading.Thread(target=self._loop, name="mftk-heartbeat", daemon=True)
        self._thread.start()

    def step_done(self, step: int, *, start: bool = False) -> None:
        """A finished step is written at once (a rank that dies right after must not look a step behind);
        ``start``: the step training starts from (resumed), not one this process ran."""
        self.step, self.phase = int(step), "step"
        self.steps_done += 0 if start else 1
        self.write()

    def enter_collective(self) -> str:
        previous, self.phase = self.phase, "collective"
        self.collectives += 1
        return previous

    def leave_collective(self, previous: str) -> None:
        self.phase = previous

    def saving(self, active: bool) -> None:
        self.phase = "save" if active else "step"
        self.saves += int(active)

    def record(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "step": self.step, "phase": self.phase, "collectives": self.collectives,
                "saves": self.saves, "steps_done": self.steps_done, "time": time.time()}

    def write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.record()), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass  # a full or vanished log dir must not stop training; the parent sees the file go stale

    def _loop(self) -> None:
        while True:
            time.sleep(INTERVAL_S)
            self.write()


BEAT = Beat()


def heartbeat_path(log_dir: Path, rank: int) -> Path:
    return Path(log_dir) / f"{HEARTBEAT_PREFIX}{rank}.json"


def read_heartbeat(path: Path) -> dict[str, Any] | None:
    """The last record a worker wrote, or None when there is none (yet) or it is being replaced."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def progress_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What must change for a rank to count as making progress (the write time alone does not)."""
    return record.get("step"), record.get("phase"), record.get("collectives"), record.get("saves")
