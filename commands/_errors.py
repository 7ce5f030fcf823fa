"""The one table from library exception type to exit code and rendering (subclasses first).

Exit codes: 0 success; 1 invalid input (config, data, checkpoint, infeasible plan);
2 usage or file error, or a command not built yet; 3 anomalies found (parse-log --fail-on);
4 training failed; 75 training stopped by a signal after saving; 130 Ctrl-C; 141 the reader of the output
closed the pipe (`mftk … | head -1`), quietly, as a shell reports it for other Unix tools
(`_render.EXIT_PIPE_CLOSED`: the console that meets the closed pipe ends the command).
"""
from __future__ import annotations

import traceback
from typing import Callable

from rich.markup import escape

from mftk import errors as E

from commands._render import err_console, notice, say

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_ANOMALIES = 3
EXIT_TRAINING = 4
EXIT_SIGNAL_SAVED = 75
EXIT_INTERRUPT = 130


def _render_config(exc: E.ConfigError) -> None:
    """The errors, counted; then the warnings and notes, labelled as such and not counted as problems."""
    errors = [p for p in exc.problems if p.severity == "error"]
    where = f" in {exc.source}" if exc.source else ""
    if len(errors) == 1:  # one problem, one line
        prefix = f"{exc.source}: " if exc.source else ""
        say(("error:", "bold red"), " ", prefix + errors[0].render(), err=True)
    else:
        say(("error:", "bold red"), " ", exc.message or f"{len(errors)} problem(s){where}", err=True)
        for p in errors:
            say("  ", ("•", "red"), " ", p.render(), err=True)
    for p in exc.problems:
        if p.severity != "error":
            notice(p.severity, p.render())


def _render_checkpoint(exc: E.CheckpointError) -> None:
    _render_plain(exc)
    for p in exc.problems:
        err_console.print(f"  [red]•[/] {escape(str(p))}", highlight=False)


def _render_plain(exc: E.MftkError) -> None:
    err_console.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False)
    for label, value in _fields(exc):
        err_console.print(f"  {label}: {escape(str(value))}", highlight=False)


def _fields(exc: E.MftkError) -> list[tuple[str, object]]:
    """The error's location and comparison fields that its message does not already say."""
    message = exc.message
    out: list[tuple[str, object]] = []
    path = getattr(exc, "path", "")
    if path and path not in message:
        out.append(("file", path))
    line = getattr(exc, "line", None)
    if line is not None and f":{line}" not in message and f"line {line}" not in message:
        out.append(("line", line))
    offset = getattr(exc, "offset", None)
    if offset is not None and str(offset) not in message:
        out.append(("byte offset", offset))
    for name in ("expected", "found", "rule"):
        value = getattr(exc, name, "")
        if value and str(value) not in message:
            out.append((name, value))
    step = getattr(exc, "step", None)
    if step is not None and f"step {step}" not in message:
        out.append(("step", step))
    return out


# Ordered: the first matching row wins, so subclasses come before their bases.
TABLE: list[tuple[type[BaseException], int | None, Callable]] = [  # None: the error carries its exit_code
    (E.ConfigError, EXIT_INVALID, _render_config),
    (E.NotBuiltError, EXIT_USAGE, _render_plain),
    (E.InputError, EXIT_USAGE, _render_plain),
    (E.DataFormatError, EXIT_INVALID, _render_plain),
    (E.CheckpointError, EXIT_INVALID, _render_checkpoint),
    (E.PlanError, EXIT_INVALID, _render_plain),
    (E.AnomaliesFound, EXIT_ANOMALIES, _render_plain),
    (E.SubcommandFailed, None, _render_plain),
    (E.TrainingInterrupted, EXIT_SIGNAL_SAVED, _render_plain),
    (E.JobFault, EXIT_TRAINING, _render_plain),
    (E.TrainingError, EXIT_TRAINING, _render_plain),
    (E.MftkError, EXIT_INVALID, _render_plain),
    (KeyboardInterrupt, EXIT_INTERRUPT, lambda exc: err_console.print("[yellow]interrupted[/]")),
]


def exit_code_for(exc: BaseException) -> int | None:
    for exc_type, code, _ in TABLE:
        if isinstance(exc, exc_type):
            return code if code is not None else exc.exit_code
    return None


def handle(exc: BaseException, *, debug: bool = False) -> int | None:
    """Render a known error to stderr and return its exit code; None means a bug (re-raise)."""
    for exc_type, code, render in TABLE:
        if isinstance(exc, exc_type):
            render(exc)
            hint = getattr(exc, "hint", "")
            if hint:
                err_console.print(f"[cyan]hint:[/] {escape(hint)}", highlight=False)
            if debug:
                err_console.print(escape("".join(traceback.format_exception(exc))), highlight=False)
            return code if code is not None else exc.exit_code
    return None
