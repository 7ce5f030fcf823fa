"""The shape of the docs (issue 38): a short README that maps `docs/`, links that lead somewhere, one dated
file per benchmark run, and a one-screen ARCHITECTURE.md. (`tests/test_readme.py` runs their command blocks.)"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = ROOT / "bench" / "results"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [README, ROOT / "ARCHITECTURE.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md")),
            *sorted(RESULTS.glob("*.md"))]


def test_readme_is_short_and_starts_with_the_two_make_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move detail into a docs/ page"
    first = lines[lines.index("```bash") + 1:lines.index("```")]
    assert [l.split()[:2] for l in first] == [["make", "demo"], ["source", ".venv/bin/activate"], ["make", "test"]]


def test_architecture_fits_one_screen():
    assert len((ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines()) <= 60


def test_every_relative_link_names_a_file_that_exists():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_readme_maps_every_docs_page():
    text = README.read_text(encoding="utf-8")
    linked = {(ROOT / t.split("#", 1)[0]).resolve() for t in LINK.findall(text)}
    unmapped = [p.relative_to(ROOT).as_posix() for p in sorted(DOCS.rglob("*.md")) if p.resolve() not in linked]
    assert unmapped == [], "add these pages to the README's map of docs/"


def test_every_bench_has_a_row_in_the_readme_and_every_run_file_is_dated():
    text = README.read_text(encoding="utf-8")
    table = text.split("## Performance", 1)[1].split("\n## ", 1)[0]
    scripts = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_"))  # _x: a helper module
    assert scripts and [s for s in scripts if f"`bench/{s}.py`" not in table] == []
    for f in RESULTS.glob("*"):
        m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)-([a-z_]+)(?:-[a-z0-9_]+)?\.md", f.name)
        assert m and 1 <= int(m.group(2)) <= 12 and 1 <= int(m.group(3)) <= 31, f.name
        assert m.group(4) in scripts, f"{f.name}: no bench/{m.group(4)}.py"


def test_readme_figures_link_the_newest_run_of_their_bench():
    """Each dated README row points at a run file, and no newer file of that bench exists."""
    text = README.read_text(encoding="utf-8")
    table = text.split("## Performance", 1)[1].split("\n## ", 1)[0]
    runs = re.findall(r"\]\(bench/results/((\d{4}-\d\d-\d\d)-([a-z0-9_-]+)\.md)\)", table)
    assert runs
    for name, date, bench in runs:
        newer = sorted(p.name for p in RESULTS.glob(f"*-{bench}.md") if p.name[:10] > date
                       and p.name[11:-3] == bench)
        assert newer == [], f"{name}: newer runs {newer}"
