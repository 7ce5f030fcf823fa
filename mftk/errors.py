"""Typed errors raised by the library.

The library never prints or exits: it raises one of these with the data a user needs to fix
the problem, and `commands/_errors.py` maps each type to an exit code and a rendering.
Every error has a one-line ``message`` and an optional ``hint`` (the next thing to try).

Plain classes with keyword-only constructors, not attrs: every command imports this module before
it does anything, and attrs with these classes costs `mftk preprocess` 25-40 ms of a 0.4-0.8 s run.
Each class lists its fields in ``FIELDS`` (for `MftkError.as_dict` and the repr); errors compare and
hash by identity, as exceptions do.
"""
from __future__ import annotations

from typing import Any


class MftkError(Exception):
    """Base of every error a user can cause; anything else is a bug."""

    FIELDS: tuple[str, ...] = ("message", "hint")

    def __init__(self, *, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return _repr(self)

    def as_dict(self) -> dict[str, Any]:
        """The fields, as JSON-able as they are (a config error's problems as dicts): what a worker
        process reports to its parent, which builds the error again from them."""
        return {n: _plain(getattr(self, n)) for n in self.FIELDS}


class Problem:
    """One config problem: where (dotted YAML path, line), what, and how to fix it."""

    FIELDS = ("path", "message", "value", "line", "hint", "severity")
    __hash__ = None  # mutable, compared by value

    def __init__(self, *, path: str, message: str, value: Any = None, line: int | None = None, hint: str = "",
                 severity: str = "error") -> None:
        self.path = path
        self.message = message
        self.value = value
        self.line = line
        self.hint = hint
        self.severity = severity  # "error" (fails the config), "warning" or "note" (explains)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return _repr(self)

    def as_dict(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.FIELDS}

    def render(self) -> str:
        where = self.path or "<top level>"
        if self.line is not None:
            where += f" (line {self.line})"
        text = f"{where}: {self.message}"
        if self.hint:
            text += f" — {self.hint}"
        return text


def _repr(obj: MftkError | Problem) -> str:
    return f"{type(obj).__name__}({', '.join(f'{n}={getattr(obj, n)!r}' for n in obj.FIELDS)})"


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.as_dict() if isinstance(value, Problem) else value


class ConfigError(MftkError):
    """The config is invalid; ``problems`` lists every problem found, not only the first."""

    FIELDS = MftkError.FIELDS + ("problems", "source")

    def __init__(self, *, message: str, hint: str = "", problems: list[Problem] | None = None,
                 source: str = "") -> None:
        super().__init__(message=message, hint=hint)
        self.problems = [] if problems is None else problems
        self.source = source


class InputError(MftkError):
    """A file or argument the user named cannot be used (missing, unreadable, a directory...)."""

    FIELDS = MftkError.FIELDS + ("path",)

    def __init__(self, *, message: str, hint: str = "", path: str = "") -> None:
        super().__init__(message=message, hint=hint)
        self.path = path


class DataFormatError(MftkError):
    """A data file exists but its content is wrong (bad JSON line, truncated .bin, bad .idx)."""

    FIELDS = MftkError.FIELDS + ("path", "line", "offset", "expected", "found")

    def __init__(self, *, message: str, hint: str = "", path: str = "", line: int | None = None,
                 offset: int | None = None, expected: str = "", found: str = "") -> None:
        super().__init__(message=message, hint=hint)
        self.path = path
        self.line = line
        self.offset = offset
        self.expected = expected
        self.found = found


class CheckpointError(MftkError):
    """A checkpoint directory or file cannot be read, verified or written."""

    FIELDS = MftkError.FIELDS + ("path", "problems")

    def __init__(self, *, message: str, hint: str = "", path: str = "", problems: list[str] | None = None) -> None:
        super().__init__(message=message, hint=hint)
        self.path = path
        self.problems = [] if problems is None else problems


class PlanError(MftkError):
    """No parallel layout satisfies the constraints, or a plan input is invalid."""

    FIELDS = MftkError.FIELDS + ("rule", "values")

    def __init__(self, *, message: str, hint: str = "", rule: str = "",
                 values: dict[str, Any] | None = None) -> None:
        super().__init__(message=message, hint=hint)
        self.rule = rule
        self.values = {} if values is None else values


class TrainingError(MftkError):
    """Training stopped for a reason the user must act on (NaN budget exhausted, save failed, worker died)."""

    FIELDS = MftkError.FIELDS + ("step",)

    def __init__(self, *, message: str, hint: str = "", step: int | None = None) -> None:
        super().__init__(message=message, hint=hint)
        self.step = step


class JobFault(TrainingError):
    """A multi-process job lost a process: a worker died or crashed (``kind`` "died"/"crashed"), made no
    progress for the hang timeout ("hang"), or a collective failed because a peer went ("peer"). Unlike the user's errors, a relaunch from the last checkpoint can
    cure it, so it is the one error ``--max-restarts`` restarts on. ``ranks``: the ranks at fault."""

    FIELDS = TrainingError.FIELDS + ("kind", "ranks")

    def __init__(self, *, message: str, hint: str = "", step: int | None = None, kind: str = "died",
                 ranks: tuple[int, ...] | list[int] = ()) -> None:
        super().__init__(message=message, hint=hint, step=step)
        self.kind = kind
        self.ranks = tuple(ranks)


class TrainingInterrupted(MftkError):
    """SIGTERM/SIGINT arrived; a checkpoint was saved at ``step`` (when ``saved_path`` is set)."""

    FIELDS = MftkError.FIELDS + ("step", "saved_path")

    def __init__(self, *, message: str, hint: str = "", step: int | None = None, saved_path: str = "") -> None:
        super().__init__(message=message, hint=hint)
        self.step = step
        self.saved_path = saved_path


class AnomaliesFound(MftkError):
    """parse-log --fail-on matched at least one anomaly."""

    FIELDS = MftkError.FIELDS + ("kinds",)

    def __init__(self, *, message: str, hint: str = "", kinds: list[str] | None = None) -> None:
        super().__init__(message=message, hint=hint)
        self.kinds = [] if kinds is None else kinds


class SubcommandFailed(MftkError):
    """A step run as its own ``mftk`` process (the quick-start's stages) failed with ``exit_code``."""

    FIELDS = MftkError.FIELDS + ("exit_code",)

    def __init__(self, *, message: str, hint: str = "", exit_code: int = 1) -> None:
        super().__init__(message=message, hint=hint)
        self.exit_code = exit_code


class NotBuiltError(MftkError):
    """A registered subcommand whose implementation has not landed yet."""
