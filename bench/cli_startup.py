"""Start-up cost of the CLI: `mftk --help` vs a bare interpreter, measured side by side.

The goal (issue 2) is `mftk --help` under 0.5 s; the bare interpreter is printed beside it so a
noisy machine shows up in both numbers. Usage: python bench/cli_startup.py [--repeats N]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _time(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    bare, helps, sub = [], [], []
    for _ in range(args.repeats):  # interleaved so load changes hit all three alike
        bare.append(_time([sys.executable, "-c", "pass"]))
        helps.append(_time([sys.executable, "-m", "mftk", "--help"]))
        sub.append(_time([sys.executable, "-m", "mftk", "train", "--help"]))
    b, h, s = (statistics.median(x) for x in (bare, helps, sub))
    print(f"python -c pass        median {b:.3f} s")
    print(f"mftk --help           median {h:.3f} s   ratio to bare {h / b:.1f}x   goal < 0.5 s: {'ok' if h < 0.5 else 'MISSED'}")
    print(f"mftk train --help     median {s:.3f} s   ratio to bare {s / b:.1f}x")


if __name__ == "__main__":
    main()
