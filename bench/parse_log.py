"""parse-log reading speed on a synthetic MindSpore Transformers log (goal: 100k steps in a few s),
side by side with the floor of any line reader in Python: splitting the file into lines and
running the reference's own one-field regex `loss:\\s+(\\d+\\.\\d+)` on each.

Run: .venv/bin/python bench/parse_log.py [--steps 100000]
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mftk.logs.parse import parse_run  # noqa: E402
from mftk.logs.report import ParseOptions, analyze  # noqa: E402
from tests.helpers.logsynth import synth_lines  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "worker_0.log"
        path.write_text("\n".join(synth_lines(args.steps, noise_every=10)) + "\n")
        size_mb = path.stat().st_size / 1e6

        t0 = time.perf_counter()
        pattern = re.compile(r"loss:\s+(\d+\.\d+)")
        losses = [float(m.group(1)) for line in path.read_text().splitlines() if (m := pattern.search(line))]
        t_regex = time.perf_counter() - t0

        t0 = time.perf_counter()
        run = parse_run([path])
        t_parse = time.perf_counter() - t0

        t0 = time.perf_counter()
        analyze([run], ParseOptions())
        t_analyze = time.perf_counter() - t0

    assert len(losses) == len(run.records) == args.steps
    print(f"log: {args.steps:,} steps, {size_mb:.1f} MB")
    print(f"one-field regex (loss only):   {t_regex:6.2f} s")
    print(f"mftk parse (every field):      {t_parse:6.2f} s  ({args.steps / t_parse:,.0f} lines/s, "
          f"{t_parse / t_regex:.1f}x the one-field regex)")
    print(f"summary + anomalies:           {t_analyze:6.2f} s")


if __name__ == "__main__":
    main()
