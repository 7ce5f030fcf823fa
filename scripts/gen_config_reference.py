"""Regenerate docs/config-reference.md (the config reference) from the config model.

Usage: python scripts/gen_config_reference.py [--check]
--check exits 1 (and changes nothing) when the generated block of that page is stale.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mftk.config.reference import config_reference_markdown, replace_block  # noqa: E402


def main() -> int:
    page = ROOT / "docs" / "config-reference.md"
    text = page.read_text(encoding="utf-8")
    new = replace_block(text, config_reference_markdown())
    if "--check" in sys.argv:
        if new != text:
            print("docs/config-reference.md is stale: run python scripts/gen_config_reference.py")
            return 1
        return 0
    page.write_text(new, encoding="utf-8")
    print("docs/config-reference.md updated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
