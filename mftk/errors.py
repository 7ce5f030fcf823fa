"""Typed errors raised by the library.

The library never prints or exits: it raises one of these with the data a user needs to fix
the problem, and `commands/_errors.py` maps each type to an exit code and a rendering.
Every error has a one-line ``message`` and an optional ``hint`` (the next thing to try).
"""
from __future__ import annotations

from typing import Any

import attrs


@attrs.define(auto_exc=True, kw_only=True)
class MftkError(Exception):
    """Base of every error a user can cause; anything else is a bug."""

    message: str
    hint: str = ""

    def __str__(self) -> str:
        return self.message


@attrs.define(auto_exc=True, kw_only=True)
class Problem:
    """One config problem: where (dotted YAML path, line), what, and how to fix it."""

    path: str
    message: str
    value: Any = None
    line: int | None = None
    hint: str = ""
    severity: str = "error"  # "error" (fails the config), "warning" or "note" (explains)

    def render(self) -> str:
        where = self.path or "<top level>"
        if self.line is not None:
            where += f" (line {self.line})"
        text = f"{where}: {self.message}"
        if self.hint:
            text += f" — {self.hint}"
        return text


@attrs.define(auto_exc=True, kw_only=True)
class ConfigError(MftkError):
    """The config is invalid; ``problems`` lists every problem found, not only the first."""

    problems: list[Problem] = attrs.field(factory=list)
    source: str = ""


@attrs.define(auto_exc=True, kw_only=True)
class InputError(MftkError):
    """A file or argument the user named cannot be used (missing, unreadable, a directory...)."""

    path: str = ""


@attrs.define(auto_exc=True, kw_only=True)
class DataFormatError(MftkError):
    """A data file exists but its content is wrong (bad JSON line, truncated .bin, bad .idx)."""

    path: str = ""
    line: int | None = None
    offset: int | None = None
    expected: str = ""
    found: str = ""


@attrs.define(auto_exc=True, kw_only=True)
class CheckpointError(MftkError):
    """A checkpoint directory or file cannot be read, verified or written."""

    path: str = ""
    problems: list[str] = attrs.field(factory=list)


@attrs.define(auto_exc=True, kw_only=True)
class PlanError(MftkError):
    """No parallel layout satisfies the constraints, or a plan input is invalid."""

    rule: str = ""
    values: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(auto_exc=True, kw_only=True)
class TrainingError(MftkError):
    """Training stopped for a reason the user must act on (NaN budget exhausted, save failed, worker died)."""

    step: int | None = None


@attrs.define(auto_exc=True, kw_only=True)
class TrainingInterrupted(MftkError):
    """SIGTERM/SIGINT arrived; a checkpoint was saved at ``step`` (when ``saved_path`` is set)."""

    step: int | None = None
    saved_path: str = ""


@attrs.define(auto_exc=True, kw_only=True)
class AnomaliesFound(MftkError):
    """parse-log --fail-on matched at least one anomaly."""

    kinds: list[str] = attrs.field(factory=list)


@attrs.define(auto_exc=True, kw_only=True)
class SubcommandFailed(MftkError):
    """A step run as its own ``mftk`` process (the quick-start's stages) failed with ``exit_code``."""

    exit_code: int = 1


@attrs.define(auto_exc=True, kw_only=True)
class NotBuiltError(MftkError):
    """A registered subcommand whose implementation has not landed yet."""
