"""parse-log on large synthetic MindSpore Transformers logs: MB/s and peak RSS (issue 35's goal: under
500 MiB for any log size, >= 50 MB/s on a 2-core machine; a 2 GB log has ~7.2 M steps, a 4 GB one ~14.4 M).

Each log is written in big blocks (step lines from a few templates, renumbered: a 2 GB file in seconds)
into a temporary directory, deleted at the end. Each measurement runs in a fresh child process, so its
peak RSS (`wait4`'s ru_maxrss) is its own: (c) `mftk parse-log LOG` end to end (read, summary, anomalies,
table), `--repeat` times per size; with `--baseline DIR` (another source tree of mftk, e.g. an earlier
commit unpacked with `git archive REV | tar -x -C DIR`) its runs alternate with the baseline's, so both see
the same machine load, and the medians and their ratio are printed. (f) is the floor of any Python line
reader, a `for line in file` loop running the reference's one-field regex `loss:\\s+(\\d+\\.\\d+)`, on the
first --floor-mb of the log. A log over 64 MiB is read by 2 worker processes (mftk.logs.workers): the
CPU time counts theirs, and the process tree's peak RSS (sampled) adds theirs to the parent's. Wall times
depend on the machine's load; CPU times (user + sys) and the ratios less so. A log over 1 M steps is held a
segment at a time (mftk.logs.spill): its peak RSS should not grow from 2 GB to 4 GB.
Nothing in the test suite asserts on these figures.

`--layout` picks how the log's steps are laid out, the same bytes in all: `one` file of one rank (the
default); `ranks:N`, a directory of N files `worker_k.log` (msrun's --log_dir), each 1/N of the size;
`interleaved:N`, N ranks' lines of each step next to each other in one file (msrun's console, `tee`);
`appended:N`, N ranks' logs one after another in one file (`cat worker_*.log`, the clock going back at
each). Each layout is held a segment at a time (the files share one segment's rows).

Run: .venv/bin/python bench/parse_log.py [--gb 2,4] [--repeat 3] [--baseline DIR] [--floor-mb 200]
                                         [--layout one|ranks:N|interleaved:N|appended:N]
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


def write_log(path: Path, *, size: int, steps: int | None, noise_every: int = 10, copies: int = 1) -> int:
    """A PyNative step log of about `size` bytes (or `steps` steps); returns the number of steps. With
    `copies`, each step's line is written that many times in a row (ranks interleaved)."""
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
                block += [f"{prefix}{{ step:[{step:8d}/99999999], consumed_samples: {step * gbs}, "
                          f"global_batch_size: {gbs}{tails[step % _TEMPLATES]}\n"] * copies
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


def measure(argv: list[str], root: Path = ROOT) -> tuple[float, float, float, float, str]:
    """(wall s, CPU s, peak RSS MiB, peak RSS of the process tree MiB, stdout tail) of a child process.

    wait4's peak RSS is the largest one process reached (the child's or a worker's); the tree's peak is
    sampled every 20 ms while the child runs (Linux /proc), its workers' RSS added to its own. The CPU time
    includes the workers' (wait4 counts every waited-for descendant)."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "160"}
    start = time.perf_counter()
    # cwd: `python -m mftk` puts the working directory first on sys.path, before PYTHONPATH
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, cwd=root)
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


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def write_layout(tmp: Path, layout: str, *, size: int, steps: int | None) -> tuple[Path, Path, int]:
    """(what parse-log is given, one file of it for the floor, steps of all ranks) for `--layout`."""
    kind, _, n = layout.partition(":")
    n = int(n or 1)
    if kind == "one":
        return tmp / "worker_0.log", tmp / "worker_0.log", write_log(tmp / "worker_0.log", size=size, steps=steps)
    if kind == "ranks":
        total = sum(write_log(tmp / f"worker_{k}.log", size=size // n, steps=steps and steps // n) for k in range(n))
        return tmp, tmp / "worker_0.log", total
    path = tmp / "console.log"
    if kind == "interleaved":
        return path, path, n * write_log(path, size=size, steps=steps and steps // n, copies=n)
    if kind == "appended":
        parts = [tmp / f"part_{k}.log" for k in range(n)]
        total = sum(write_log(p, size=size // n, steps=steps and steps // n) for p in parts)
        with open(path, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while block := f.read(64 << 20):
                        out.write(block)
                p.unlink()
        return path, path, total
    raise SystemExit(f"--layout {layout}: use one, ranks:N, interleaved:N or appended:N")


def bench_size(gb: float, args: argparse.Namespace) -> None:
    """One log of `gb` GB: the floor, then `--repeat` rounds of parse-log (and the baseline's, alternating)."""
    with tempfile.TemporaryDirectory(prefix="mftk-bench-log-") as tmp:
        t0 = time.perf_counter()
        path, one, steps = write_layout(Path(tmp), args.layout, size=int(gb * 1e9), steps=args.steps)
        mb = sum(p.stat().st_size for p in ([path] if path.is_file() else path.glob("*.log"))) / 1e6
        print(f"\n== log ({args.layout}): {steps:,} steps, {mb:,.0f} MB, written in {time.perf_counter() - t0:.1f} s; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        py = sys.executable
        floor_mb = min(args.floor_mb, one.stat().st_size / 1e6)
        f_wall, f_cpu, f_rss, _, _ = measure([py, "-c", FLOOR, str(one), str(int(floor_mb * 1e6))])
        print(f"(f) one-field regex line loop, first {floor_mb:,.0f} MB: {floor_mb / f_wall:6.1f} MB/s wall, "
              f"{floor_mb / f_cpu:6.1f} MB/s per CPU-second, peak RSS {f_rss:,.0f} MiB", flush=True)
        trees = {"new": ROOT, **({"baseline": Path(args.baseline).resolve()} if args.baseline else {})}
        trees = {k: v for k, v in trees.items() if k in args.runs.split(",")}
        runs: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in trees}
        for r in range(args.repeat):
            for name, root in trees.items():
                wall, cpu, rss, tree, _ = measure([py, "-m", "mftk", "parse-log", str(path)], root)
                runs[name].append((wall, cpu, rss, tree))
                print(f"  round {r + 1} {name:8s}: {mb / wall:6.1f} MB/s wall ({wall:.1f} s), {mb / cpu:6.1f} MB/s "
                      f"per CPU-second, peak RSS {rss:,.0f} MiB (process tree {tree:,.0f} MiB); load "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
    med = {}
    for name, got in runs.items():
        wall = _median([g[0] for g in got])
        cpu = _median([g[1] for g in got])
        rss, tree = max(g[2] for g in got), max(g[3] for g in got)
        med[name] = mb / wall
        print(f"(c) {name} parse-log, {gb:g} GB, median of {len(got)}: {mb / wall:6.1f} MB/s wall, "
              f"{mb / cpu:6.1f} MB/s per CPU-second, peak RSS {rss:,.0f} MiB (process tree {tree:,.0f} MiB); "
              f"goal >= 50 MB/s, < 500 MiB")
    if "baseline" in med and "new" in med:
        print(f"ratio new / baseline (median wall MB/s): {med['new'] / med['baseline']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", default="2,4", help="comma list of log sizes in GB (1e9 bytes); default 2,4")
    ap.add_argument("--steps", type=int, default=None, help="a log of this many steps instead of --gb")
    ap.add_argument("--repeat", type=int, default=3, help="parse-log runs per log (medians printed)")
    ap.add_argument("--baseline", default=None, help="another mftk source tree, run alternately for a ratio")
    ap.add_argument("--runs", default="new,baseline", help="which trees to run: new, baseline or both")
    ap.add_argument("--floor-mb", type=float, default=200, help="MB read by the one-field regex floor")
    ap.add_argument("--layout", default="one", help="one, ranks:N, interleaved:N or appended:N (see above)")
    args = ap.parse_args()
    for gb in [float(g) for g in args.gb.split(",")]:
        bench_size(gb, args)
    print("the logs were deleted")


if __name__ == "__main__":
    main()
