"""Index-build time for a synthetic 1B-token corpus (goal: < 10 s), and the speed-up of the
vectorised sample index over a literal port of the reference's per-token-run loop.

Run: .venv/bin/python bench/index_build.py [--tokens 1e9] [--seq 4096]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from mftk.data import blend
from mftk.data.gpt_dataset import build_indices, build_sample_index


def literal_walk(sizes, doc_index, seq, epochs, tokens, extra=1):
    """The reference's C++ loop, in Python (drop-last, train split)."""
    count = (epochs * tokens - extra) // seq
    out = np.empty((count + 1, 2), dtype=np.int64)
    out[0] = 0
    di, off = 0, 0
    for k in range(count):
        rem = seq + extra
        while True:
            dl = sizes[doc_index[di]] - off
            rem -= dl
            if rem <= 0:
                off += rem + dl - extra
                break
            di += 1
            off = 0
        out[k + 1] = (di, off)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=float, default=1e9)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--mean-doc", type=int, default=800)
    args = ap.parse_args()

    rng = np.random.RandomState(0)
    ndocs = int(args.tokens / args.mean_doc)
    lengths = np.maximum(rng.exponential(args.mean_doc, ndocs), 1).astype(np.int32)
    total = int(lengths.sum(dtype=np.int64))
    print(f"corpus: {ndocs:,} sequences, {total:,} tokens, seq_length {args.seq}")

    for label, factor in (("1 epoch", 0.99), ("2.5 epochs", 2.5)):
        num_samples = int(total * factor) // args.seq
        t0 = time.perf_counter()
        ix = build_indices(lengths, np.arange(ndocs, dtype=np.int32), num_samples, args.seq, 1234)
        dt = time.perf_counter() - t0
        print(f"build_indices ({label}, {num_samples:,} samples, E={ix.epochs}): {dt:.2f} s "
              f"({'OK' if dt < 10 else 'over'} the 10 s goal)")

    # Side by side on a slice small enough for the literal loop.
    n = min(ndocs, 100_000)
    small = lengths[:n]
    doc_index = np.arange(n, dtype=np.int32)
    rng.shuffle(doc_index)
    tokens = int(small.sum(dtype=np.int64))
    t0 = time.perf_counter()
    fast = build_sample_index(small, doc_index, args.seq, 1, tokens)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = literal_walk(small.tolist(), doc_index.tolist(), args.seq, 1, tokens)
    t_slow = time.perf_counter() - t0
    assert np.array_equal(fast, slow)
    print(f"sample index on {tokens:,} tokens: vectorised {t_fast * 1e3:.1f} ms, literal loop "
          f"{t_slow * 1e3:.0f} ms, ratio {t_slow / max(t_fast, 1e-9):.0f}x (identical output)")

    size = max(int(total) // args.seq, 1)
    t0 = time.perf_counter()
    blend.build_blending_indices(blend.normalize([0.3, 0.7]), size)
    print(f"blending index, 2 sources, {size:,} samples: {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
