"""The command blocks of README.md and of every docs/**/*.md page, as a test (and a person) runs them:
what to type, what it claims.

A ```bash block is a list of commands (one per line; a trailing backslash continues it); each claims
exit 0. A ```console block alternates ``$ command`` lines with the output the README shows for it:
``$ echo $?`` followed by a number claims the previous command's exit code (0 otherwise), a line
``...`` leaves lines out, ``…`` inside a line stands for any text (a time, a path prefix), and runs of
spaces are not significant (table columns may be wider or narrower). Other fences (```text, ```yaml)
are not commands.

    python scripts/readme_blocks.py            # list every block of every page with its commands and claims
    python scripts/readme_blocks.py --json     # the same as JSON

`tests/test_readme.py` runs each block in a fresh directory of fixtures and checks the claims with
`missing_lines`.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND_FENCES = ("bash", "console")
ELLIPSIS = "…"


@dataclass
class Command:
    text: str  # what is pasted into the shell
    line: int  # line of the page where it starts
    expected: list[str] = field(default_factory=list)  # output lines the page shows (console blocks)
    exit_code: int = 0  # claimed by a following `$ echo $?`, else 0


@dataclass
class Block:
    lang: str
    line: int  # line of the opening fence
    heading: str  # the section it is in
    commands: list[Command]
    page: str = "README.md"  # the file, relative to the repository root

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line} ({self.heading})"


def pages(root: Path = ROOT) -> list[Path]:
    """The pages whose blocks are run: README.md, then every docs/**/*.md in path order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def all_blocks(root: Path = ROOT) -> list[Block]:
    """The command blocks of every page."""
    return [b for p in pages(root) for b in blocks(p.read_text(encoding="utf-8"), p.relative_to(root).as_posix())]


def blocks(text: str, page: str = "README.md") -> list[Block]:
    """Every ```bash / ```console block of a Markdown text, parsed into commands."""
    out: list[Block] = []
    lines = text.splitlines()
    heading, i = "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            heading = line.lstrip("#").strip()
        fence = re.match(r"^```(\w+)\s*$", line)
        if fence:
            body_start, j = i + 1, i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if fence.group(1) in COMMAND_FENCES:
                body = lines[body_start:j]
                parse = _console if fence.group(1) == "console" else _bash
                out.append(Block(fence.group(1), i + 1, heading, parse(body, body_start + 1), page))
            i = j + 1
            continue
        i += 1
    return out


def _joined(body: list[str], k: int) -> tuple[str, int]:
    """The logical line starting at body[k] (backslash continuations joined) and the index after it."""
    parts = [body[k]]
    while parts[-1].rstrip().endswith("\\") and k + 1 < len(body):
        k += 1
        parts.append(body[k])
    return "\n".join(parts), k + 1


def _bash(body: list[str], first_line: int) -> list[Command]:
    out, k = [], 0
    while k < len(body):
        if not body[k].strip() or body[k].lstrip().startswith("#"):
            k += 1
            continue
        start = k
        text, k = _joined(body, k)
        out.append(Command(text, first_line + start))
    return out


def _console(body: list[str], first_line: int) -> list[Command]:
    out: list[Command] = []
    k = 0
    while k < len(body):
        line = body[k]
        if line.startswith("$ "):
            start = k
            body[k] = line[2:]
            text, k = _joined(body, k)
            body[start] = line
            if text.strip() == "echo $?":
                if out and k < len(body) and body[k].strip().isdigit():
                    out[-1].exit_code = int(body[k].strip())
                    k += 1
                continue
            out.append(Command(text, first_line + start))
            continue
        if out:
            out[-1].expected.append(line)
        k += 1
    return out


# ----------------------------------------------------------------------------- matching

def _normal(line: str) -> str:
    return " ".join(line.split())


def _pattern(expected: str) -> re.Pattern[str]:
    pieces = [re.escape(p).replace(r"\ ", " ") for p in _normal(expected).split(ELLIPSIS)]
    return re.compile(".*".join(pieces).replace(" ", r"\s*"))


def claimed(expected: list[str]) -> list[str]:
    """The lines a command's output must contain (elisions and blank lines dropped)."""
    return [e for e in expected if e.strip() and e.strip() not in ("...", ELLIPSIS)]


def missing_lines(expected: list[str], stdout: str, stderr: str) -> list[str]:
    """Claimed lines not found: each must match a whole output line, in order within stdout and within
    stderr (a terminal interleaves the two; a test sees them apart)."""
    streams = [[_normal(s) for s in stdout.splitlines()], [_normal(s) for s in stderr.splitlines()]]
    cursors = [0, 0]
    missing = []
    for e in claimed(expected):
        pattern = _pattern(e)
        for n, lines in enumerate(streams):
            hit = next((i for i in range(cursors[n], len(lines)) if pattern.fullmatch(lines[i])), None)
            if hit is not None:
                cursors[n] = hit + 1
                break
        else:
            missing.append(e)
    return missing


def main(argv: list[str]) -> int:
    found = all_blocks()
    if "--json" in argv:
        print(json.dumps([asdict(b) for b in found], indent=1, ensure_ascii=False))
        return 0
    for b in found:
        print(f"{b.name} [{b.lang}]")
        for c in b.commands:
            claims = f"exit {c.exit_code}" + (f", {len(claimed(c.expected))} line(s)" if c.expected else "")
            print(f"  $ {c.text}    # {claims}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # `| head`: the reader left
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
