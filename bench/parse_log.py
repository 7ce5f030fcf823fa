"""parse-log on a large synthetic MindSpore Transformers log: MB/s and peak RSS (issue 35's goal: under
500 MiB for any log size, >= 50 MB/s on a 2-core machine, for a 2 GB log of ~7 M steps).

The log is written in big blocks (step lines from a few templates, renumbered: a 2 GB file in seconds)
into a temporary directory, deleted at the end. Each measurement runs in a fresh child process, so its
peak RSS (`wait4`'s ru_maxrss) is its own: (p) `parse_run` alone, reading every step into columns;
(c) `mftk parse-log LOG` end to end (read, summary, anomalies, table); (f) the floor of any Python line
reader, a `for line in file` loop running the reference's one-field regex `loss:\\s+(\\d+\\.\\d+)`, on the
first --floor-mb of the log. A log over 64 MiB is read by 2 worker processes (mftk.logs.workers): the
CPU time counts theirs, and the process tree's peak RSS (sampled) adds theirs to the parent's. Wall times
depend on the machine's load; CPU times (user + sys) and the ratios less so. Nothing in the test suite asserts on these figures.

Run: .venv/bin/python bench/parse_log.py [--gb 2] [--steps N] [--floor-mb 200]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mftk.logs.format import format_step_line  # noqa: E402
from tests.helpers.logsynth import prefix_at, step_metrics  # noqa: E402

_TEMPLATES = 997  # distinct step-line tails (loss ... throughput), reused with new step numbers
_BLOCK = 20_000  # lines per write


def write_log(path: Path, *, size: int, steps: int | None, noise_every: int = 10) -> int:
    """A PyNative step log of about `size` bytes (or `steps` steps); returns the number of steps."""
    tails = []
    for i in range(_TEMPLATES):
        line = format_step_line(step_metrics(1000 + i), total_steps=99_999_999)
        tails.append(line[line.index(", loss:"):])
    gbs, step, written = 8, 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while (steps is None and written < size) or (steps is not None and step < steps):
            prefix = prefix_at(step)  # one timestamp per block: the reader needs them only where steps go back
            block = []
            for _ in range(_BLOCK if steps is None else min(_BLOCK, steps - step)):
                step += 1
                block.append(f"{prefix}{{ step:[{step:8d}/99999999], consumed_samples: {step * gbs}, "
                             f"global_batch_size: {gbs}{tails[step % _TEMPLATES]}\n")
                if step % noise_every == 0:
                    block.append(f"{prefix}Checkpoint saved at step {step} to ./ckpt (async=False)\n")
            text = "".join(block)
            f.write(text)
            written += len(text)
    return step


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants (the reader's workers), summed: pages the workers
    share with their parent count twice, so this is an upper bound."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            total = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except (OSError, ValueError):
        return total
    return total + sum(tree_rss(k) for k in kids)


def measure(argv: list[str]) -> tuple[float, float, float, float, str]:
    """(wall s, CPU s, peak RSS MiB, peak RSS of the process tree MiB, stdout tail) of a child process.

    wait4's peak RSS is the largest one process reached (the child's or a worker's); the tree's peak is
    sampled every 20 ms while the child runs (Linux /proc), its workers' RSS added to its own. The CPU time
    includes the workers' (wait4 counts every waited-for descendant)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], tree_rss(child.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = child.stdout.read()
    done.set()
    sampler.join()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed:\n{out[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, peak[0] / 2**20, out[-300:]


PARSE_ONLY = """
import sys
from pathlib import Path
from mftk.logs.parse import parse_run
run = parse_run([Path(sys.argv[1])])
print(len(run.records), "steps;", round(run.records.nbytes() / len(run.records), 1), "column bytes per step")
"""

FLOOR = """
import re, sys
pattern, limit, seen, n = re.compile(r"loss:\\s+(\\d+\\.\\d+)"), int(sys.argv[2]), 0, 0
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f:
        m = pattern.search(line)
        if m:
            float(m.group(1))
            n += 1
        seen += len(line)
        if seen >= limit:
            break
print(n, "losses")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0, help="log size in GB (1e9 bytes); default 2")
    ap.add_argument("--steps", type=int, default=None, help="a log of this many steps instead of --gb")
    ap.add_argument("--floor-mb", type=float, default=200, help="MB read by the one-field regex floor")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mftk-bench-log-") as tmp:
        path = Path(tmp) / "worker_0.log"
        t0 = time.perf_counter()
        steps = write_log(path, size=int(args.gb * 1e9), steps=args.steps)
        mb = path.stat().st_size / 1e6
        print(f"log: {steps:,} steps, {mb:,.0f} MB, written in {time.perf_counter() - t0:.1f} s; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        py = sys.executable
        floor_mb = min(args.floor_mb, mb)
        f_wall, f_cpu, f_rss, _, _ = measure([py, "-c", FLOOR, str(path), str(int(floor_mb * 1e6))])
        p_wall, p_cpu, p_rss, p_tree, p_out = measure([py, "-c", PARSE_ONLY, str(path)])
        c_wall, c_cpu, c_rss, c_tree, _ = measure([py, "-m", "mftk", "parse-log", str(path)])
        load = os.getloadavg()[0]
    floor = floor_mb / f_cpu
    print(f"(f) one-field regex line loop, first {floor_mb:,.0f} MB: {floor_mb / f_wall:6.1f} MB/s wall, "
          f"{floor:6.1f} MB/s per CPU-second, peak RSS {f_rss:,.0f} MiB")
    print(f"(p) parse_run (every field, into columns):  {mb / p_wall:6.1f} MB/s wall ({p_wall:.1f} s), "
          f"{mb / p_cpu:6.1f} MB/s per CPU-second, peak RSS {p_rss:,.0f} MiB (process tree {p_tree:,.0f} MiB); "
          f"{p_out.strip()}")
    print(f"(c) mftk parse-log end to end:              {mb / c_wall:6.1f} MB/s wall ({c_wall:.1f} s), "
          f"{mb / c_cpu:6.1f} MB/s per CPU-second, peak RSS {c_rss:,.0f} MiB (process tree {c_tree:,.0f} MiB)")
    print(f"load average at the end: {load:.1f} on {os.cpu_count()} cores (wall figures shrink with the load; "
          "per CPU-second figures count the workers' CPU too)")
    print(f"ratio p/f (per CPU-second): {mb / p_cpu / floor:.2f}x the one-field regex loop; "
          f"c/f: {mb / c_cpu / floor:.2f}x; goal: >= 50 MB/s and peak RSS < 500 MiB")
    print("the log was deleted")


if __name__ == "__main__":
    main()
