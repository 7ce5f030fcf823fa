"""`mftk parse-log`: training logs into tables, files and plots, with the trouble found for you."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from commands._render import add_row, column, console, notice, print_json, print_table, say, table

EPILOG = """Examples:

  mftk parse-log msrun_log/worker_0.log

  mftk parse-log msrun_log/ --csv steps.csv --json run.json --plot run.png

  mftk parse-log run_a/worker_0.log run_b/worker_0.log --compare --plot cmp.png --x samples

  mftk parse-log output/log/rank_0/info.log --fail-on nan,spike   # exit 3 when found (CI)

  mftk parse-log msrun_log/worker_0.log --follow
"""

_TABLE_FIELDS = ("consumed_samples", "loss", "per_step_time", "load_balancing_loss", "indexer_loss", "lr",
                 "grad_norm", "throughput")


def _split(value: Optional[str]) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def parse_log(
    logs: Annotated[list[Path], typer.Argument(help="Log files (worker_N.log, info.log, mftk metrics .jsonl) or "
                                               "msrun log directories.", show_default=False)],
    fmt: Annotated[str, typer.Option("--format", help="auto | mindformers | megatron | mftk")] = "auto",
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Write every rank's steps as CSV.")] = None,
    json_out: Annotated[Optional[str], typer.Option("--json", help="Write steps, summary and anomalies as JSON "
                                                    "('-' prints it on stdout instead of the tables).")] = None,
    jsonl: Annotated[Optional[Path], typer.Option("--jsonl", help="Write steps as JSON lines (mftk metrics format).")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of loss, lr, grad norm, throughput.")] = None,
    metrics: Annotated[Optional[str], typer.Option("--metrics", help="Comma list of fields to show/export/plot, "
                                                   "e.g. loss,lr,grad_norm.")] = None,
    skip_warmup: Annotated[int, typer.Option("--skip-warmup", help="Steps left out of rates and step-time "
                                             "statistics (the first includes start-up).")] = 1,
    peak_tflops: Annotated[Optional[float], typer.Option("--peak-tflops", help="Per-device dense peak TFLOP/s; "
                                                         "adds MFU to the summary.")] = None,
    seq_length: Annotated[Optional[int], typer.Option("--seq-length", help="Tokens per sample, for tokens/s.")] = None,
    world_size: Annotated[Optional[int], typer.Option("--world-size", help="Devices (default: ranks found).")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="Each LOG is a separate run; overlay them.")] = False,
    x: Annotated[str, typer.Option("--x", help="Plot x axis: step | samples | tokens.")] = "step",
    fail_on: Annotated[Optional[str], typer.Option("--fail-on", help="Exit 3 if any of these anomalies is found: "
                                                   "all, nan, spike, grad_spike, straggler, lr_jump, divergence, "
                                                   "resume, skipped, zero_loss, unread, stopped.")] = None,
    spike: Annotated[Optional[float], typer.Option("--spike-threshold", help="Loss spike: loss > this x rolling "
                                                   "median (default 1.25).")] = None,
    grad_spike: Annotated[Optional[float], typer.Option("--grad-spike-threshold", help="grad_norm > this x "
                                                        "rolling median (default 4).")] = None,
    every: Annotated[int, typer.Option("--every", min=0, help="Show every Nth step (0: first and last rows).")] = 0,
    rows: Annotated[int, typer.Option("--rows", min=1, help="Rows shown at head and tail.")] = 8,
    follow: Annotated[bool, typer.Option("--follow", help="Re-read the growing log and refresh the table "
                                         "(Ctrl-C to stop).")] = False,
    poll: Annotated[float, typer.Option("--poll", help="Seconds between re-reads with --follow.")] = 2.0,
    follow_timeout: Annotated[Optional[float], typer.Option("--follow-timeout", hidden=True)] = None,
    follow_updates: Annotated[Optional[int], typer.Option("--follow-updates", hidden=True)] = None,
) -> None:
    """Parse training logs: step table, summary, anomalies; CSV/JSON/PNG exports."""
    import attrs

    from mftk.logs.anomalies import Thresholds
    from mftk.logs.report import ParseOptions
    from mftk.logs.report import parse_log as run_parse

    overrides = {k: v for k, v in (("spike", spike), ("grad_spike", grad_spike)) if v is not None}
    to_stdout = json_out == "-"
    options = ParseOptions(fmt=fmt, compare=compare, skip_warmup=skip_warmup, peak_tflops=peak_tflops,
                           seq_length=seq_length, world_size=world_size, metrics=_split(metrics) or None,
                           fail_on=_split(fail_on), thresholds=attrs.evolve(Thresholds(), **overrides), x=x,
                           csv=csv, json=None if (json_out is None or to_stdout) else Path(json_out),
                           jsonl=jsonl, plot=plot)
    if follow:
        report = _follow(logs, options, every, rows, poll, follow_updates, follow_timeout)
    else:
        report = run_parse(logs, options)
    if to_stdout and any(r.run.spilled for r in report.runs):  # steps written as they are read back
        import sys

        from mftk.logs.export import write_json

        write_json(sys.stdout, report.to_json(), indent=2)
        sys.stdout.flush()
    elif to_stdout:
        print_json(report.to_json())
    elif not follow:
        print_table(_tables(report, every, rows))
    elif report is not None:
        print_table(_tables(report, every, rows, steps=False))
    for run in report.runs:
        for warning in run.run.warnings:
            notice("warning", warning)
        for note in run.summary.notes:
            notice("note", note)
    if not to_stdout:
        _restarts(logs)
    for path in report.written:
        say("wrote ", path, err=True)
    report.raise_for_anomalies()


def _restarts(logs: list[Path]) -> None:
    """The restarts `--max-restarts` made (`mftk.logs.restarts`), one line each, after the summary."""
    from mftk.logs.restarts import describe, read_restarts

    for record in read_restarts(logs):
        notice("restart", describe(record))


def _follow(logs, options, every: int, rows: int, poll: float, updates, timeout):
    """On a terminal, a live table redrawn as steps arrive; piped, each new step as one plain line
    (like ``tail -f``), so ``parse-log --follow | grep`` sees the run as it goes."""
    from mftk.logs.report import follow_log

    if console.is_terminal:
        from rich.live import Live

        with Live(console=console, auto_refresh=False) as live:
            return follow_log(logs, options, poll_s=poll, max_updates=updates, timeout_s=timeout,
                              on_update=lambda rep: live.update(_tables(rep, every, rows, brief=True),
                                                                refresh=True))
    printer = _PlainRows(options.metrics)
    return follow_log(logs, options, poll_s=poll, max_updates=updates, timeout_s=timeout, on_update=printer)


class _PlainRows:
    """Prints the steps of the primary rank not printed yet, one line each, columns separated by two spaces."""

    def __init__(self, metrics: list[str] | None) -> None:
        self.metrics = metrics
        self.last_step: int | None = None
        self.columns: list[str] | None = None

    def __call__(self, report: Any) -> None:
        run = report.runs[0]
        if self.columns is None:
            self.columns = _present(run.series, self.metrics)
            say("  ".join(["step", *self.columns]))
        for r in run.series:
            if self.last_step is None or r["step"] > self.last_step:
                say("  ".join([str(r["step"]), *(_fmt(r.get(k), k) for k in self.columns)]))
                self.last_step = r["step"]
        console.file.flush()


def _fmt(value: Any, key: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if key == "lr":
            return f"{value:.3e}"
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.4e}"
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def _tables(report: Any, every: int, rows: int, *, brief: bool = False, steps: bool = True):
    from rich.console import Group

    parts: list[Any] = []
    for run in report.runs:
        if steps:
            parts.append(_step_table(run, every, rows, report.options.metrics, report.options.seq_length))
        if not brief:
            parts.append(_summary_table(run))
        if run.anomalies:
            t = table(column("step", justify="right"), "kind", "ranks", "detail",
                      title=f"anomalies ({len(run.anomalies)})")
            for a in run.anomalies[:50]:
                add_row(t, a.step if a.last_step is None else f"{a.step}..{a.last_step}", a.kind,
                        ",".join(map(str, a.ranks)), a.message)
            parts.append(t)
    return Group(*parts)


def _present(series: list[dict[str, Any]], metrics: list[str] | None) -> list[str]:
    present = [k for k in _TABLE_FIELDS if any(k in r for r in series[:20])]
    present += sorted({k for r in series[:20] for k in r if k.startswith("mtp_")})
    if metrics:
        present = [k for k in present if k in metrics] + [m for m in metrics if m not in present and m != "step"]
    return present


def _throughput_unit(series: list[dict[str, Any]]) -> tuple[str, float]:
    """The FLOP/s unit that shows the run's logged TFLOP/s values: (name, factor from TFLOP/s); values the
    step line rounded to 0.01 TFLOP/s stay in TFLOP/s, as logged (a finer unit would pretend a precision)."""
    from mftk.logs.summary import coarse_throughput

    import numpy as np

    from mftk.logs.table import as_view

    column = as_view(series).values("throughput")
    values = np.abs(column[np.isfinite(column)])
    if coarse_throughput(values):
        return "TFLOP/s as logged", 1.0
    peak = float(values.max()) if len(values) else 0.0
    for name, factor in (("TFLOP/s", 1.0), ("GFLOP/s", 1e3), ("MFLOP/s", 1e6)):
        if peak * factor >= 1:
            return name, factor
    return "GFLOP/s", 1e3


def _step_rate(r: dict[str, Any], seq_length: int | None) -> tuple[str, float | None]:
    """(column, value) of the step's rate that needs no rounded field: tokens/s where the tokens are known,
    else samples/s."""
    ms = r.get("per_step_time")
    if not isinstance(ms, (int, float)) or not ms or not math.isfinite(ms):
        return "", None
    if isinstance(r.get("tokens"), (int, float)):
        return "tokens/s", r["tokens"] / ms * 1e3
    gbs = r.get("global_batch_size")
    if not isinstance(gbs, (int, float)):
        return "", None
    if seq_length:
        return "tokens/s", gbs * seq_length / ms * 1e3
    return "samples/s", gbs / ms * 1e3


def _step_table(run: Any, every: int, rows: int, metrics: list[str] | None, seq_length: int | None = None):
    series = run.series
    present = _present(series, metrics)
    unit, factor = _throughput_unit(series)
    rate_name = next((n for n, _ in (_step_rate(r, seq_length) for r in series[:20]) if n), "")
    if metrics and rate_name not in metrics:
        rate_name = ""
    headers = {"per_step_time": "per_step_time (ms)", "throughput": f"throughput ({unit})"}
    cols = [column("step", justify="right")] + [column(headers.get(k, k), justify="right") for k in present]
    if rate_name:
        cols.append(column(rate_name, justify="right"))
    t = table(*cols, title=f"{run.name} — rank {run.summary.primary_rank}")
    if every:
        indexed = series.indexed() if hasattr(series, "indexed") else enumerate(series)  # a spilled run: rows held
        shown = [r for i, r in indexed if i % every == 0 or i == len(series) - 1]
        gap_at = None
    elif len(series) > 2 * rows:
        shown, gap_at = series[:rows] + series[-rows:], rows
    else:
        shown, gap_at = series, None
    for i, r in enumerate(shown):
        if i == gap_at:
            add_row(t, *["…"] * len(cols))
        cells = [r["step"]] + [_scaled(r.get(k), factor) if k == "throughput" else _fmt(r.get(k), k)
                               for k in present]
        if rate_name:
            value = _step_rate(r, seq_length)[1]
            cells.append("-" if value is None else f"{value:,.1f}" if value < 100 else f"{value:,.0f}")
        add_row(t, *cells)
    return t


def _scaled(value: Any, factor: float) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return _fmt(value)
    return f"{value:.2f}" if factor == 1.0 else f"{value * factor:.4g}"


def _summary_table(run: Any):
    from mftk.units import flops_rate

    s = run.summary
    t = table("what", "value", title="summary", show_header=False)
    total = f" of {s.total_steps}" if s.total_steps else ""
    add_row(t, "steps", f"{s.steps} ({s.first_step}..{s.last_step}{total}); ranks {_ranks(s.ranks)}")
    if s.loss_first is not None:
        add_row(t, "loss", f"first {s.loss_first:.6f}, last {s.loss_last:.6f}, "
                           f"min {s.loss_min:.6f} at step {s.loss_min_step}")
    if s.step_time_ms:
        st = s.step_time_ms
        add_row(t, f"step time (ms, after {s.warmup_skipped} warm-up)",
                f"p50 {st['p50']:.0f}, p90 {st['p90']:.0f}, p99 {st['p99']:.0f}, mean {st['mean']:.0f}, "
                f"max {st['max']:.0f}")
    if s.throughput_tflops is not None:
        if not s.throughput_coarse:
            value = f"{flops_rate(s.throughput_tflops)} (model FLOPs, as logged)"
        elif s.throughput_tflops < 0.005:
            value = "below 5 GFLOP/s (logged as 0.00T: the step line rounds to 0.01 TFLOP/s)"
        else:
            value = f"about {flops_rate(s.throughput_tflops)} (the step line rounds to 0.01 TFLOP/s)"
        add_row(t, "throughput per device", value)
    if s.samples_per_s is not None:
        add_row(t, "samples/s (global)", f"{s.samples_per_s:,.2f}")
    if s.tokens_per_s is not None:
        per_dev = f", {s.tokens_per_s_per_device:,.0f} per device" if s.tokens_per_s_per_device else ""
        add_row(t, "tokens/s", f"{s.tokens_per_s:,.0f}{per_dev}")
    if s.mfu is not None:
        add_row(t, "MFU", f"{s.mfu:.1%} of {s.peak_tflops:g} TFLOP/s peak (convention: --json summary.mfu_convention)")
    return t


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))
