"""Hostile values for every number-typed config field, enumerated from the attrs classes of the config model.

Every field whose type is a float or an int, in every section and model family, lists and nested sections
included, so a field added later is covered without a test changing (issue 21, item 3; issue 38's
one-problem-per-path test).
"""
from __future__ import annotations

import types
import typing
from typing import Any, Iterator, Union

import attrs

from mftk.config import sections as S
from mftk.config.model import ALIASES, DeepseekV3ModelConfig, Qwen3ModelConfig

NUMBER = (int, float)


def number_fields(cls: type, path: list) -> Iterator[tuple[list, type]]:
    """(path, int or float) of every number-typed field reachable from ``cls``; lists get index 0."""
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):
        yield from _of_type(hints[f.name], path + [f.name])


def _of_type(tp: Any, path: list) -> Iterator[tuple[list, type]]:
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (Union, types.UnionType):
        plain = [a for a in args if a in NUMBER]
        if plain:  # int | list[int]: the plain number is the case to hit
            yield path, float if float in plain else int
        else:
            for a in args:
                yield from _of_type(a, path)
    elif origin is list:
        yield from _of_type(args[0], path + [0])
    elif attrs.has(tp):
        yield from number_fields(tp, path)
    elif tp in NUMBER:
        yield path, tp


def number_cases() -> list[tuple[str, list, type]]:
    out = [("qwen3_tiny", p, t) for p, t in number_fields(S.Config, []) if p[0] != "model"]
    out += [("qwen3_tiny", ["model", *p], t) for p, t in number_fields(Qwen3ModelConfig, [])]
    out += [("deepseek_v3_tiny", ["model", *p], t) for p, t in number_fields(DeepseekV3ModelConfig, [])]
    return out


def yaml_path(raw: dict, path: list, family: type | None) -> list:
    """The key the template spells a model field with (an alias such as num_layers) where it has one."""
    if path[0] == "model" and family is not None:
        for alias, target in ALIASES[family].items():
            if target == path[1] and alias in raw["model"]:
                return ["model", alias, *path[2:]]
    return path


def set_path(raw: dict, path: list, value: Any) -> None:
    node = raw
    for key, nxt in zip(path, path[1:]):
        if isinstance(key, int):
            while len(node) <= key:
                node.append({} if not isinstance(nxt, int) else [])
            node = node[key]
            continue
        if not isinstance(node.get(key), (dict, list)):
            node[key] = [] if isinstance(nxt, int) else {}
        node = node[key]
    last = path[-1]
    if isinstance(last, int):
        node[:] = (node or [value])[:max(len(node), 1)]
        node[last] = value
    else:
        node[last] = value


def dotted(path: list) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else k)
    return out


FAMILY_OF_TEMPLATE = {"qwen3_tiny": Qwen3ModelConfig, "deepseek_v3_tiny": DeepseekV3ModelConfig}
