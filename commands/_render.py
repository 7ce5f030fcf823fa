"""Rich consoles and adapters: results to stdout, progress/warnings/errors to stderr."""
from __future__ import annotations

import json
from typing import Any

from rich.console import Console

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # never break a path across lines


def print_json(data: Any) -> None:
    """Machine output: plain JSON on stdout, nothing else, so it pipes into jq."""
    import sys

    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


class RichProgress:
    """`mftk.progress.Progress` on a Rich progress bar (stderr); silent when not a terminal."""

    def __init__(self, console: Console = err_console, **columns_info: Any) -> None:
        self._console = console
        self._progress = None
        self._task = None

    def start(self, label: str, total: float | None = None) -> None:
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
        self._task = self._progress.add_task(label, total=total, info="")

    def advance(self, n: float = 1, **info: Any) -> None:
        if self._progress is not None and self._task is not None:
            text = "  ".join(f"{k}={v}" for k, v in info.items())
            self._progress.update(self._task, advance=n, info=text)

    def done(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None
