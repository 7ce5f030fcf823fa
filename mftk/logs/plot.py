"""PNG plots of one or several runs: loss, auxiliary losses, lr, grad norm, throughput.

The main loss has a panel of its own (MoE balancing and MTP losses sit on another scale and would
flatten it); step axes get integer ticks; resumes are dashed lines and NaN/spike steps red ones;
`--compare` legends name each run by the part of its path that differs from the others.
Throughput is drawn in the FLOP/s unit that shows it, or, when the step line rounded it away
(below 1 TFLOP/s, `%6.2fT`), as tokens/s or samples/s computed from the exact step fields.

matplotlib is imported inside `plot_runs` with the Agg backend, so nothing here needs a display
and `mftk --help` never pays for it.
"""
from __future__ import annotations

import math
import os
from pathlib import Path, PurePath
from typing import Any, Callable

import attrs

from mftk.errors import InputError
from mftk.files import publish, temp_beside
from mftk.logs.summary import coarse_throughput

X_AXES = {"step": "step", "samples": "consumed_samples", "tokens": "consumed_tokens"}


@attrs.frozen
class PlotRun:
    """One run to draw: its legend label, one record per step, and the steps to mark."""

    label: str
    series: list[dict[str, Any]]
    bad_steps: list[int] = attrs.field(factory=list)  # NaN / spike: red lines on the loss panel
    resume_steps: list[int] = attrs.field(factory=list)  # dashed lines on every panel
    restarts: list[tuple[int, str]] = attrs.field(factory=list)  # (resumed step, label): `--max-restarts` relaunches


@attrs.frozen
class Panel:
    title: str
    fields: tuple[str, ...]
    value: Callable[[dict[str, Any], str], float | None] = attrs.field(default=None)


def _aux_losses(series: list[dict[str, Any]]) -> list[str]:
    keys = {k for r in series[:50] for k in r}
    return sorted(k for k in keys if k != "loss" and k.endswith("_loss"))


def _number(r: dict[str, Any], field: str) -> float | None:
    v = r.get(field)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _throughput_panel(runs: list[PlotRun], seq_length: int | None) -> Panel | None:
    """Model FLOP/s in a unit that shows it; if the log rounded it away, tokens/s (or samples/s) instead."""
    values = [v for run in runs for r in run.series if (v := _number(r, "throughput")) is not None]
    if values and not coarse_throughput(values):
        peak = max(abs(v) for v in values)
        unit, factor = next(((u, f) for u, f in (("TFLOP/s", 1.0), ("GFLOP/s", 1e3), ("MFLOP/s", 1e6))
                             if peak * f >= 1), ("GFLOP/s", 1e3))

        def flops(r: dict[str, Any], _: str) -> float | None:
            v = _number(r, "throughput")
            return None if v is None else v * factor
        return Panel(f"throughput ({unit}/device)", ("throughput",), flops)

    def rate(r: dict[str, Any], _: str) -> float | None:
        ms = _number(r, "per_step_time")
        if not ms:
            return None
        tokens = _number(r, "tokens")
        gbs = _number(r, "global_batch_size")
        if tokens is None and gbs is not None and seq_length:
            tokens = gbs * seq_length
        if tokens is not None:
            return tokens / ms * 1e3
        return None if gbs is None else gbs / ms * 1e3
    sample = next((r for run in runs for r in run.series if rate(r, "") is not None), None)
    if sample is None:
        return None
    tokens = _number(sample, "tokens") is not None or bool(seq_length)
    return Panel("tokens/s" if tokens else "samples/s", ("rate",), rate)


def panels_for(runs: list[PlotRun], metrics: list[str] | None, seq_length: int | None) -> list[Panel]:
    """The panels that have data: loss; auxiliary losses; lr; grad norm; throughput (or step time)."""
    aux = tuple(sorted({k for run in runs for k in _aux_losses(run.series)}))
    candidates = [Panel("loss", ("loss",)), Panel("auxiliary losses", aux), Panel("lr", ("lr",)),
                  Panel("grad_norm", ("grad_norm",))]
    throughput = _throughput_panel(runs, seq_length)
    if throughput is not None and (metrics is None or "throughput" in metrics):
        candidates.append(throughput)
    if throughput is None or (metrics is not None and "per_step_time" in metrics):
        candidates.append(Panel("per_step_time (ms)", ("per_step_time",)))
    out = []
    for p in candidates:
        fields = p.fields if p.value is not None else tuple(f for f in p.fields if metrics is None or f in metrics)
        if fields and any(_value(p, r, f) is not None for run in runs for r in run.series for f in fields):
            out.append(attrs.evolve(p, fields=fields))
    return out


def _value(panel: Panel, r: dict[str, Any], field: str) -> float | None:
    return panel.value(r, field) if panel.value is not None else _number(r, field)


def short_labels(names: list[str]) -> list[str]:
    """The parts of each run's path that differ from the others: runs/a/log/info.log, runs/b/log/info.log
    -> a, b. A single run keeps its name; identical names get their index."""
    if len(names) < 2:
        return list(names)
    parts = [PurePath(n).parts for n in names]
    lead = 0
    while all(len(p) > lead + 1 for p in parts) and len({p[lead] for p in parts}) == 1:
        lead += 1
    tail = 0
    while all(len(p) > lead + tail + 1 for p in parts) and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    labels = ["/".join(p[lead:len(p) - tail]) for p in parts]
    if len(set(labels)) < len(labels):
        return [f"{i + 1}: {label}" for i, label in enumerate(labels)]
    return labels


def _x_values(series: list[dict[str, Any]], x: str, seq_length: int | None) -> list[float | None]:
    if x == "tokens" and not any("consumed_tokens" in r for r in series[:5]):
        if not seq_length:
            raise InputError(message="--x tokens needs --seq-length (the log has consumed samples, not tokens)")
        return [None if r.get("consumed_samples") is None else r["consumed_samples"] * seq_length for r in series]
    key = X_AXES[x]
    values = [r.get(key) for r in series]
    if all(v is None for v in values):
        raise InputError(message=f"--x {x}: the log has no {key} field", hint="use --x step")
    return values


def plot_runs(runs: list[PlotRun], out: Path, *, x: str = "step", metrics: list[str] | None = None,
              seq_length: int | None = None) -> Path:
    """Draw the runs overlaid, one panel per quantity; write `out` atomically and return it."""
    import matplotlib.pyplot as plt

    out = Path(out)
    if not out.parent.is_dir():
        raise InputError(message=f"cannot write {out}: directory {out.parent} does not exist", path=str(out),
                         hint=f"create it first: mkdir -p {out.parent}")
    fig = draw_runs(runs, x=x, metrics=metrics, seq_length=seq_length)
    try:
        fd, tmp = temp_beside(out, ".png")
    except InputError:
        plt.close(fig)
        raise
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=100, format="png")
        publish(tmp, out)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def draw_runs(runs: list[PlotRun], *, x: str = "step", metrics: list[str] | None = None,
              seq_length: int | None = None) -> Any:
    """The matplotlib Figure of `plot_runs` (Agg backend), its panels top to bottom; the caller closes it."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if x not in X_AXES:
        raise InputError(message=f"unknown --x {x!r}", hint=f"use one of: {', '.join(X_AXES)}")
    panels = panels_for(runs, metrics, seq_length)
    if not panels:
        raise InputError(message="nothing to plot: none of the requested metrics are in the log",
                         hint="drop --metrics or name fields present in the log (loss, lr, grad_norm, throughput)")
    labels = short_labels([r.label for r in runs])
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.6 * len(panels)), sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        for label, run in zip(labels, runs):
            xs = _x_values(run.series, x, seq_length)
            for field in panel.fields:
                pts = [(xv, v) for xv, r in zip(xs, run.series)
                       if xv is not None and (v := _value(panel, r, field)) is not None]
                if pts:
                    name = label if len(panel.fields) == 1 else field if len(runs) == 1 else f"{label}: {field}"
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], linewidth=1, label=name)
            _marks(ax, run, xs, loss_panel=panel.title == "loss", x=x)
        ax.set_ylabel(panel.title)
        ax.grid(True, alpha=0.3)
        if len(panel.fields) > 1 or len(runs) > 1 or (panel.title == "loss" and any(r.resume_steps or r.restarts for r in runs)):
            ax.legend(fontsize="small")
    axes[-1, 0].set_xlabel(X_AXES[x] if x == "step" else f"{X_AXES[x]} (total)")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def _marks(ax: Any, run: PlotRun, xs: list[float | None], *, loss_panel: bool, x: str = "step") -> None:
    """Resumes as dashed grey lines (labelled once, on the loss panel); NaN/spike steps as red lines there;
    restarts as orange dash-dot lines at the step they resumed from, each named on the loss panel."""
    step_to_x = {r["step"]: xv for r, xv in zip(run.series, xs)}
    for i, (s, label) in enumerate(run.restarts):
        xv = step_to_x.get(s, s if x == "step" else None)  # step 0 (no checkpoint yet) has no record
        if xv is None:
            continue
        ax.axvline(xv, color="tab:orange", linestyle="-.", linewidth=1.0,
                   label="restart" if loss_panel and i == 0 else None)
        if loss_panel:
            ax.text(xv, 0.98, f" {label}", transform=ax.get_xaxis_transform(), rotation=90, va="top", ha="left",
                    fontsize="x-small", color="tab:orange")
    for i, s in enumerate(run.resume_steps):
        if step_to_x.get(s) is not None:
            ax.axvline(step_to_x[s], color="grey", linestyle="--", linewidth=0.9,
                       label="resume" if loss_panel and i == 0 else None)
    if loss_panel:
        for s in run.bad_steps:
            if step_to_x.get(s) is not None:
                ax.axvline(step_to_x[s], color="red", alpha=0.3, linewidth=0.8)
