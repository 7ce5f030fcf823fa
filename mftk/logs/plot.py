"""PNG plots of one or several runs: loss (+ auxiliary losses), lr, grad norm, throughput.

matplotlib is imported inside `plot_runs` with the Agg backend, so nothing here needs a display
and `mftk --help` never pays for it.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from mftk.errors import InputError
from mftk.files import publish, temp_beside

# (panel title, fields drawn in it); aux losses are added to the loss panel when present.
PANELS = (("loss", ("loss",)), ("lr", ("lr",)), ("grad_norm", ("grad_norm",)),
          ("throughput (TFLOP/s/device)", ("throughput",)), ("per_step_time (ms)", ("per_step_time",)))
X_AXES = {"step": "step", "samples": "consumed_samples", "tokens": "consumed_tokens"}


def _aux_losses(series: list[dict[str, Any]]) -> list[str]:
    keys = {k for r in series[:50] for k in r}
    return sorted(k for k in keys if k != "loss" and k.endswith("_loss"))


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


def plot_runs(runs: list[tuple[str, list[dict[str, Any]], list[int]]], out: Path, *, x: str = "step",
              metrics: list[str] | None = None, seq_length: int | None = None) -> Path:
    """Draw each (label, series, anomaly steps) overlaid; write `out` atomically and return it."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    if x not in X_AXES:
        raise InputError(message=f"unknown --x {x!r}", hint=f"use one of: {', '.join(X_AXES)}")
    panels = []
    for title, fields in PANELS:
        fields = list(fields)
        if fields == ["loss"]:
            fields += sorted({k for _, s, _ in runs for k in _aux_losses(s)})
        fields = [f for f in fields if metrics is None or f in metrics]
        if any(_has(s, f) for _, s, _ in runs for f in fields):
            panels.append((title, fields))
    if not panels:
        raise InputError(message="nothing to plot: none of the requested metrics are in the log",
                         hint="drop --metrics or name fields present in the log (loss, lr, grad_norm, throughput)")
    if metrics is None and title_is_time_only(panels) and len(panels) > 1:
        panels = panels[:-1]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.6 * len(panels)), sharex=True, squeeze=False)
    for ax, (title, fields) in zip(axes[:, 0], panels):
        for label, series, bad_steps in runs:
            xs = _x_values(series, x, seq_length)
            for field in fields:
                pts = [(xv, r[field]) for xv, r in zip(xs, series)
                       if xv is not None and isinstance(r.get(field), (int, float)) and math.isfinite(r[field])]
                if not pts:
                    continue
                name = field if len(runs) == 1 else f"{label}: {field}"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], linewidth=1, label=name)
            if field_is_loss(fields) and bad_steps:
                step_to_x = {r["step"]: xv for r, xv in zip(series, xs)}
                for s in bad_steps:
                    if step_to_x.get(s) is not None:
                        ax.axvline(step_to_x[s], color="red", alpha=0.3, linewidth=0.8)
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        if len(fields) > 1 or len(runs) > 1:
            ax.legend(fontsize="small")
    axes[-1, 0].set_xlabel(X_AXES[x])
    fig.tight_layout()
    out = Path(out)
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


def _has(series: list[dict[str, Any]], field: str) -> bool:
    return any(isinstance(r.get(field), (int, float)) and math.isfinite(r[field]) for r in series)


def field_is_loss(fields: list[str]) -> bool:
    return "loss" in fields


def title_is_time_only(panels: list[tuple[str, list[str]]]) -> bool:
    """Step time is drawn only when the log has no throughput (it is its reciprocal)."""
    titles = [t for t, _ in panels]
    return titles[-1].startswith("per_step_time") and any(t.startswith("throughput") for t in titles)
