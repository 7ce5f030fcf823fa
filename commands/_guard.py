"""Where a command's error becomes a message and an exit code (`guarded`), shared by the Typer application and
the Typer-free entry point without either importing the other; only the standard library and `commands._plain`
are imported until an error is rendered."""
from __future__ import annotations

import os
from typing import Any, Callable

from commands._plain import EXIT_PIPE_CLOSED, silence_stdout


class CommandFailed(Exception):
    """A command ended with a reported error: its exit code (the message is already written)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def guarded(call: Callable[[], Any]) -> Any:
    """Run a command body; the one place a library error becomes a message and an exit code, used by
    `commands.app.MftkGroup.invoke` and by `commands.entry.run_fast` (here, so neither imports the other).

    A closed stdout (`mftk … | head -1`) ends quietly, as Unix tools do; `mftk.errors.MftkError` and Ctrl-C
    are rendered by `commands._errors.handle` (Rich is imported only then). Anything else is a bug: its
    traceback is the report.
    """
    from mftk.errors import MftkError  # lazy: `mftk --version` imports nothing of the library

    try:
        return call()
    except BrokenPipeError:
        silence_stdout()
        raise CommandFailed(EXIT_PIPE_CLOSED) from None
    except (MftkError, KeyboardInterrupt) as exc:
        from commands._errors import handle  # lazy: Rich only when there is an error to render

        code = handle(exc, debug=bool(os.environ.get("MFTK_DEBUG")))
        if code is None:
            raise
        raise CommandFailed(code) from None
