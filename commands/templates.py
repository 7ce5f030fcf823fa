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
    from commands._render import add_row, print_json, print_table, table
    from mftk.config.templates import shipped_templates

    found = shipped_templates()
    if json_out:
        print_json([{"name": t.name, "path": str(t.path), "summary": t.summary} for t in found])
        return
    t = table("template", "path", "what it is", title="templates shipped with mftk")
    for tpl in found:
        add_row(t, tpl.name, str(tpl.path), tpl.summary)
    print_table(t)
