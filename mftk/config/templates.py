"""The templates that ship with mftk (package data in ``mftk/templates/``, with their example data in ``data/``)."""
from __future__ import annotations

from pathlib import Path

import attrs

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"


@attrs.frozen
class Template:
    name: str  # file name without .yaml
    path: Path
    summary: str  # the first sentence of the file's leading comment


def shipped_templates() -> list[Template]:
    """Every shipped template, by name."""
    out = []
    for path in sorted(TEMPLATES_DIR.glob("*.yaml")):
        out.append(Template(path.stem, path, _first_sentence(path.read_text(encoding="utf-8"))))
    return out


def _first_sentence(text: str) -> str:
    """The leading comment block's first sentence (up to '. ' or its end), joined onto one line."""
    comment = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("#").strip())
    joined = " ".join(c for c in comment if c)
    end = joined.find(". ")
    return joined[: end + 1] if end >= 0 else joined
