"""The `mftk` console entry point: a plain `mftk preprocess` runs without importing Typer; everything else
goes through the Typer application (`commands.app`).

Why a second way in: Typer and Click cost `mftk preprocess` 30-50 ms of a ~0.5 s run on the benchmark
corpus (imported, and the command built from its signature), on every run of a command that is often run
many times over (one per shard, per corpus). A command in `FAST` describes its options as data
(`commands._argspec`); when `commands._argspec.parse` takes its argv, the command function is called
directly with the same error handling as `MftkGroup.invoke` (`commands._guard.guarded`); when it does not
(``--help``, a typo, a bad value), Typer parses the same argv and reports it as always.

This module imports only the standard library until a command runs. `commands.app` does not import it (the
console entry point is here alone; the error handling both use is `commands._guard.guarded`): no import circle.
"""
from __future__ import annotations

import importlib
import os
import sys

# CLI name -> module in commands/ defining OPTIONS and a function named like the module
FAST = {"preprocess": "preprocess"}


def run_fast(argv: list[str]) -> bool:
    """Run ``argv`` without Typer if it is a plain call of a `FAST` command; False if Typer must parse it."""
    if not argv or argv[0] not in FAST:
        return False
    from commands._argspec import parse  # lazy, as everything here: `mftk --version` stays light
    from commands._guard import CommandFailed, guarded

    name = FAST[argv[0]]
    module = importlib.import_module(f"commands.{name}")
    values = parse(argv[1:], module.OPTIONS)
    if values is None:
        return False
    try:
        guarded(lambda: getattr(module, name)(**values))
    except CommandFailed as failed:
        raise SystemExit(failed.code) from None
    return True


def main() -> None:
    """Console entry point.

    A command that finished and asked for it (`commands._plain.skip_teardown`) ends the process at
    once (``os._exit``) after stdout and stderr are flushed: nothing is left to write by then.
    """
    plain = sys.modules.get("commands._plain")  # not imported here: `mftk --version` stays light
    if plain is not None:
        plain.reset_teardown()  # a request from an earlier in-process invocation is not this one's
    try:
        if not run_fast(sys.argv[1:]):
            from commands.app import app  # lazy: a plain `mftk preprocess` never imports Typer

            app()
        raise SystemExit(0)
    except SystemExit as exc:
        plain = sys.modules.get("commands._plain")
        if exc.code in (0, None) and plain is not None and plain.teardown_skippable() and _flushed():
            os._exit(0)
        raise


def _flushed() -> bool:
    """stdout and stderr flushed (False if that fails: the normal exit then reports it)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return False
    return True
