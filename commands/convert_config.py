"""`mftk convert-config`: a static-graph (GRAPH_MODE) YAML → a PyNative YAML mftk and the reference train from."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from commands._options import JsonOpt

EPILOG = """[bold]Examples[/]

  mftk convert-config configs/deepseek3/pretrain_deepseek3_671b.yaml -o ds3_pynative.yaml
  mftk validate-config ds3_pynative.yaml --world-size 256      [dim]# the world size it prints[/]
  mftk convert-config static.yaml -o out.yaml --force --json   [dim]# overwrite; mapping as JSON[/]

Every static key is either mapped (model.model_config lifted one level, architectures a string,
batch sizes, parallel degrees, optimizer, LR schedule, dataset, checkpoint callbacks) or listed as
not converted, with the reason (also as comments at the top of the written file). The result is
then checked as validate-config would at its own world size.

Exit codes: 0 written and valid at its world size; 1 not a static-graph config, or written but the
result does not validate yet (each unresolved key listed once: fix those in the written file);
2 usage or file error."""


def convert_config(
    config: Annotated[Path, typer.Argument(help="Static-graph training YAML (model.model_config, parallel_config, "
                                                "runner_config, context.mode: 0).", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="PyNative YAML to write (atomically).",
                                         show_default=False)],
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT if it exists.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Convert a static-graph config to PyNative: every key mapped or listed with the reason it was not."""
    from commands._render import console, err_console, print_json
    from mftk.config.convert import check_conversion, convert_file, write_conversion

    conv = convert_file(config)
    written = write_conversion(conv, output, force=force)
    verdict = check_conversion(conv)
    errors = [p for p in verdict if p.severity == "error"]
    if json_out:
        print_json(conv.to_dict() | {"output": str(written), "valid": not errors,
                                     "problems": [{"path": p.path, "severity": p.severity, "message": p.message,
                                                   "hint": p.hint} for p in verdict]})
    else:
        _render(console, err_console, conv, written, errors, len(verdict) - len(errors))
    if errors:
        raise typer.Exit(1)  # written, but not valid yet: a script must not go on to train it


def _render(console, err_console, conv, written: Path, errors: list, others: int) -> None:
    from rich.markup import escape

    console.print(f"[bold green]wrote[/] {escape(str(written))} from {escape(conv.source)}: "
                  f"{len(conv.mapped)} key(s) mapped, {len(conv.unmapped)} not converted", highlight=False)
    if conv.unmapped:
        console.print("not converted (no PyNative equivalent):")
        for path, why in conv.unmapped:
            console.print(f"  • {escape(path)}: {escape(why)}", highlight=False)
    world = conv.world_size
    if errors:
        err_console.print(f"[yellow]the result does not validate yet[/] (--world-size {world}); "
                          f"{len(errors)} key(s) to resolve in the written file:", highlight=False)
        for p in errors:
            err_console.print(f"  [red]•[/] {escape(p.render())}", highlight=False)
    else:
        extra = f" ({others} warning(s)/note(s))" if others else ""
        console.print(f"[green]✓ validates[/] at --world-size {world}{extra}", highlight=False)
    console.print(f"next: mftk validate-config {escape(str(written))} --world-size {world}", highlight=False)
