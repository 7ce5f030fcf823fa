"""Safe YAML reading that keeps line numbers and rejects what PyYAML would silently accept.

PyYAML keeps the last of two duplicate keys without a word and forgets where each value came
from; users need both. We compose the node tree once, check it (duplicates, depth), record the
line of every mapping key by dotted path, and construct plain Python data with SafeLoader.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from mftk.errors import ConfigError, InputError, Problem

MAX_DEPTH = 10  # mapping nesting, as the reference counts it (a sequence ends the count)


class LineMap(dict):
    """Dotted YAML path -> 1-based line number of its key."""

    def line(self, path: str) -> int | None:
        while path:
            if path in self:
                return self[path]
            path = path.rsplit(".", 1)[0] if "." in path else ""
        return None


def read_config_file(path: str | os.PathLike) -> str:
    p = Path(path)
    if not p.exists():
        raise InputError(message=f"config file not found: {p}", path=str(p),
                         hint="check the path; templates/ has ready configs")
    if p.is_dir():
        raise InputError(message=f"{p} is a directory, not a YAML file", path=str(p),
                         hint="pass the path of the .yaml file inside it")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(message=f"cannot read {p}: {exc.strerror}", path=str(p)) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(message=f"{p} is not UTF-8 text (byte {exc.start})", source=str(p),
                          problems=[Problem(path="", message="file is not UTF-8 text")]) from None


def parse_yaml(text: str, source: str = "<string>") -> tuple[Any, LineMap]:
    """Parse YAML text into plain data plus a line map; every structural problem is a ConfigError."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, text, source) from None
    if node is None:
        raise ConfigError(message=f"{source} is empty", source=source,
                          problems=[Problem(path="", message="the file holds no YAML mapping",
                                            hint="start from a template in templates/")])
    problems: list[Problem] = []
    lines = LineMap()
    _walk(node, "", 0, lines, problems)
    if problems:
        raise ConfigError(message=f"{len(problems)} problem(s) in {source}", source=source, problems=problems)
    loader = yaml.SafeLoader(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, text, source) from None
    finally:
        loader.dispose()
    return data, lines


def _syntax_error(exc: yaml.YAMLError, text: str, source: str) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    col = mark.column + 1 if mark is not None else None
    reason = getattr(exc, "problem", None) or str(exc)
    hint = "fix the YAML syntax at that position"
    if line is not None and "\t" in (text.splitlines()[line - 1] if line - 1 < len(text.splitlines()) else ""):
        reason = "a tab character is used for indentation"
        hint = "YAML indentation must use spaces; replace the tabs"
    where = f" at line {line}, column {col}" if line else ""
    return ConfigError(message=f"YAML syntax error in {source}{where}: {reason}", source=source,
                       problems=[Problem(path="", line=line, message=f"YAML syntax error: {reason}"
                                         + (f" (column {col})" if col else ""), hint=hint)])


def _walk(node: yaml.Node, path: str, depth: int, lines: LineMap, problems: list[Problem]) -> None:
    if isinstance(node, yaml.MappingNode):
        depth += 1
        if depth > MAX_DEPTH:
            problems.append(Problem(path=path, line=node.start_mark.line + 1,
                                    message=f"YAML nesting depth exceeds the maximum of {MAX_DEPTH}",
                                    hint="flatten the configuration"))
            return
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            child = f"{path}.{key}" if path else str(key)
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append(Problem(path=child, line=line,
                                        message=f"duplicate key '{key}' (first defined at line {seen[key]})",
                                        hint="keep one of them; YAML would silently use the last"))
                continue
            seen[key] = line
            lines[child] = line
            _walk(value_node, child, depth, lines, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            # A sequence ends the depth count, as in the reference's guard.
            _walk(item, f"{path}[{i}]", 0, lines, problems)
