"""`parse-log` as one library call: read runs, summarize, find anomalies, write exports and plots.

The command renders the returned `LogReport`; `--fail-on` is decided here (`matched`) and
turned into `AnomaliesFound` by `LogReport.raise_for_anomalies`, after the table is shown.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable

import attrs

from mftk.files import check_writable_target, write_atomic, write_atomic_with
from mftk.errors import AnomaliesFound, InputError
from mftk.logs import export
from mftk.logs.anomalies import KINDS, Anomaly, Thresholds, detect
from mftk.logs.parse import Run, collect, enable_spill, open_readers, parse_run, require_steps
from mftk.logs.summary import Summary, summarize


@attrs.define
class ParseOptions:
    """Everything `parse-log` can be asked; defaults are the documented ones."""

    fmt: str = "auto"
    compare: bool = False
    skip_warmup: int = 1
    peak_tflops: float | None = None
    seq_length: int | None = None
    world_size: int | None = None
    metrics: list[str] | None = None
    fail_on: list[str] = attrs.field(factory=list)
    thresholds: Thresholds = attrs.field(factory=Thresholds)
    x: str = "step"
    csv: Path | None = None
    json: Path | None = None
    jsonl: Path | None = None
    plot: Path | None = None


@attrs.define
class RunReport:
    name: str
    run: Run
    series: list[dict[str, Any]]  # the primary rank, one record per step
    summary: Summary
    anomalies: list[Anomaly]
    plot_series: list[dict[str, Any]] | None = None  # a spilled run's bounded plot series (else `series`)

    def all_steps(self) -> Iterable[dict[str, Any]]:
        """Every rank's records (resumed steps de-duplicated), sorted by step then rank; of a spilled run, an
        iterator reading its segments one at a time."""
        if self.run.spilled:
            from mftk.logs.stream import iter_steps

            return iter_steps(self.run)
        rows = [r for rank in self.run.ranks for r in self.run.series(rank)]
        return sorted(rows, key=lambda r: (r["step"], r["rank"]))

    def export_keys(self, metrics: list[str] | None) -> list[str] | None:
        """The export columns of a spilled run (read from its segments' columns); None: from the records."""
        if not self.run.spilled:
            return None
        from mftk.logs.stream import column_keys

        return export.columns([dict.fromkeys(column_keys(self.run))], metrics)

    def to_json(self, metrics: list[str] | None = None) -> dict[str, Any]:
        return {
            "name": self.name,
            "steps": export.steps_json(self.all_steps(), metrics, self.export_keys(metrics)),
            "summary": export.attrs_json(self.summary),
            "anomalies": [export.attrs_json(a) for a in self.anomalies],
            "files": [attrs.asdict(f) for f in self.run.files],
            "warnings": self.run.warnings,
        }


@attrs.define
class LogReport:
    runs: list[RunReport]
    options: ParseOptions
    matched: list[str] = attrs.field(factory=list)  # --fail-on kinds that were found
    written: list[str] = attrs.field(factory=list)

    def to_json(self) -> dict[str, Any]:
        """One run: {"steps", "summary", "anomalies", ...}; several (--compare): {"runs": [...]}."""
        runs = [r.to_json(self.options.metrics) for r in self.runs]
        return runs[0] if len(runs) == 1 else {"runs": runs}

    def raise_for_anomalies(self) -> None:
        if self.matched:
            steps = sorted({a.step for r in self.runs for a in r.anomalies if a.kind in self.matched})
            shown = ", ".join(map(str, steps[:10])) + (" ..." if len(steps) > 10 else "")
            raise AnomaliesFound(message=f"anomalies found: {', '.join(self.matched)} (steps {shown})",
                                 kinds=list(self.matched),
                                 hint="see the anomaly list above; drop the kind from --fail-on to accept it")


def check_options(options: ParseOptions) -> None:
    """Reject unknown --fail-on kinds before reading anything."""
    unknown = [k for k in options.fail_on if k not in KINDS and k != "all"]
    if unknown:
        raise InputError(message=f"unknown --fail-on kind(s): {', '.join(unknown)}",
                         hint=f"choose from: all, {', '.join(KINDS)}")
    if options.skip_warmup < 0:
        raise InputError(message=f"--skip-warmup must be >= 0, got {options.skip_warmup}")
    for target in (options.csv, options.jsonl, options.json, options.plot):
        if target:
            check_writable_target(target)  # before reading (or following) anything


def _check_metrics(runs: list[Run], metrics: list[str] | None) -> None:
    if not metrics:
        return
    present = {k for run in runs for r in _first_rows(run) for k in r}
    unknown = [m for m in metrics if m not in present]
    if unknown:
        raise InputError(message=f"--metrics: {', '.join(unknown)} not in the log",
                         hint=f"fields in the log: {', '.join(sorted(present))}")


def _first_rows(run: Run) -> list[dict[str, Any]]:
    """The run's first 1000 rows (and a spilled run's first segment's, of each file)."""
    rows = run.records[:1000]
    for spills in run.spills.values():
        rows += [r for spill in spills for r in next(spill.tables())[:1000]]
    return rows


def analyze(runs: list[Run], options: ParseOptions) -> LogReport:
    """Summaries and anomalies for parsed runs (no files written)."""
    _check_metrics(runs, options.metrics)
    thresholds = attrs.evolve(options.thresholds, skip_warmup=options.skip_warmup)
    reports = []
    for run in runs:
        if run.spilled:
            reports.append(_analyze_spilled(run, options, thresholds))
            continue
        primary = run.primary_rank
        series = run.series(primary)
        summary = summarize(series, ranks=run.ranks, primary_rank=primary, skip_warmup=options.skip_warmup,
                            seq_length=options.seq_length, world_size=options.world_size,
                            peak_tflops=options.peak_tflops)
        findings = detect(run, thresholds=thresholds)
        anomalies = findings.result()
        summary.notes += run.held + findings.notes()
        reports.append(RunReport(name=run.name, run=run, series=series, summary=summary, anomalies=anomalies))
    wanted = KINDS if "all" in options.fail_on else options.fail_on
    found = {a.kind for r in reports for a in r.anomalies}
    return LogReport(runs=reports, options=options, matched=[k for k in KINDS if k in wanted and k in found])


def _analyze_spilled(run: Run, options: ParseOptions, thresholds: Thresholds) -> RunReport:
    """`analyze` of a run spilled to disk, a segment at a time (`mftk.logs.stream`)."""
    from mftk.logs.stream import analyze_spilled

    summary, anomalies, rows, plot_series = analyze_spilled(
        run, thresholds=thresholds, skip_warmup=options.skip_warmup, seq_length=options.seq_length,
        world_size=options.world_size, peak_tflops=options.peak_tflops, plot=options.plot is not None)
    summary.notes += run.held
    return RunReport(name=run.name, run=run, series=rows, summary=summary, anomalies=anomalies,
                     plot_series=plot_series)


def write_outputs(report: LogReport) -> None:
    """CSV / JSON / JSONL of every rank's steps, and the PNG; each file written atomically. A spilled run's
    rows are written one at a time, as its segments are read back."""
    o = report.options
    if (o.csv or o.jsonl) and any(r.run.spilled for r in report.runs):
        several = len(report.runs) > 1
        keys = export.columns([dict.fromkeys(["run"] if several else []) | dict.fromkeys(
            r.export_keys(None) or export.columns(r.all_steps())) for r in report.runs], o.metrics)

        def rows() -> Iterable[dict[str, Any]]:
            return (row for r in report.runs for row in _tagged(r, several))
        for path, write in ((o.csv, export.write_csv), (o.jsonl, export.write_jsonl)):
            if path:
                write_atomic_with(path, lambda f: write(f, rows(), keys))
                report.written.append(str(path))
    else:
        rows = [row for r in report.runs for row in _tagged(r, len(report.runs) > 1)] if (o.csv or o.jsonl) else []
        if o.csv:
            write_atomic(o.csv, export.to_csv(rows, o.metrics))
            report.written.append(str(o.csv))
        if o.jsonl:
            write_atomic(o.jsonl, export.to_jsonl(rows, o.metrics))
            report.written.append(str(o.jsonl))
    if o.json:
        write_atomic_with(o.json, lambda f: export.write_json(f, report.to_json()))
        report.written.append(str(o.json))
    if o.plot:
        from mftk.logs.plot import PlotRun, plot_runs
        from mftk.logs.restarts import plot_marks, read_restarts

        runs = [PlotRun(r.name, r.series if r.plot_series is None else r.plot_series, sorted({a.step for a in r.anomalies if a.kind in ("nan", "spike")}),
                        sorted({a.step for a in r.anomalies if a.kind == "resume"}),
                        plot_marks(read_restarts(Path(f.path) for f in r.run.files))) for r in report.runs]
        plot_runs(runs, o.plot, x=o.x, metrics=o.metrics, seq_length=o.seq_length)
        report.written.append(str(o.plot))


def _tagged(r: RunReport, several: bool) -> Iterable[dict[str, Any]]:
    rows = r.all_steps()
    if not several:
        return rows
    tagged = ({"run": r.name, **row} for row in rows)
    return tagged if r.run.spilled else list(tagged)


def parse_log(logs: list[Path], options: ParseOptions | None = None) -> LogReport:
    """Parse LOG... (one run, ranks merged; or one run per LOG with `compare`), analyze, export."""
    options = options or ParseOptions()
    check_options(options)
    groups = [[log] for log in logs] if options.compare else [list(logs)]
    runs = [parse_run(g, fmt=options.fmt, name=", ".join(map(str, g)), spill=True) for g in groups]
    report = analyze(runs, options)
    write_outputs(report)
    return report


def follow_log(logs: list[Path], options: ParseOptions | None = None, *,
               on_update: Callable[[LogReport], None], poll_s: float = 1.0, max_updates: int | None = None,
               timeout_s: float | None = None, sleep: Callable[[float], None] = time.sleep) -> LogReport | None:
    """Re-read growing logs every `poll_s` and call `on_update` with a fresh report when steps arrive.

    Stops after `max_updates` updates, `timeout_s` seconds or Ctrl-C (None: until interrupted); then
    writes the requested exports from the last report and returns it (raises if no step came).
    """
    options = options or ParseOptions(fmt="auto")
    check_options(options)
    readers = open_readers(list(logs), fmt=options.fmt)
    enable_spill(readers)  # a run longer than a segment is held a segment at a time
    name = ", ".join(map(str, logs))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    report, updates = None, 0
    try:
        while True:
            changed = False
            for reader in readers:  # a truncated file's rows are dropped (its reader starts a new table)
                new = reader.read_new(final=False)
                changed = changed or reader.restarted or len(new) > 0
            if changed and any(reader.table.n for reader in readers):
                report = analyze([collect(readers, name)], options)
                on_update(report)
                updates += 1
            elif changed:  # every file was truncated to nothing: what was shown is gone
                report = None
            if (max_updates is not None and updates >= max_updates) or (deadline and time.monotonic() >= deadline):
                break
            sleep(poll_s)
    except KeyboardInterrupt:  # Ctrl-C is how a follow ends: the exports are still written
        pass
    finally:
        for reader in readers:
            reader.close()
    if report is None:
        require_steps(collect(readers, name))
    write_outputs(report)
    return report
