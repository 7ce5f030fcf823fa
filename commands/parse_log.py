"""`mftk parse-log`: training logs into tables, files and plots, with the trouble found for you."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

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
                                                   "resume.")] = None,
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

    from commands._render import console, err_console, print_json
    from mftk.logs.anomalies import Thresholds
    from mftk.logs.report import ParseOptions, follow_log
    from mftk.logs.report import parse_log as run_parse

    overrides = {k: v for k, v in (("spike", spike), ("grad_spike", grad_spike)) if v is not None}
    to_stdout = json_out == "-"
    options = ParseOptions(fmt=fmt, compare=compare, skip_warmup=skip_warmup, peak_tflops=peak_tflops,
                           seq_length=seq_length, world_size=world_size, metrics=_split(metrics) or None,
                           fail_on=_split(fail_on), thresholds=attrs.evolve(Thresholds(), **overrides), x=x,
                           csv=csv, json=None if (json_out is None or to_stdout) else Path(json_out),
                           jsonl=jsonl, plot=plot)
    if follow:
        from rich.live import Live

        with Live(console=console, auto_refresh=False) as live:
            report = follow_log(logs, options, poll_s=poll, max_updates=follow_updates, timeout_s=follow_timeout,
                                on_update=lambda rep: live.update(_tables(rep, every, rows, brief=True),
                                                                  refresh=True))
    else:
        report = run_parse(logs, options)
    if to_stdout:
        print_json(report.to_json())
    elif not follow:
        console.print(_tables(report, every, rows))
    for run in report.runs:
        for warning in run.run.warnings:
            err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
        for note in run.summary.notes:
            err_console.print(f"[dim]note:[/] {escape(note)}", highlight=False)
    for path in report.written:
        err_console.print(f"wrote {escape(path)}", highlight=False)
    report.raise_for_anomalies()


def _fmt(value: Any, key: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if key == "lr":
            return f"{value:.3e}"
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.4e}"
    return str(value)


def _tables(report: Any, every: int, rows: int, *, brief: bool = False):
    from rich.console import Group
    from rich.table import Table

    parts: list[Any] = []
    for run in report.runs:
        parts.append(_step_table(run, every, rows, report.options.metrics))
        if not brief:
            parts.append(_summary_table(run))
        if run.anomalies:
            table = Table(title=f"anomalies ({len(run.anomalies)})", title_justify="left")
            for col in ("step", "kind", "ranks", "detail"):
                table.add_column(col)
            for a in run.anomalies[:50]:
                table.add_row(str(a.step), a.kind, ",".join(map(str, a.ranks)), escape(a.message))
            parts.append(table)
    return Group(*parts)


def _step_table(run: Any, every: int, rows: int, metrics: list[str] | None):
    from rich.table import Table

    series = run.series
    present = [k for k in _TABLE_FIELDS if any(k in r for r in series[:20])]
    present += sorted({k for r in series[:20] for k in r if k.startswith("mtp_")})
    if metrics:
        present = [k for k in present if k in metrics] + [m for m in metrics if m not in present and m != "step"]
    table = Table(title=f"{escape(run.name)} — rank {run.summary.primary_rank}", title_justify="left")
    table.add_column("step", justify="right")
    for k in present:
        table.add_column(escape(k), justify="right")
    if every:
        shown = [r for i, r in enumerate(series) if i % every == 0 or i == len(series) - 1]
        gap_at = None
    elif len(series) > 2 * rows:
        shown, gap_at = series[:rows] + series[-rows:], rows
    else:
        shown, gap_at = series, None
    for i, r in enumerate(shown):
        if i == gap_at:
            table.add_row("…", *["…"] * len(present))
        table.add_row(str(r["step"]), *[escape(_fmt(r.get(k), k)) for k in present])
    return table


def _summary_table(run: Any):
    from rich.table import Table

    s = run.summary
    table = Table(title="summary", show_header=False, title_justify="left")
    table.add_column("what")
    table.add_column("value")
    total = f" of {s.total_steps}" if s.total_steps else ""
    table.add_row("steps", f"{s.steps} ({s.first_step}..{s.last_step}{total}); ranks {_ranks(s.ranks)}")
    if s.loss_first is not None:
        table.add_row("loss", f"first {s.loss_first:.6f}, last {s.loss_last:.6f}, "
                              f"min {s.loss_min:.6f} at step {s.loss_min_step}")
    if s.step_time_ms:
        t = s.step_time_ms
        table.add_row(f"step time (ms, after {s.warmup_skipped} warm-up)",
                      f"p50 {t['p50']:.0f}, p90 {t['p90']:.0f}, p99 {t['p99']:.0f}, mean {t['mean']:.0f}, "
                      f"max {t['max']:.0f}")
    if s.throughput_tflops is not None:
        table.add_row("TFLOP/s per device", f"{s.throughput_tflops:.2f}")
    if s.samples_per_s is not None:
        table.add_row("samples/s (global)", f"{s.samples_per_s:.2f}")
    if s.tokens_per_s is not None:
        per_dev = f", {s.tokens_per_s_per_device:,.0f} per device" if s.tokens_per_s_per_device else ""
        table.add_row("tokens/s", f"{s.tokens_per_s:,.0f}{per_dev}")
    if s.mfu is not None:
        table.add_row("MFU", f"{s.mfu:.1%} of {s.peak_tflops:g} TFLOP/s peak")
        table.add_row("MFU convention", s.mfu_convention)
    return table


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))
