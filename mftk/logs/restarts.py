"""Restart records of a job that `--max-restarts` brought back: written to each local rank's ``info.log`` and
``metrics.jsonl`` by the parent between attempts (no worker writes then), read back by ``parse-log``.

A restart is not a step: its JSON line carries ``"event": "restart"`` and no ``"step"`` key, so every reader of
step records (`format.parse_metrics_record`) passes it by.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

import attrs

EVENT = "restart"
INFO_PREFIX = "mftk restart "


@attrs.frozen(kw_only=True)
class Restart:
    """One relaunch: why, which ranks, how far the job had got, where it resumes, what it cost."""

    attempt: int  # 1 for the first relaunch
    max_restarts: int
    reason: str  # died | crashed | hang
    ranks: tuple[int, ...]
    step_reached: int | None
    resumed_from: str  # the checkpoint dir it continues from ("" when none: it starts again)
    resumed_step: int
    steps_lost: int | None
    seconds_lost: float
    message: str

    def line(self) -> str:
        ranks = ",".join(map(str, self.ranks)) or "?"
        return (f"{INFO_PREFIX}{self.attempt}/{self.max_restarts}: reason {self.reason}, rank {ranks}, step reached "
                f"{self.step_reached if self.step_reached is not None else '?'}, resuming from "
                f"{self.resumed_from or 'the start (no checkpoint yet)'} (step {self.resumed_step}), steps lost "
                f"{self.steps_lost if self.steps_lost is not None else '?'}, seconds lost {self.seconds_lost:.1f}")

    def record(self) -> dict[str, Any]:
        return {"event": EVENT, **attrs.asdict(self)}


def write_restart(restart: Restart, log_dirs: Iterable[Path]) -> None:
    """Append the restart to ``info.log`` (the reference's file format, as a WARNING) and ``metrics.jsonl``."""
    from mftk.logs.sinks import attach_file_log, detach, log

    for d in log_dirs:
        handler = attach_file_log(d)
        try:
            log.warning("%s (%s)", restart.line(), restart.message.splitlines()[0])
        finally:
            detach(handler)
        with open(d / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(restart.record()) + "\n")


# `Restart.line()` as written to info.log, for logs copied without their metrics.jsonl
_INFO_LINE = re.compile(INFO_PREFIX + r"(\d+)/(\d+): reason (\w+), rank ([\d,?]+), step reached (\d+|\?), resuming "
                        r"from .*? \(step (\d+)\), steps lost (\d+|\?), seconds lost ([\d.]+)")


def read_restarts(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The restart records of ``metrics.jsonl`` files (and of the ``metrics.jsonl`` beside an ``info.log``;
    without one, the info.log's restart WARNING lines)."""
    out, seen = [], set()
    for p in paths:
        p = Path(p)
        candidates = [p] if p.suffix == ".jsonl" else [p.with_name("metrics.jsonl")] if p.is_file() else \
            sorted(p.glob("**/metrics.jsonl"))
        for c in candidates:
            if c in seen:
                continue
            if not c.is_file():
                if p.is_file() and p not in seen:
                    seen.add(p)
                    out.extend(_info_restarts(p))
                continue
            seen.add(c)
            with open(c, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if '"event": "restart"' not in line:
                        continue
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(rec, dict) and rec.get("event") == EVENT:
                        out.append(rec)
    return out


def _info_restarts(path: Path) -> list[dict[str, Any]]:
    """The restart WARNING lines of one text log, as records (the fields a line carries)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if INFO_PREFIX not in line or (m := _INFO_LINE.search(line)) is None:
                continue
            attempt, most, reason, ranks, reached, resumed, lost, seconds = m.groups()
            out.append({"event": EVENT, "attempt": int(attempt), "max_restarts": int(most), "reason": reason,
                        "ranks": [int(r) for r in ranks.split(",") if r.isdigit()],
                        "step_reached": None if reached == "?" else int(reached), "resumed_step": int(resumed),
                        "steps_lost": None if lost == "?" else int(lost), "seconds_lost": float(seconds)})
    return out


def plot_marks(records: Iterable[dict[str, Any]]) -> list[tuple[int, str]]:
    """(resumed step, label) per restart, once each however many ranks' logs repeat it, in attempt order."""
    marks = {}
    for rec in records:
        key = (rec.get("attempt"), rec.get("resumed_step"))
        if isinstance(rec.get("resumed_step"), int) and key not in marks:
            marks[key] = (rec["resumed_step"], f"restart #{rec.get('attempt')} ({rec.get('reason')})")
    return [marks[k] for k in sorted(marks, key=lambda k: (k[0] or 0, k[1]))]


def describe(record: dict[str, Any]) -> str:
    """One restart for a summary line."""
    ranks = ",".join(str(r) for r in record.get("ranks") or []) or "?"
    return (f"#{record.get('attempt')}: {record.get('reason')} of rank {ranks} after step "
            f"{record.get('step_reached')}, resumed from step {record.get('resumed_step')} "
            f"({record.get('steps_lost')} steps, {float(record.get('seconds_lost') or 0):.0f} s lost)")
