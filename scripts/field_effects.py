"""Run every implemented config field's proving test under its "forgetting" mutant; list the fields that survive.

Usage: python scripts/field_effects.py [--fast] [--field PATH ...] [--shard I/N] [--skip-baseline] [--list]

The status table (`mftk/config/status.py`) names, for each ``implemented`` field, the pytest node id of the
test that proves its effect. For each field this script runs that test twice in one pytest session: once as
it is (it must pass: a failing baseline proves nothing), then with ``MFTK_TEST_FORGET_FIELD=<field>``, which
makes config loading reset the field to its default after validation (`mftk/config/mutant.py`). The mutant
must fail. A field whose test still passes under its mutant *survives*: the test does not show the field
has an effect. Fields implemented for their default value only (``only`` rows) have nothing to forget:
their proof is the refusal of any other value (`tests/config/test_status.py`).

--fast   only the rows not marked ``slow`` (the proving test runs in under ~5 s here): what CI runs
         (`tests/config/test_field_effects.py`).
--field  only these fields (repeatable).
--shard  run the I-th of N equal parts of the fields (1-based), e.g. to use two processes.
--skip-baseline  do not run each test unmutated first (when the suite has just shown they pass).
--list   print field → node id and exit.

Each pytest session runs in a worker process; after an engine error (a mutant that crashes MindSpore can
leave its state broken for the next run) or a failing baseline, a fresh worker goes on with the fields left.

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


class MutantRunner:
    """A pytest plugin that runs each collected item once unmutated, then once per field it proves."""

    def __init__(self, jobs: dict[str, list[str]], baseline: bool = True, out: str | None = None) -> None:
        self.jobs, self.baseline, self.out = jobs, baseline, out
        self.results: dict[str, str] = {}  # field → killed / survived / killed (crash: …) / baseline failed / …
        self.seconds: dict[str, float] = {}  # node id → baseline seconds
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
                t0 = time.perf_counter()
                try:
                    reports = runtestprotocol(item, nextitem=None, log=False)
                finally:
                    del os.environ[ENV]
                self.seconds.setdefault(item.nodeid, time.perf_counter() - t0)
                self.results[field] = _outcome(reports)
                _progress(field, self.results[field])
                self._save()
                if self.results[field].startswith("killed (error"):
                    return True  # an engine error can leave MindSpore's state broken: a fresh process goes on
        return True

    def _save(self) -> None:
        if self.out:
            Path(self.out).write_text(json.dumps({"results": self.results, "seconds": self.seconds}))


def _progress(field: str, result: str) -> None:
    print(f"[field_effects] {result}: {field}", file=sys.stderr, flush=True)


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
    ap.add_argument("--field", action="append", default=[])
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--shard", default="1/1")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)  # internal: one pytest session, results here
    args = ap.parse_args(argv)
    rows = {f: (node, slow) for f, node, slow in proving_tests()}
    if args.field:
        unknown = [f for f in args.field if f not in rows]
        if unknown:
            print(f"not implemented fields (no proving test): {unknown}")
            return 2
        rows = {f: rows[f] for f in args.field}
    if args.fast:
        rows = {f: r for f, r in rows.items() if not r[1]}
    i, n = (int(x) for x in args.shard.split("/"))
    rows = {f: r for k, (f, r) in enumerate(rows.items()) if k % n == i - 1}
    if args.list:
        for f, (node, slow) in rows.items():
            print(f"{f}\t{node}{'  (slow)' if slow else ''}")
        return 0
    if args.worker:
        return _worker(rows, args.worker, baseline=not args.skip_baseline)
    t0 = time.perf_counter()
    results, seconds = _run_in_processes(list(rows), skip_baseline=args.skip_baseline)
    elapsed = time.perf_counter() - t0
    jobs: dict[str, list[str]] = {}
    for f, (node, _) in rows.items():
        jobs.setdefault(node, []).append(f)
    runner = argparse.Namespace(results=results, seconds=seconds)
    print()
    for f in rows:
        node = rows[f][0]
        print(f"{runner.results.get(f, 'not run'):<40} {f}  ({node}, {runner.seconds.get(node, 0.0):.1f}s)")
    survivors = [f for f in rows if not runner.results.get(f, "").startswith("killed")]
    slow_fast = [n for n, s in runner.seconds.items() if s > 5.0 and not any(rows[f][1] for f in jobs[n])]
    print(f"\n{len(rows)} fields, {len(jobs)} tests, {elapsed:.0f}s; surviving or unproven: {len(survivors)}")
    for f in survivors:
        print(f"  {f}: {runner.results.get(f, 'not run')}")
    if slow_fast:
        print(f"tests over 5 s in rows not marked slow: {slow_fast}")
    return 1 if survivors else 0


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


def _run_in_processes(fields: list[str], *, skip_baseline: bool) -> tuple[dict[str, str], dict[str, float]]:
    """Every field's outcome, from as many fresh worker processes as engine errors require."""
    results: dict[str, str] = {}
    seconds: dict[str, float] = {}
    remaining = fields
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        while remaining:
            out.write_text(json.dumps({"results": {}, "seconds": {}}))
            cmd = [sys.executable, __file__, "--worker", str(out), *[a for f in remaining for a in ("--field", f)]]
            subprocess.run(cmd + (["--skip-baseline"] if skip_baseline else []), cwd=ROOT,
                           stdout=subprocess.DEVNULL)
            got = json.loads(out.read_text())
            if not got["results"]:
                for f in remaining:
                    results[f] = "not run (the worker process failed)"
                break
            results.update(got["results"])
            seconds.update(got["seconds"])
            remaining = [f for f in remaining if f not in results]
    return results, seconds


if __name__ == "__main__":
    sys.exit(main())
