"""The Typer application: registers every subcommand and maps library errors to exit codes.

Only typer/rich and the thin command modules are imported here; each command imports the
library (and MindSpore, for the engine) inside its body, so `mftk --help` stays fast.
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Annotated, Optional

import typer

from mftk import __version__

# (module in commands/, CLI name, help panel) — the module defines a function named like the module.
COMMANDS: list[tuple[str, str, str]] = [
    ("preprocess", "preprocess", "Data"),
    ("validate_config", "validate-config", "Configure"),
    ("convert_config", "convert-config", "Configure"),
    ("plan_parallel", "plan-parallel", "Configure"),
    ("train", "train", "Train"),
    ("resume", "resume", "Train"),
    ("inspect_ckpt", "inspect-ckpt", "Inspect"),
    ("parse_log", "parse-log", "Inspect"),
    ("quickstart", "quickstart", "Getting started"),
]

app = typer.Typer(
    name="mftk",
    help="Pretrain LLMs with MindSpore in PyNative mode: prepare data, check one YAML, train, resume, inspect.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mftk {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Pretrain LLMs with MindSpore in PyNative mode: prepare data, check one YAML, train, resume, inspect."""


def _mapped(func):
    """Wrap a command so library errors become a message on stderr and a mapped exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from commands._errors import handle

        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - mapped or re-raised
            code = handle(exc, debug=bool(os.environ.get("MFTK_DEBUG")))
            if code is None:
                raise
            raise typer.Exit(code) from None

    return wrapper


def _register() -> None:
    for module_name, cli_name, panel in COMMANDS:
        module = importlib.import_module(f"commands.{module_name}")
        func = _mapped(getattr(module, module_name))
        app.command(
            name=cli_name,
            rich_help_panel=panel,
            epilog=getattr(module, "EPILOG", None),
            context_settings=getattr(module, "CONTEXT_SETTINGS", None),
        )(func)


_register()


def main() -> None:
    """Console entry point (errors are mapped per command by `_mapped`)."""
    app()


if __name__ == "__main__":
    main()
