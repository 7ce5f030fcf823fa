"""A training process that SIGKILLs itself at a chosen moment inside its checkpoint saves.

``python -m tests.helpers.crash_child CONFIG OUT KILL_AT SEED`` trains CONFIG (continuing from the
newest checkpoint under its ``save_path`` when there is one) and counts every checkpoint I/O event:
each write through `safetensors_io.write_all` (the one place every checkpoint byte goes through),
and the moments before and after each rename of a step dir, each directory fsync, each tracker
update and each retention pass. At event number KILL_AT it kills itself with SIGKILL: in the middle
of a write (a seeded random number of the bytes written first), or between two of those steps.
KILL_AT 0 never kills (the count of events is printed at the end, for calibration).
"""
from __future__ import annotations

import os
import random
import signal
import sys


def instrument(kill_at: int, rng: random.Random) -> dict:
    from mftk.ckpt import safetensors_io, save

    state = {"events": 0}

    def event() -> bool:
        state["events"] += 1
        return state["events"] == kill_at

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    real_write_all = safetensors_io.write_all

    def write_all(fh, data):
        if event():
            fh.write(bytes(data)[:rng.randrange(0, len(data) + 1)])
            fh.flush()
            die()
        return real_write_all(fh, data)

    safetensors_io.write_all = write_all

    def around(owner, name):
        real = getattr(owner, name)

        def wrapped(*a, **k):
            if event():
                die()
            out = real(*a, **k)
            if event():
                die()
            return out

        setattr(owner, name, wrapped)

    for name in ("_replace_dir", "_fsync_dir", "write_tracker"):
        around(save, name)
    around(save.Retention, "record")
    return state


def newest_checkpoint(root: str) -> str | None:
    """The tracker's step dir, else the newest complete iteration dir (a kill can fall between the two)."""
    from mftk.ckpt.layout import iteration_dirs, read_tracker

    if not os.path.isdir(root):
        return None
    step = read_tracker(root)
    if step is not None:
        return os.path.join(root, f"iteration_{step:08d}")
    dirs = iteration_dirs(root)
    return str(dirs[max(dirs)]) if dirs else None


def main(config: str, out: str, kill_at: int, seed: int) -> None:
    from mftk.config.load import load_config
    from mftk.engine.run import train

    state = instrument(kill_at, random.Random(seed))
    loaded = load_config(config)
    train(loaded, output_dir=out, resume_from=newest_checkpoint(loaded.config.checkpoint.save_path),
          install_signals=False)
    sys.stdout.write(f"EVENTS {state['events']}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
