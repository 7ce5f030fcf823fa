"""Benchmark: `mftk preprocess` end to end vs the tokenizer alone (the ceiling), side by side.

    python bench/preprocess.py [--mb 50] [--repeats 3] [--workers 2] [--vocab-size 32000] [--workdir DIR]

Builds a deterministic corpus of real text that ships with Python (pydoc topics + standard-library
sources, cut into ~4 KB documents, repeated to --mb megabytes of JSONL), trains a byte-level BPE on
its first 8 MB, then alternates (a) ``encode_batch_fast`` over all texts already in memory on
--workers threads, and (b) ``mftk preprocess`` as a fresh process with --workers (start-up, JSON
parsing and writing included). Prints tokens/s of each, the ratio b/a (medians) and the peak RSS of b.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_corpus(path: Path, megabytes: int) -> list[str]:
    sys.path.insert(0, str(ROOT / "examples"))
    import make_data

    texts = []
    for doc in make_data.corpus_documents(30_000_000):
        paragraphs, current = doc["text"].split("\n\n"), ""
        for p in paragraphs:
            current = f"{current}\n\n{p}" if current else p
            if len(current) >= 4000:
                texts.append(current)
                current = ""
        if current:
            texts.append(current)
    out, size, i = [], 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while size < megabytes * 1_000_000:
            line = json.dumps({"text": texts[i % len(texts)]}, ensure_ascii=False) + "\n"
            f.write(line)
            out.append(texts[i % len(texts)])
            size += len(line.encode("utf-8"))
            i += 1
    return out


def train(texts: list[str], vocab_size: int, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sample, size = [], 0
    for t in texts:
        sample.append(t)
        size += len(t)
        if size > 8_000_000:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(sample, trainer)
    tok.save(str(path))


def run_a(tokenizer: Path, texts: list[str]) -> tuple[float, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 2000):
        tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i:i + 2000]))
    return time.perf_counter() - t0, tokens


def run_b(tokenizer: Path, corpus: Path, out: Path, workers: int) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "mftk", "preprocess", "-i", str(corpus), "-t", str(tokenizer), "-o", str(out),
           "--workers", str(workers), "--json"]
    t0 = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - t0
    if result.returncode != 0:
        sys.exit(f"mftk preprocess failed:\n{result.stderr}")
    return elapsed, json.loads(result.stdout)["sources"][0]["outputs"][0]["tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.workers)  # before the tokenizer's pool starts
    work = args.workdir or Path(tempfile.mkdtemp(prefix="mftk-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer = work / "corpus.jsonl", work / "tokenizer.json"
    t0 = time.perf_counter()
    texts = build_corpus(corpus, args.mb)
    train(texts, args.vocab_size, tokenizer)
    print(f"corpus {corpus.stat().st_size / 1e6:.1f} MB, {len(texts):,} documents, "
          f"BPE {args.vocab_size} trained ({time.perf_counter() - t0:.1f} s); workers={args.workers}")
    a_times, b_times = [], []
    tokens = 0
    for r in range(args.repeats):  # interleaved a, b, a, b ... so drift in machine load hits both
        ta, tokens = run_a(tokenizer, texts)
        tb, tokens_b = run_b(tokenizer, corpus, work / "out", args.workers)
        assert tokens_b == tokens, (tokens_b, tokens)
        a_times.append(ta)
        b_times.append(tb)
        print(f"  run {r + 1}: a {tokens / ta / 1e6:.3f} M tokens/s   b {tokens / tb / 1e6:.3f} M tokens/s   "
              f"b/a {ta / tb:.3f}")
    ta, tb = statistics.median(a_times), statistics.median(b_times)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"tokens: {tokens:,}")
    print(f"(a) tokenizer alone, encode_batch_fast, in memory: {tokens / ta / 1e6:.3f} M tokens/s (median {ta:.2f} s)")
    print(f"(b) mftk preprocess end to end (fresh process):    {tokens / tb / 1e6:.3f} M tokens/s (median {tb:.2f} s)")
    print(f"ratio b/a: {ta / tb:.3f}   peak RSS of mftk preprocess: {rss:.0f} MiB")


if __name__ == "__main__":
    main()
