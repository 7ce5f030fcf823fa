"""Rich consoles and the one way commands print: results to stdout, progress/warnings/errors to stderr.

Two rules hold for every command, so output reads the same on a terminal, piped into ``grep`` or in a
narrow window:

- User text (paths, YAML keys, tensor names, values) is never Rich markup: `cell` and `say` escape it
  with ``rich.markup.escape`` (a ``[/]`` in a file name prints as itself instead of crashing).
- Identifiers are never cut. Table columns fold (wrap inside the cell) instead of ending in ``…`` on
  a terminal; when stdout is not a terminal (a pipe, a file, ``COLUMNS=80`` in CI) a table is printed
  at its natural width, one row per line, so every path, name and number stays whole on its line.
  Plain lines are never wrapped either (soft wrap: the terminal or the reader wraps them).
"""
from __future__ import annotations

from typing import Any

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.table import Column, Table
from rich.text import Text

from commands._plain import (EXIT_PIPE_CLOSED, print_json, reset_teardown, silence_stdout,  # noqa: F401 - re-exported
                             skip_teardown, teardown_skippable)


class _Console(Console):
    """A console that stops quietly with exit 141 when the reader closes the pipe (``mftk … | head -1``)."""

    def on_broken_pipe(self) -> None:
        silence_stdout()
        raise SystemExit(EXIT_PIPE_CLOSED)


console = _Console(soft_wrap=True)
err_console = _Console(stderr=True, soft_wrap=True)  # never break a path across lines


def cell(value: Any) -> RenderableType:
    """A table cell or line piece: `Text` and other renderables pass through (our own styling); anything
    else is user text, escaped so that Rich prints it literally."""
    if isinstance(value, (Text, Table)):
        return value
    return escape("-" if value is None else str(value))


def styled(text: Any, style: str) -> Text:
    """Our own words in a style (``styled("yes", "green")``); the text itself is never markup."""
    return Text(str(text), style=style)


def say(*pieces: Any, err: bool = False, style: str | None = None) -> None:
    """Print one line assembled from pieces: a str is literal user text, a ``(text, style)`` pair or a
    `Text` is styled. Nothing is markup, nothing is highlighted, nothing is wrapped."""
    parts = [p if isinstance(p, (Text, tuple)) else str(p) for p in pieces]
    (err_console if err else console).print(Text.assemble(*parts, style=style or ""), highlight=False,
                                            soft_wrap=True)


def notice(kind: str, text: str) -> None:
    """A ``warning:`` / ``note:`` line on stderr, styled apart from errors (which are red and counted)."""
    colour = {"warning": "yellow", "note": "cyan"}.get(kind, "dim")
    say((f"{kind}:", colour), " ", text, err=True)


# ----------------------------------------------------------------------------- tables

def column(header: str, *, justify: str = "left", style: str | None = None, **kw: Any) -> Column:
    """A column that folds long values instead of truncating them."""
    return Column(header, justify=justify, style=style, overflow="fold", **kw)  # type: ignore[arg-type]


def table(*columns: str | Column, title: str | None = None, **kw: Any) -> Table:
    """A table whose columns fold (never ``…``); ``title`` is printed above it on a line of its own."""
    cols = [c if isinstance(c, Column) else column(c) for c in columns]
    for c in cols:
        c.overflow = "fold"
        c.no_wrap = False
    return Table(*cols, title=escape(title) if title else None, title_justify="left", **kw)


def add_row(t: Table, *cells: Any, **kw: Any) -> None:
    t.add_row(*(cell(c) for c in cells), **kw)


def natural_width(t: RenderableType, c: Console | None = None) -> int:
    """The width the renderable takes when nothing has to be wrapped."""
    c = c or console
    return c.measure(t, options=c.options.update(max_width=1_000_000)).maximum


def print_table(t: RenderableType, *, err: bool = False) -> None:
    """Print a table so that no identifier is cut: folded cells on a terminal; at its natural width (one
    line per row, however wide) when the output is not a terminal."""
    c = err_console if err else console
    if c.is_terminal:
        c.print(t)
        return
    width = max(natural_width(t, c), 1)
    if width <= c.width:
        c.print(t)
        return
    wide = _Console(file=c.file, width=width, soft_wrap=True, no_color=c.no_color, color_system=None,
                   force_terminal=False)
    wide.print(t)


# ----------------------------------------------------------------------------- progress

class RichProgress:
    """`mftk.progress.Progress` on a Rich progress bar (stderr); silent when not a terminal."""

    def __init__(self, console: Console = err_console, **columns_info: Any) -> None:
        self._console = console
        self._progress = None
        self._task = None

    def start(self, label: str, total: float | None = None) -> None:
        if not self._console.is_terminal:
            return  # the bar would be disabled: do not even import it
        from rich.progress import (BarColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f}" if total else "{task.completed:,.0f}"),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                console=self._console, transient=True, disable=not self._console.is_terminal,
            )
            self._progress.start()
        self._task = self._progress.add_task(escape(label), total=total, info="")

    def advance(self, n: float = 1, **info: Any) -> None:
        if self._progress is not None and self._task is not None:
            text = "  ".join(f"{k}={v}" for k, v in info.items())
            self._progress.update(self._task, advance=n, info=escape(text))

    def done(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None
