"""Run every implemented config field's proving test under its "forgetting" mutant; list the fields that survive.

Usage: python scripts/field_effects.py [--fast | --slow | --ci] [--field PATH ...] [--shard I/N] [--skip-baseline]
                                       [--list] [--json FILE] [--save-seconds]

The status table (`mftk/config/status.py`) names, for each ``implemented`` field, the pytest node id of the
test that proves its effect. For each field this script runs that test twice in one pytest session: once as
it is (it must pass: a failing baseline proves nothing), then with ``MFTK_TEST_FORGET_FIELD=<field>``, which
makes config loading reset the field to its default after validation (`mftk/config/mutant.py`). The mutant
must fail. A field whose test still passes under its mutant *survives*: the test does not show the field
has an effect. Fields implemented for their default value only (``only`` rows) have nothing to forget:
their proof is the refusal of any other value (`tests/config/test_status.py`).

--fast   only the rows not marked ``slow`` (the proving test runs in under ~5 s here).
--slow   only the rows marked ``slow`` (multi-process msrun jobs and the LoRA base/adapter runs; the mutant
         reaches every worker: `engine.launch` starts msrun with this process's environment, msrun starts
         the workers with its own, and each worker loads the config through `load.load_data`).
--ci     what CI runs (`tests/config/test_field_effects.py`): the fast rows, fastest first as measured in
         `scripts/field_effects_seconds.json`, until their runs sum to ``CI_BUDGET_S`` (800 s measured at load ~28, ~5 s a field on a quiet machine); `--ci --list`
         names them, `--fast` runs them all.
--field  only these fields (repeatable).
--shard  run the I-th of N equal parts of the fields (1-based), e.g. to use two processes.
--skip-baseline  do not run each test unmutated first (when the suite has just shown they pass).
--list   print field → node id and exit.
--json   also write every field's outcome and seconds to FILE.
--save-seconds  record the fast fields' measured mutant seconds in `scripts/field_effects_seconds.json`
         (run with --fast --skip-baseline in one process, on a quiet machine if there is one).

Each pytest session runs in a worker process; after an engine error (a mutant that crashes MindSpore can
leave its state broken for the next run) or a failing baseline, a fresh worker goes on with the fields left.
mftk's own config and derivation errors do not count: they are raised before the engine steps.

Exit code 0 when no field survives, 1 otherwise. Prints each field's outcome, the survivors, and the time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mftk.config.mutant import ENV  # noqa: E402
from mftk.config.status import proving_tests  # noqa: E402

# Each fast field's mutant run, measured by `--save-seconds` (one process on the shared 2-core machine):
# what `--ci` picks from. CI's budget: the fastest fast fields whose runs sum to at most this.
SECONDS_FILE = ROOT / "scripts" / "field_effects_seconds.json"
# The seconds were measured at load ~28 on 2 cores, where a run gets ~0.21 of a core (its CPU/wall ratio), ~4-5x
# a quiet machine's wall time: 800 s takes every field measured at up to ~20 s there, ~5 s on a quiet machine
# (the "proving test under ~5 s"): 159 of the 182 fast fields, ~3 CPU-minutes.
CI_BUDGET_S = 800.0


def ci_fields(fast: list[str], measured: dict[str, float],
              budget_s: float = CI_BUDGET_S) -> tuple[list[str], list[str]]:
    """(the fast fields CI runs, the ones left to this script): ascending by measured seconds until their sum
    would pass ``budget_s``. A field not measured yet (a new row) is taken first, at the median's cost: its
    row says its test is fast, and a new field should be checked at once."""
    known = sorted(measured.values())
    guess = known[len(known) // 2] if known else 2.0
    order = sorted(fast, key=lambda f: (f in measured, measured.get(f, guess), f))
    picked, total = [], 0.0
    for f in order:
        cost = measured.get(f, guess)
        if total + cost > budget_s:
            break
        picked.append(f)
        total += cost
    return [f for f in fast if f in picked], [f for f in fast if f not in picked]


class MutantRunner:
    """A pytest plugin that runs each collected item once unmutated, then once per field it proves."""

    def __init__(self, jobs: dict[str, list[str]], baseline: bool = True, out: str | None = None) -> None:
        self.jobs, self.baseline, self.out = jobs, baseline, out
        self.results: dict[str, str] = {}  # field → killed / survived / killed (crash: …) / baseline failed / …
        self.seconds: dict[str, float] = {}  # node id → baseline seconds
        self.field_seconds: dict[str, float] = {}  # field → seconds of its mutant run
        self.field_cpu_seconds: dict[str, float] = {}  # field → CPU seconds of its mutant run (all threads)
        self.seen: set[str] = set()

    def pytest_runtestloop(self, session):  # noqa: ANN001 - pytest hook
        from _pytest.runner import runtestprotocol

        for item in session.items:
            fields = self.jobs.get(item.nodeid)
            if not fields:
                continue
            self.seen.add(item.nodeid)
            if self.baseline:
                t0 = time.perf_counter()
                base = runtestprotocol(item, nextitem=None, log=False)
                self.seconds[item.nodeid] = time.perf_counter() - t0
                if not all(r.passed for r in base if r.when == "call") or any(r.failed for r in base):
                    for f in fields:
                        self.results[f] = "baseline failed (the test fails without a mutant)"
                        _progress(f, self.results[f])
                    self._save()
                    return True  # a fresh process goes on (this one's MindSpore state may be broken)
            for field in fields:
                os.environ[ENV] = field
                t0, c0 = time.perf_counter(), time.process_time()
                try:
                    reports = runtestprotocol(item, nextitem=None, log=False)
                finally:
                    del os.environ[ENV]
                self.field_seconds[field] = time.perf_counter() - t0
                self.field_cpu_seconds[field] = time.process_time() - c0
                self.seconds.setdefault(item.nodeid, self.field_seconds[field])
                self.results[field] = _outcome(reports)
                _progress(field, self.results[field])
                self._save()
                if self.results[field].startswith("killed (error") and not _refused_early(self.results[field]):
                    return True  # an engine error can leave MindSpore's state broken: a fresh process goes on
        return True

    def _save(self) -> None:
        if self.out:
            Path(self.out).write_text(json.dumps({"results": self.results, "seconds": self.seconds,
                                                   "field_seconds": self.field_seconds,
                                                   "field_cpu_seconds": self.field_cpu_seconds}))


def _progress(field: str, result: str) -> None:
    print(f"[field_effects] {result}: {field}", file=sys.stderr, flush=True)


# mftk's own refusals (a config or derivation error): raised by the checks before the engine steps, they leave
# MindSpore as it was, so the same process goes on (each restart costs a MindSpore import).
_CLEAN_ERRORS = ("mftk.errors.", "mftk.derive.DeriveError")


def _refused_early(result: str) -> bool:
    return result.startswith(tuple(f"killed (error: {e}" for e in _CLEAN_ERRORS))


def _outcome(reports) -> str:  # noqa: ANN001
    failed = [r for r in reports if r.failed]
    if not failed:
        return "survived"
    text = str(failed[0].longrepr)
    if "AssertionError" in text or "assert " in text or "Failed: DID NOT RAISE" in text:
        return "killed"
    last = [line for line in text.splitlines() if line.startswith("E ")]
    return f"killed (error: {last[-1][2:].strip()[:100] if last else 'see the test'})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--slow", action="store_true")
    ap.add_argument("--field", action="append", default=[])
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--shard", default="1/1")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--json", default="", help="also write every field's outcome and seconds to this file")
    ap.add_argument("--ci", action="store_true")
    ap.add_argument("--save-seconds", action="store_true")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)  # internal: one pytest session, results here
    args = ap.parse_args(argv)
    rows = {f: (node, slow) for f, node, slow in proving_tests()}
    if args.field:
        unknown = [f for f in args.field if f not in rows]
        if unknown:
            print(f"not implemented fields (no proving test): {unknown}")
            return 2
        rows = {f: rows[f] for f in args.field}
    if args.fast or args.slow or args.ci:
        rows = {f: r for f, r in rows.items() if r[1] == args.slow}
    if args.ci:
        picked, _ = ci_fields(list(rows), _measured())
        rows = {f: rows[f] for f in picked}
    i, n = (int(x) for x in args.shard.split("/"))
    rows = {f: r for k, (f, r) in enumerate(rows.items()) if k % n == i - 1}
    if args.list:
        for f, (node, slow) in rows.items():
            print(f"{f}\t{node}{'  (slow)' if slow else ''}")
        return 0
    if args.worker:
        return _worker(rows, args.worker, baseline=not args.skip_baseline)
    t0 = time.perf_counter()
    got = _run_in_processes(list(rows), skip_baseline=args.skip_baseline)
    elapsed = time.perf_counter() - t0
    if args.json:
        Path(args.json).write_text(json.dumps({"elapsed": elapsed, **got}, indent=1, sort_keys=True))
    if args.save_seconds:
        fast = {f for f, (_, slow) in rows.items() if not slow}
        kept = {f: s for f, s in _measured().items() if f not in fast}
        kept.update({f: round(s, 2) for f, s in got["field_seconds"].items() if f in fast})
        SECONDS_FILE.write_text(json.dumps(dict(sorted(kept.items())), indent=1) + "\n")
    jobs: dict[str, list[str]] = {}
    for f, (node, _) in rows.items():
        jobs.setdefault(node, []).append(f)
    runner = argparse.Namespace(**got)
    print()
    for f in rows:
        node = rows[f][0]
        secs = runner.field_seconds.get(f, runner.seconds.get(node, 0.0))
        print(f"{runner.results.get(f, 'not run'):<40} {f}  ({node}, {secs:.1f}s)")
    survivors = [f for f in rows if not runner.results.get(f, "").startswith("killed")]
    slow_fast = [n for n, s in runner.seconds.items() if s > 5.0 and not any(rows[f][1] for f in jobs[n])]
    cpu = sum(runner.field_cpu_seconds.values())
    print(f"\n{len(rows)} fields, {len(jobs)} tests, {elapsed:.0f}s (mutant runs: {cpu:.0f} CPU s in this "
          f"process); surviving or unproven: {len(survivors)}")
    for f in survivors:
        print(f"  {f}: {runner.results.get(f, 'not run')}")
    if slow_fast:
        print(f"tests over 5 s in rows not marked slow: {slow_fast}")
    return 1 if survivors else 0


def _measured() -> dict[str, float]:
    return json.loads(SECONDS_FILE.read_text()) if SECONDS_FILE.exists() else {}


def _worker(rows: dict, out: str, *, baseline: bool) -> int:
    """One pytest session over ``rows``' tests; stops early after an engine error (see `MutantRunner`)."""
    import pytest

    jobs: dict[str, list[str]] = {}
    for f, (node, _) in rows.items():
        jobs.setdefault(node, []).append(f)
    runner = MutantRunner(jobs, baseline=baseline, out=out)
    os.chdir(ROOT)
    pytest.main([*jobs, "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts="], plugins=[runner])
    runner._save()
    return 0


def _run_in_processes(fields: list[str], *, skip_baseline: bool) -> dict[str, dict]:
    """Every field's outcome (``results``), its tests' baseline seconds (``seconds``) and its mutant run's seconds
    (``field_seconds``, ``field_cpu_seconds``), from as many fresh worker processes as engine errors require."""
    got_all: dict[str, dict] = {"results": {}, "seconds": {}, "field_seconds": {}, "field_cpu_seconds": {}}
    remaining = fields
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        while remaining:
            out.write_text(json.dumps({"results": {}, "seconds": {}, "field_seconds": {}, "field_cpu_seconds": {}}))
            cmd = [sys.executable, __file__, "--worker", str(out), *[a for f in remaining for a in ("--field", f)]]
            subprocess.run(cmd + (["--skip-baseline"] if skip_baseline else []), cwd=ROOT,
                           stdout=subprocess.DEVNULL)
            got = json.loads(out.read_text())
            if not got["results"]:
                for f in remaining:
                    got_all["results"][f] = "not run (the worker process failed)"
                break
            for key in got_all:
                got_all[key].update(got[key])
            remaining = [f for f in remaining if f not in got_all["results"]]
    return got_all

if __name__ == "__main__":
    sys.exit(main())
