"""The templates that ship with mftk (package data in ``mftk/templates/``, with their example data in ``data/``)."""
from __future__ import annotations

from pathlib import Path

import attrs

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"


@attrs.frozen
class Template:
    name: str  # file name without .yaml
    path: Path
    summary: str  # the file's first comment line


def shipped_templates() -> list[Template]:
    """Every shipped template, by name."""
    out = []
    for path in sorted(TEMPLATES_DIR.glob("*.yaml")):
        first = next((ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.startswith("#")), "")
        out.append(Template(path.stem, path, first.lstrip("# ").strip()))
    return out
