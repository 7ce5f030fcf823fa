"""`mftk templates`: where the shipped templates are, so an installed mftk can start from one anywhere."""
from __future__ import annotations

from commands._options import JsonOpt

EPILOG = """Examples:

  mftk templates

  mftk validate-config "$(mftk templates --json | jq -r '.[0].path')"

Each template points at example data shipped next to it; relative data paths are looked up in the
working directory first, then next to the YAML, so a template validates and trains from any directory.
"""


def templates(json_out: JsonOpt = False) -> None:
    """List the YAML templates that ship with mftk and where they are installed."""
    from rich.markup import escape
    from rich.table import Table

    from commands._render import console, print_json
    from mftk.config.templates import shipped_templates

    found = shipped_templates()
    if json_out:
        print_json([{"name": t.name, "path": str(t.path), "summary": t.summary} for t in found])
        return
    table = Table("template", "path", "what it is", title="templates shipped with mftk")
    for t in found:
        table.add_row(escape(t.name), escape(str(t.path)), escape(t.summary))
    console.print(table)
