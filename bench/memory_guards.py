"""Memory guards that only process RSS can show, measured here rather than asserted in the suite (the suite
asserts nothing on RSS, wall time or throughput: those move with the machine's load).

    .venv/bin/python bench/memory_guards.py                 # both
    .venv/bin/python bench/memory_guards.py --fsdp-replay   # one

--fsdp-replay: two FSDP units whose layers `exclude_op` lists (12.8 M weights each: by hand 4 B × (4·1024²
  attention + 3·1024·2816 MLP) = 51 MB a layer), 5 steps in one process; prints the VmRSS growth from step 2
  to step 5 as a fraction of one layer's weights. A replay whose recorded graph is never released (the bug
  `engine.activation_checkpoint` guards against) grows by 2 layers a step: ~6.0; fixed: ~0.
--unique-words: `mftk preprocess` of ~100 MB of random 10-character words (gigatoken memoizes every distinct word
  without a bound: 1.9 GB for 150 MB before mftk bounded it); prints the peak RSS (goal < 1 GiB).
--long-line: `mftk preprocess` of one 50 MB JSON line against a one-line run, each a fresh process; prints
  the extra peak RSS (VmHWM) as a multiple of the line's size (was ~150× before issue 21; a few copies now).
"""
from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def fsdp_replay() -> float:
    import numpy as np

    from mftk.engine.memstat import status_bytes
    from mftk.engine.models.build import build_model
    from mftk.engine.parallel import fsdp
    from mftk.engine.recompute import apply_exclusions
    from tests.engine.test_fsdp_units import _groups, _Table
    from tests.helpers.models import RecomputeSection, lm_args, make_qwen3, value_and_grads

    cfg = make_qwen3(hidden_size=1024, intermediate_size=2816, num_attention_heads=8, num_key_value_heads=8,
                     head_dim=128)
    layer_bytes = 4 * (4 * 1024 * 1024 + 3 * 1024 * 2816)
    model = build_model(cfg, seed=0)
    apply_exclusions(model, RecomputeSection(mode="full", full_recompute_layer=["0-1"],
                                             exclude_op={"*linear_proj": ["0-1"]}))
    fsdp.apply_fsdp(model, _groups(), _Table(), sink=fsdp.GradSink())
    args = lm_args(cfg, np.random.default_rng(0))
    rss = []
    for _ in range(5):
        value_and_grads(model, args)
        gc.collect()
        rss.append(status_bytes("VmRSS"))
    return (rss[-1] - rss[1]) / layer_bytes


PEAK = textwrap.dedent("""
    import os, runpy, sys
    def report():
        peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
        print(f"VmHWM {peak}", file=sys.stderr, flush=True)
    real_exit = os._exit
    os._exit = lambda code: (report(), real_exit(code))  # a finished run ends without teardown
    sys.argv = ["mftk", *sys.argv[1:]]
    try:
        runpy.run_module("mftk", run_name="__main__")
    finally:
        report()
""")


def _peak_kib(*args: str) -> int:
    r = subprocess.run([sys.executable, "-c", PEAK, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    return int(r.stderr.rsplit("VmHWM ", 1)[1])


def long_line() -> float:
    tokenizer = ROOT / "mftk" / "templates" / "data"
    paragraph = "Ünïcödé words, numbers 12345 and 東京 in one very long document without a break.\n"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        line = json.dumps({"text": paragraph * (50_000_000 // len(paragraph.encode()))}, ensure_ascii=False)
        (tmp / "long.jsonl").write_text(line + "\n", encoding="utf-8")
        (tmp / "short.jsonl").write_text(json.dumps({"text": paragraph}) + "\n")
        size = (tmp / "long.jsonl").stat().st_size
        base = _peak_kib("preprocess", "-i", str(tmp / "short.jsonl"), "-o", str(tmp / "s"), "-t", str(tokenizer))
        peak = _peak_kib("preprocess", "-i", str(tmp / "long.jsonl"), "-o", str(tmp / "l"), "-t", str(tokenizer))
    return (peak - base) * 1024 / size


def unique_words() -> float:
    import base64
    import os

    tokenizer = ROOT / "mftk" / "templates" / "data"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with open(tmp / "random.jsonl", "w") as f:
            for _ in range(33_000):
                b = base64.b64encode(os.urandom(2250)).decode().replace("+", "a").replace("/", "b")
                f.write(json.dumps({"text": " ".join(b[i:i + 10] for i in range(0, len(b), 10))}) + "\n")
        return _peak_kib("preprocess", "-i", str(tmp / "random.jsonl"), "-o", str(tmp / "r"), "-t", str(tokenizer)) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsdp-replay", action="store_true")
    ap.add_argument("--long-line", action="store_true")
    ap.add_argument("--unique-words", action="store_true")
    a = ap.parse_args()
    both = not (a.fsdp_replay or a.long_line or a.unique_words)
    if both or a.fsdp_replay:
        print(f"fsdp replay: RSS growth steps 2-5 = {fsdp_replay():.2f} layers (leak: ~6, fixed: ~0)")
    if both or a.long_line:
        print(f"50 MB line: extra peak RSS = {long_line():.1f}x the line (was ~150x; goal < 10x)")
    if both or a.unique_words:
        print(f"100 MB of unique words: peak RSS {unique_words():.0f} MiB (was 1.9 GB for 150 MB; goal < 1024)")


if __name__ == "__main__":
    main()
