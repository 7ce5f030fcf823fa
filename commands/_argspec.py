"""A command's options as data: what Typer builds the command from, and what `parse` reads argv with.

Why: importing Typer and Click and building a command from its signature costs `mftk preprocess`
30-50 ms of its ~0.5 s on the benchmark corpus, every run. A command that describes its options
here (a module-level ``OPTIONS``) gets both from the one table: `typer_signature` turns it into the
``Annotated[..., typer.Option(...)]`` signature Typer reads (when the Typer command is built), and
`parse` reads a plain argv with it without importing Typer. `parse` only takes the plain case —
every argument a known option with a value of the right type — and answers None for anything else
(``--help``, an unknown or repeated option, a bad number, a missing required option), so Typer
parses that argv and gives its usual message: no error text is written twice.

Only the standard library is imported here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Optional

JSON_HELP = "Print a machine-readable JSON result on stdout."


class Opt(NamedTuple):
    """One ``--option``: its flags (long first), value type (str, int, Path or bool: a flag) and help."""

    flags: tuple[str, ...]
    kind: type
    help: str
    default: Any = None
    many: bool = False  # repeatable: a list of values (None when not given, unless required)
    required: bool = False
    min: Optional[int] = None
    show_default: bool = True


JSON_OPT = Opt(("--json",), bool, JSON_HELP, default=False)


def annotation(opt: Opt) -> Any:
    """The Python type Typer reads for ``opt`` (without its typer.Option)."""
    if opt.many:
        return list[opt.kind] if opt.required else Optional[list[opt.kind]]
    if opt.kind is bool or opt.required or opt.default is not None:
        return opt.kind
    return Optional[opt.kind]


def typer_signature(func: Any, options: dict[str, Opt]) -> None:
    """Give ``func`` (keyword-only parameters named as ``options``' keys) the Typer signature of ``options``."""
    import inspect
    from typing import Annotated

    import typer

    params, hints = [], {}
    for name, opt in options.items():
        extra = {"min": opt.min} if opt.min is not None else {}
        hint = Annotated[annotation(opt), typer.Option(*opt.flags, help=opt.help, show_default=opt.show_default,
                                                        **extra)]
        default = inspect.Parameter.empty if opt.required else opt.default
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
        hints[name] = hint
    func.__signature__ = inspect.Signature(params, return_annotation=None)
    func.__annotations__ = {**hints, "return": None}


def parse(argv: list[str], options: dict[str, Opt]) -> dict[str, Any] | None:
    """The keyword arguments ``argv`` gives, or None where Typer should parse it (see the module docstring)."""
    by_flag = {flag: name for name, opt in options.items() for flag in opt.flags}
    given: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        flag, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        name = by_flag.get(flag)
        if name is None:
            return None  # --help, a positional, an unknown option or a short-option cluster
        opt = options[name]
        if name in given and not opt.many:
            return None
        if opt.kind is bool:
            if eq:
                return None
            given[name] = True
            i += 1
            continue
        if eq:
            raw, i = inline, i + 1
        elif i + 1 < len(argv):
            raw, i = argv[i + 1], i + 2
        else:
            return None
        value = _convert(raw, opt)
        if value is None:
            return None
        if opt.many:
            given.setdefault(name, []).append(value)
        else:
            given[name] = value
    values = {}
    for name, opt in options.items():
        if name in given:
            values[name] = given[name]
        elif opt.required:
            return None
        else:
            values[name] = opt.default
    return values


def _convert(raw: str, opt: Opt) -> Any:
    """``raw`` as ``opt.kind``, or None (Typer then says what is wrong with it)."""
    if raw.startswith("-") or not raw:
        return None  # a value that looks like an option, or an empty one: Click's rules decide
    if opt.kind is int:
        try:
            value = int(raw)
        except ValueError:
            return None
        return value if opt.min is None or value >= opt.min else None
    return Path(raw) if opt.kind is Path else raw
