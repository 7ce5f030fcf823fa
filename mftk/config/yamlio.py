"""Safe YAML reading that keeps line numbers and rejects what PyYAML would silently accept.

PyYAML keeps the last of two duplicate keys without a word and forgets where each value came
from; users need both. We compose the node tree once, check it (duplicates, depth, aliases),
record the line of every mapping key by dotted path, and construct plain Python data with
SafeLoader.

Aliases: ``*a`` makes the node tree a graph. A few aliases are normal (shared blocks in 2.1.0
YAMLs); a "billion laughs" file nests aliases of aliases so that a 1 KiB file expands to 10^9
nodes, which every later walk of the data (ours, deepcopy, JSON) would visit. The expanded size
is counted once over the graph (each node's size memoised, so the count is linear in the file)
and a file whose aliases add more than `MAX_ALIAS_EXPANSION` nodes, or that refers to itself,
is refused before anything walks it.
"""
from __future__ import annotations

import os
from typing import Any

import yaml

from mftk.errors import ConfigError, InputError, Problem
from mftk.files import CONFIG_LIMIT, read_bytes

MAX_DEPTH = 10  # mapping nesting, as the reference counts it (a sequence ends the count)
MAX_NESTING = 64  # any nesting (sequences too): deeper data would exhaust recursion in later walks
MAX_ALIAS_EXPANSION = 10_000  # nodes aliases may add beyond the file's own (real configs add < 1,000)


class LineMap(dict):
    """Dotted YAML path -> 1-based line number of its key."""

    def line(self, path: str) -> int | None:
        while path:
            if path in self:
                return self[path]
            path = path.rsplit(".", 1)[0] if "." in path else ""
        return None


def read_config_file(path: str | os.PathLike) -> str:
    """The config's text: a regular file (never a FIFO or device) of at most `CONFIG_LIMIT` bytes."""
    p = os.fspath(path)
    hint = "pass the path of a .yaml file; templates/ has ready configs"
    if os.path.isdir(p):
        raise InputError(message=f"{p} is a directory, not a YAML file", path=p,
                         hint="pass the path of the .yaml file inside it")
    try:
        raw = read_bytes(p, limit=CONFIG_LIMIT, what="config file", hint=hint)
    except FileNotFoundError:
        raise InputError(message=f"config file not found: {p}", path=p,
                         hint="check the path; templates/ has ready configs") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(message=f"{p} is not UTF-8 text (byte {exc.start})", source=p,
                          problems=[Problem(path="", message="file is not UTF-8 text")]) from None


def parse_yaml(text: str, source: str = "<string>") -> tuple[Any, LineMap]:
    """Parse YAML text into plain data plus a line map; every structural problem is a ConfigError."""
    node = _compose(text, source)
    if node is None:
        raise ConfigError(message=f"{source} is empty", source=source,
                          problems=[Problem(path="", message="the file holds no YAML mapping",
                                            hint="start from a template in templates/")])
    problems = check_graph(node)
    lines = LineMap()
    if not problems:
        _walk(node, "", 0, lines, problems)
    if problems:
        raise ConfigError(message=f"{len(problems)} problem(s) in {source}", source=source, problems=problems)
    return _construct(text, source), lines


def parse_value(text: str, source: str) -> Any:
    """One YAML value (a ``--set`` override's), with the file's limits on aliases and nesting; text that
    is not YAML is returned as the string it is (the schema then names the key it does not fit)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return text
    except RecursionError:
        problems = [Problem(path="", message=f"YAML nested deeper than {MAX_NESTING} levels")]
    else:
        if node is None:
            return None
        problems = check_graph(node)
        if not problems:
            return _construct(text, source)
    raise ConfigError(message=f"{source}: {problems[0].message}", source=source, problems=problems)


def _compose(text: str, source: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, text, source) from None
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise ConfigError(message=f"{source}: YAML nested too deeply to read", source=source,
                          problems=[Problem(path="", message=f"nesting deeper than {MAX_NESTING} levels",
                                            hint="no config nests this deeply; check the file")]) from None


def _construct(text: str, source: str) -> Any:
    loader = yaml.SafeLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, text, source) from None
    except (ValueError, OverflowError) as exc:  # a 5,000-digit integer, a timestamp like 2024-13-45
        line = _unreadable_scalar_line(text)
        raise ConfigError(message=f"{source}: a value YAML cannot read ({exc})".split("\n")[0], source=source,
                          problems=[Problem(path="", line=line, message=f"a value YAML cannot read: {exc}",
                                            hint="write it as a plain number or a quoted string")]) from None
    finally:
        loader.dispose()


def _unreadable_scalar_line(text: str) -> int | None:
    """The line of the first scalar SafeLoader cannot turn into a value (for the error message)."""
    from yaml.constructor import SafeConstructor

    seen: set[int] = set()
    stack = [yaml.compose(text, Loader=yaml.SafeLoader)]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            try:
                SafeConstructor().construct_object(node)
            except (ValueError, OverflowError):
                return node.start_mark.line + 1
        stack.extend(reversed(_children(node)))
    return None


def check_graph(root: yaml.Node) -> list[Problem]:
    """Aliases that refer to themselves, expand past `MAX_ALIAS_EXPANSION`, or nesting past `MAX_NESTING`.

    One post-order pass over the node graph (iterative: no recursion limit), each node's expanded
    size and height memoised by identity, so a billion-laughs file costs as much as its own size.
    """
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = _children(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            height[key] = 1 + max((height[id(k)] for k in kids), default=0)
            if size[key] - len(size) > MAX_ALIAS_EXPANSION:
                return [_alias_problem(node, f"aliases expand the YAML past {MAX_ALIAS_EXPANSION:,} extra nodes "
                                       "(a \"billion laughs\" file?)")]
            if height[key] > MAX_NESTING:
                return [_alias_problem(node, f"YAML nested deeper than {MAX_NESTING} levels",
                                       "no config nests this deeply; check the file")]
            continue
        if key in size:
            continue
        if key in on_path:
            return [_alias_problem(node, "an alias refers to the node that contains it (a recursive structure)")]
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)
    return []


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _alias_problem(node: yaml.Node, message: str,
                   hint: str = "write the values out, or use fewer nested aliases") -> Problem:
    return Problem(path="", line=node.start_mark.line + 1, message=message, hint=hint)


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
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                problems.append(Problem(path=path, line=line, message="a key that is a list or a mapping",
                                        hint="keys must be plain names such as 'steps'"))
                continue
            key = key_node.value
            child = f"{path}.{key}" if path else str(key)
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
