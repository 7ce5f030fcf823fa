"""The rich-free half of command output: exit codes, JSON on stdout, the teardown request.

Importing Rich costs 20-30 ms of CPU (its console, table and markup modules). A command whose
output is plain (``--json``, no progress bar because stderr is not a terminal) needs none of it;
`commands._render` re-exports everything here, so other commands import from there as before.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a Unix tool whose reader left

# What makes Rich treat a stream as a terminal even when it is not a tty (rich.console.Console.is_terminal).
_TERMINAL_ENV = ("TTY_COMPATIBLE", "FORCE_COLOR", "TTY_INTERACTIVE")


def silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush does not report the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (a test runner's buffer)
        pass


_TEARDOWN: dict[str, Any] = {"skip": False, "keep": ()}


def skip_teardown(*keep: object) -> None:
    """The command's work is complete and on disk: the process may end without the interpreter's teardown.

    Freeing every object one by one at exit (tokenizers with their vocabularies and memos, numpy,
    modules) costs `mftk preprocess` 0.3-0.4 s after its outputs are written, fsynced and renamed.
    Only `commands.entry.main` (the real process) acts on it, after flushing stdout and stderr; a
    command run inside another program (a test's CliRunner) ends normally.

    ``keep``: objects that are slow to free (a loaded tokenizer's tables: 10 ms), held here so that the
    command's return does not free them just before the process ends; a later request (or
    `reset_teardown`) lets go of them.
    """
    _TEARDOWN["skip"] = True
    _TEARDOWN["keep"] = keep


def teardown_skippable() -> bool:
    return _TEARDOWN["skip"]


def reset_teardown() -> None:
    _TEARDOWN["skip"] = False
    _TEARDOWN["keep"] = ()


def print_json(data: Any) -> None:
    """Machine output: plain JSON on stdout, nothing else, so it pipes into jq."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def stderr_surely_plain() -> bool:
    """True when Rich would certainly not draw on stderr (no tty, nothing forcing it): a progress bar
    would be disabled, so Rich need not be imported to find that out. Any doubt answers False."""
    if any(name in os.environ for name in _TERMINAL_ENV) or "idlelib" in getattr(sys.stdin, "__module__", ""):
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return isatty is not None and not isatty()
    except ValueError:  # a closed stream: Rich says "not a terminal" too
        return True

