"""Benchmark: `mftk preprocess` end to end against the tokenizer limits, side by side.

    python bench/preprocess.py [--mb 50] [--repeats 3] [--workers 2] [--vocab-size 32000] [--only awbcdgvj]
                               [--workdir DIR]

Builds a deterministic corpus of real text that ships with Python (pydoc topics + standard-library
sources, cut into ~4 KB documents, repeated to --mb megabytes of JSONL), trains a byte-level BPE on
its first 8 MB, then runs, interleaved round by round (medians reported):

  (a) gigatoken ``encode_files(JsonlFileSource(corpus, field="text"))``: the JSONL file straight to
      token arrays, tokenizer already loaded (afresh before each round, untimed); the limit for any
      tool that reads JSONL;
  (w) the same with one tokenizer kept over the rounds, as (a) was measured before: from the second
      round on, gigatoken's memo of the words it has seen already holds this corpus's words, which
      no run of a tool starts with (shown for comparison with the older figures);
  (b) HF tokenizers ``encode_batch_fast`` over the texts already in memory (the old ceiling);
  (c) ``mftk preprocess`` as a fresh process, backend auto (start-up, backend check, validation of
      every line, writing included); run with ``--json`` and stdout/stderr into files, as in a
      pipeline, so it draws nothing and does not import Rich (a run on a terminal pays ~0.02-0.03 s
      more CPU for its table and progress bar); the last round's output is removed first, untimed
      (`remove_previous`), as a run to a new prefix finds none;
  (d) ``mftk preprocess --tokenizer-backend hf``, the same way;
  (g) gigatoken's own ``encode_files`` as a fresh process the same way (interpreter start, ``import
      gigatoken``, tokenizer load, encode, the ids written to a file; no validation, no ``.idx``):
      what a script built directly on gigatoken costs end to end, the fresh-process counterpart of (a);
  (v) validation alone: mftk's reader over the corpus (read + parse + check every line), in process;
  (j) the same parse with the standard library (``json.loads`` per line), to show what msgspec buys.

Before measuring, mftk's own modules are byte-compiled (``compileall``), as an installed package's
are (pip compiles on install): where PYTHONDONTWRITEBYTECODE is set, every fresh (c)/(d) process
would otherwise compile them from source, 0.3-0.4 s of CPU no user pays. The 1-minute load
average of the machine is printed with every round (a shared machine's other load shows there).

Prints each throughput, the ratios c/a, c/w, c/b, c/d, c/g, where (c)'s wall time goes (process start-up,
imports and exit: c minus the run's own ``wall_s``; set-up: tokenizers loaded and backend chosen, the
run's ``setup_s``; the read-parse-encode-write pass: the rest), checks that the .bin/.idx of (c) and (d) are
byte-identical, the CPU seconds of (a) and (c) (less sensitive to other load on a shared machine than
wall time), and the peak RSS of the (c) process tree (its rusage, from a small helper
process that starts it). --workers sets the threads of
every tokenizer (RAYON_NUM_THREADS). --only picks a subset (e.g. ``--only ac`` for large corpora,
where (b) and (d) take minutes).
"""
from __future__ import annotations

import argparse
import json
import os
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


def _cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_a(gtok, corpus: Path) -> tuple[float, float, int]:
    """(seconds, CPU seconds, tokens) of gigatoken's encode_files with ``gtok``."""
    import gigatoken

    t0, c0 = time.perf_counter(), _cpu()
    result = gtok.encode_files(gigatoken.JsonlFileSource([str(corpus)], field="text"))
    elapsed, cpu = time.perf_counter() - t0, _cpu() - c0
    return elapsed, cpu, len(result.layout.content)


def run_b(hf, texts: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 2000):
        tokens += sum(len(e.ids) for e in hf.encode_batch_fast(texts[i:i + 2000]))
    return time.perf_counter() - t0, tokens


def run_v(corpus: Path) -> float:
    from mftk.data.jsonl import CorpusReader

    t0 = time.perf_counter()
    reader = CorpusReader(corpus, ["text"])
    docs = sum(chunk.documents for chunk in reader)
    reader.close()
    assert docs > 0
    return time.perf_counter() - t0


# A tiny helper started before the benchmark grows runs each measured command and reports the
# command's own rusage: a child forked from this large process would inherit its RSS high-water
# mark across exec, so ru_maxrss of a direct child would not be the child's.
class Spawner:
    """Runs commands from a small helper process; reports wall time and the tree's peak RSS."""

    CODE = r"""
import json, os, subprocess, sys, time
for line in sys.stdin:
    cmd, env, cwd = json.loads(line)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=open(cwd + "/.out", "wb"), stderr=open(cwd + "/.err", "wb"), env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    print(json.dumps([os.waitstatus_to_exitcode(status), seconds, usage.ru_maxrss,
                      usage.ru_utime + usage.ru_stime]), flush=True)
"""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def run(self, cmd: list[str], env: dict, work: Path) -> tuple[int, float, float, float, str, str]:
        """(exit code, seconds, CPU seconds, peak RSS MiB of the command and the children it waited for,
        stdout, stderr)."""
        self.proc.stdin.write(json.dumps([cmd, env, str(work)]) + "\n")
        self.proc.stdin.flush()
        code, seconds, maxrss_kib, cpu = json.loads(self.proc.stdout.readline())
        return code, seconds, cpu, maxrss_kib / 1024, (work / ".out").read_text(), (work / ".err").read_text()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def run_j(corpus: Path) -> float:
    t0 = time.perf_counter()
    with open(corpus, "rb") as f:
        docs = sum(isinstance(json.loads(line).get("text"), str) for line in f)
    assert docs > 0
    return time.perf_counter() - t0


def run_mftk(spawner: Spawner, tokenizer: Path, corpus: Path, out: Path, workers: int,
             backend: str) -> tuple[float, float, int, float, str, tuple[float, float]]:
    """(seconds, CPU seconds, tokens, peak RSS MiB, backend used, (run wall_s, setup_s)) of one fresh
    `mftk preprocess` process."""
    cmd = [sys.executable, "-m", "mftk", "preprocess", "-i", str(corpus), "-t", str(tokenizer), "-o", str(out),
           "--workers", str(workers), "--tokenizer-backend", backend, "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    remove_previous([Path(f"{out}_text_document.{ext}") for ext in ("bin", "idx")])
    code, seconds, cpu, peak, stdout, stderr = spawner.run(cmd, env, out.parent)
    if code != 0:
        sys.exit(f"mftk preprocess failed:\n{stderr}")
    data = json.loads(stdout)
    return (seconds, cpu, data["sources"][0]["outputs"][0]["tokens"], peak, data["backend"],
            (data["wall_s"], data["setup_s"]))


def remove_previous(paths: list[Path]) -> None:
    """Delete the last round's output before a timed run, untimed: a run writing to a new prefix (the usual
    case) replaces nothing, while replacing a file here costs its deletion (16 ms per 23 MB on this disk,
    mounted with ``discard``), which (a) never pays."""
    for path in paths:
        path.unlink(missing_ok=True)


GIGATOKEN_SCRIPT = r"""
import sys
import numpy as np
import gigatoken
tok = gigatoken.Tokenizer.from_json(open(sys.argv[1], "rb").read())
ids = tok.encode_files(gigatoken.JsonlFileSource([sys.argv[2]], field="text"))
np.asarray(ids.layout.content.data).astype(np.uint16 if tok.vocab_size < 65500 else np.int32).tofile(sys.argv[3])
"""


def run_g(spawner: "Spawner", tokenizer: Path, corpus: Path, out: Path) -> float:
    """Seconds of one fresh process running gigatoken's encode_files on the corpus (`GIGATOKEN_SCRIPT`)."""
    out.mkdir(exist_ok=True)
    remove_previous([out / "ids.bin"])
    code, seconds, _, _, _, stderr = spawner.run([sys.executable, "-c", GIGATOKEN_SCRIPT, str(tokenizer), str(corpus),
                                                  str(out / "ids.bin")], dict(os.environ), out)
    if code != 0:
        sys.exit(f"gigatoken's script failed:\n{stderr}")
    return seconds


def breakdown(walls: list[float], inside: list[tuple[float, float]]) -> str:
    """Where (c)'s wall time went, medians over the rounds."""
    outside = statistics.median(w - own for w, (own, _) in zip(walls, inside))
    setup = statistics.median(s for _, s in inside)
    run = statistics.median(own - s for own, s in inside)
    return (f"(c) wall, medians: start-up+imports+exit {outside:.3f} s, set-up (tokenizers, backend check) "
            f"{setup:.3f} s, read-parse-encode-write {run:.3f} s")


def same_outputs(a: Path, b: Path) -> bool:
    return all(Path(f"{a}_text_document.{ext}").read_bytes() == Path(f"{b}_text_document.{ext}").read_bytes()
               for ext in ("bin", "idx"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--only", default="awbcdgvj", help="which measurements, a subset of awbcdgvj")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.workers)  # before any tokenizer's pool starts
    sys.path.insert(0, str(ROOT))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="mftk-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "mftk"), str(ROOT / "commands")], check=True)
    spawner = Spawner()  # before the corpus is in memory
    corpus, tokenizer = work / f"corpus{args.mb}.jsonl", work / "tokenizer.json"
    t0 = time.perf_counter()
    texts = build_corpus(corpus, args.mb)
    if not tokenizer.exists():
        train(texts, args.vocab_size, tokenizer)
    mb = corpus.stat().st_size / 1e6
    print(f"corpus {mb:.1f} MB, {len(texts):,} documents, BPE {args.vocab_size} ({time.perf_counter() - t0:.1f} s);"
          f" workers={args.workers}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")

    import gigatoken
    from tokenizers import Tokenizer

    gtok = gigatoken.Tokenizer.from_json(tokenizer.read_bytes())
    hf = Tokenizer.from_file(str(tokenizer))
    gtok.encode_batch(["warm up the pool and the awkward import"])
    times: dict[str, list[float]] = {k: [] for k in args.only}
    cpus: dict[str, list[float]] = {"a": [], "w": [], "c": []}  # CPU seconds: less sensitive to a shared machine
    inside: list[tuple[float, float]] = []  # (c)'s own (wall_s, setup_s)
    tokens: dict[str, int] = {}
    rss: list[float] = []
    backends = set()
    equal = None
    for r in range(args.repeats):  # interleaved, so drift in machine load hits every measurement alike
        row = []
        if "a" in args.only:
            t, cpu, tokens["a"] = run_a(gigatoken.Tokenizer.from_json(tokenizer.read_bytes()), corpus)
            times["a"].append(t)
            cpus["a"].append(cpu)
        if "w" in args.only:
            t, cpu, tokens["w"] = run_a(gtok, corpus)
            times["w"].append(t)
            cpus["w"].append(cpu)
        if "b" in args.only:
            t, tokens["b"] = run_b(hf, texts)
            times["b"].append(t)
        if "c" in args.only:
            t, cpu, tokens["c"], peak, backend, own = run_mftk(spawner, tokenizer, corpus, work / "c", args.workers,
                                                               "auto")
            times["c"].append(t)
            inside.append(own)
            cpus["c"].append(cpu)
            rss.append(peak)
            backends.add(backend)
        if "d" in args.only:
            t, _, tokens["d"], _, _, _ = run_mftk(spawner, tokenizer, corpus, work / "d", args.workers, "hf")
            times["d"].append(t)
        if "g" in args.only:
            times["g"].append(run_g(spawner, tokenizer, corpus, work / "g"))
        if "v" in args.only:
            times["v"].append(run_v(corpus))
        if "j" in args.only:
            times["j"].append(run_j(corpus))
        if "c" in args.only and "d" in args.only:
            equal = same_outputs(work / "c", work / "d") and (equal is not False)
        for k in args.only:
            row.append(f"{k} {mb / times[k][-1]:7.1f} MB/s")
        row += [f"c/{k} {times[k][-1] / times['c'][-1]:.2f}" for k in "awdg" if k in args.only and "c" in args.only]
        print(f"  round {r + 1}: " + "   ".join(row) + f"   (load {os.getloadavg()[0]:.1f})")
    spawner.close()
    if len(set(tokens.values())) > 1:
        sys.exit(f"token counts differ between measurements: {tokens}")
    med = {k: statistics.median(v) for k, v in times.items()}
    n = next(iter(tokens.values()), 0)
    names = {"a": "gigatoken encode_files, JSONL file -> arrays", "w": "the same, memo warm from earlier rounds",
             "b": "HF encode_batch_fast, texts in memory",
             "c": "mftk preprocess, backend auto (fresh process)", "d": "mftk preprocess --tokenizer-backend hf",
             "g": "gigatoken encode_files as a fresh process",
             "v": "mftk validation alone (read+parse every line)", "j": "json.loads per line (stdlib parse)"}
    print(f"tokens: {n:,}")
    for k in "awbcdgvj":
        if k in med:
            tok_s = f"{n / med[k] / 1e6:7.2f} M tokens/s" if k in "awbcdg" else " " * 18
            print(f"({k}) {names[k]:<47} {mb / med[k]:8.1f} MB/s {tok_s}  median {med[k]:.3f} s")
    ratios = [f"c/{k} {med[k] / med['c']:.3f}" for k in "awbdg" if k in med and "c" in med]
    if ratios:
        print("ratios (throughput of c over the other): " + "   ".join(ratios))
    if "c" in med:
        print("ratio spread over rounds: " + "   ".join(
            f"c/{k} {min(x / y for x, y in zip(times[k], times['c'])):.2f}-"
            f"{max(x / y for x, y in zip(times[k], times['c'])):.2f}" for k in "awdg" if k in med))
        print(breakdown(times["c"], inside))
    for k in "aw":
        if cpus[k] and cpus["c"]:
            ck, cc = statistics.median(cpus[k]), statistics.median(cpus["c"])
            print(f"CPU seconds (user+sys, medians): {k} {ck:.2f}, c {cc:.2f}; c/{k} by CPU time {ck / cc:.3f}")
    if "v" in med and "c" in med:
        print(f"validation alone is {med['v'] / med['c']:.0%} of (c)'s wall time (it overlaps the encoding there)")
    if rss:
        print(f"peak RSS of the (c) process tree: {max(rss):.0f} MiB; backend used by (c): {', '.join(backends)}")
    if equal is not None:
        print(f".bin/.idx of (c) and (d) byte-identical: {equal}")
        if not equal:
            sys.exit(1)


if __name__ == "__main__":
    main()
