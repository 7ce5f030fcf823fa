"""The Typer application: every subcommand, loaded lazily; `MftkGroup.invoke` maps library errors to exit codes.

Only typer/rich are imported here. `MftkGroup.get_command` imports a command's module (and builds
its Click command from the function's signature) the first time that command is asked for, so
`mftk preprocess ...` loads one command module, not all of them; `mftk --help` loads them all.
Each command imports the library (and MindSpore, for the engine) inside its body.
"""
from __future__ import annotations

import importlib
from typing import Annotated, Optional

import typer
import typer.core

from commands._guard import CommandFailed, guarded
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
    ("templates", "templates", "Getting started"),
]

class _FlagsAsFlags:
    """Boolean flags render as flags in --help (no ``<bool>`` metavar), the help option included."""

    def get_params(self, ctx):  # type: ignore[no-untyped-def]
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            if getattr(p, "is_flag", False) and getattr(p, "metavar", None) is None:
                p.metavar = ""
        return params


class MftkCommand(_FlagsAsFlags, typer.core.TyperCommand):
    pass


class MftkGroup(_FlagsAsFlags, typer.core.TyperGroup):
    """The ``mftk`` group; its `invoke` is the one place library errors become a message and an exit code.

    Subcommands come from `COMMANDS` on demand (`get_command`), in the table's order (`list_commands`).
    """

    def list_commands(self, ctx):  # type: ignore[no-untyped-def]
        return [cli_name for _, cli_name, _ in COMMANDS]

    def get_command(self, ctx, cmd_name):  # type: ignore[no-untyped-def]
        if cmd_name not in self.commands and cmd_name in _BY_NAME:
            self.commands[cmd_name] = _build(*_BY_NAME[cmd_name])
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx, args):  # type: ignore[no-untyped-def]
        if args and args[0] not in _BY_NAME:  # a typo: Typer's "did you mean" looks at the loaded commands
            for name in _BY_NAME:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):  # type: ignore[no-untyped-def]
        try:
            return guarded(lambda: super(MftkGroup, self).invoke(ctx))
        except CommandFailed as failed:
            raise typer.Exit(failed.code) from None


app = typer.Typer(
    name="mftk",
    help="Pretrain LLMs with MindSpore in PyNative mode: prepare data, check one YAML, train, resume, inspect.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    cls=MftkGroup,
    suggest_commands=False,  # click's NoSuchCommand already suggests; Typer's would say it a second time
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


_BY_NAME = {cli_name: (module_name, cli_name, panel) for module_name, cli_name, panel in COMMANDS}


def _build(module_name: str, cli_name: str, panel: str):  # type: ignore[no-untyped-def]
    """The Click command of one subcommand, built by Typer from the function in ``commands/<module>.py``."""
    from typer.main import get_command_from_info
    from typer.models import CommandInfo

    module = importlib.import_module(f"commands.{module_name}")
    if hasattr(module, "OPTIONS"):  # options described as data (`commands._argspec`)
        from commands._argspec import typer_signature

        typer_signature(getattr(module, module_name), module.OPTIONS)
    info = CommandInfo(name=cli_name, cls=MftkCommand, rich_help_panel=panel, callback=getattr(module, module_name),
                       epilog=getattr(module, "EPILOG", None),
                       context_settings=getattr(module, "CONTEXT_SETTINGS", None))
    command = get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                    rich_markup_mode=app.rich_markup_mode)
    for param in command.params:
        _expand_paths(param)
    return command


def _expand_paths(param) -> None:  # type: ignore[no-untyped-def]
    """A path parameter expands ``~`` and ``$VAR`` by mftk's one rule (`mftk.config.paths.cli_path`): a shell
    leaves ``--output-dir=~/x`` and quoted values alone."""
    import click

    if not isinstance(param.type, click.Path):
        return
    convert, name = param.type.convert, (param.opts or [param.name])[0]

    def expanded(value, p, ctx):  # type: ignore[no-untyped-def]
        if isinstance(value, str):
            from mftk.files import cli_path

            value = cli_path(value, name if name.startswith("-") else name.upper())
        return convert(value, p, ctx)

    param.type.convert = expanded

