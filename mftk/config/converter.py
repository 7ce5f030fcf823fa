"""The one cattrs converter, strict the way the reference's type checker is strict.

cattrs' default hooks coerce (`int("5")`, `bool("no") is True`); the reference rejects a bool
where an int is expected and a string where a number is expected, and so do we. Errors are
collected by cattrs' detailed validation and turned into `Problem`s with dotted paths.
"""
from __future__ import annotations

import types
import typing
from typing import Any, Union

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, ClassValidationError, IterableValidationNote

from mftk.errors import Problem


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if tp is dict:
        return "mapping"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        return f"list of {_type_name(arg)}"
    if origin is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "mapping", type(None): "null"}.get(type(value), type(value).__name__)
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{kind} {shown}"


class StrictTypeError(TypeError):
    """A value of the wrong type; carries both so the message can name them."""

    def __init__(self, value: Any, expected: Any) -> None:
        super().__init__(f"expected {_type_name(expected)}, got {_describe(value)}")
        self.value = value
        self.expected = expected


def _int(value: Any, _: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StrictTypeError(value, int)
    return value


def _float(value: Any, _: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StrictTypeError(value, float)
    return float(value)


def _bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise StrictTypeError(value, bool)
    return value


def _str(value: Any, _: Any) -> str:
    if not isinstance(value, str):
        raise StrictTypeError(value, str)
    return value


def _list(converter: cattrs.Converter):
    def hook(value: Any, tp: Any) -> list:
        if not isinstance(value, list):
            raise StrictTypeError(value, tp)
        (arg,) = typing.get_args(tp) or (Any,)
        if arg is Any:
            return list(value)
        out, errors = [], []
        for i, item in enumerate(value):
            try:
                out.append(converter.structure(item, arg))
            except Exception as exc:  # noqa: BLE001 - collected with its index
                exc.__notes__ = getattr(exc, "__notes__", []) + [f"@index {i}"]
                errors.append(exc)
        if errors:
            raise cattrs.IterableValidationError("list items invalid", errors, tp)
        return out

    return hook


def _dict(value: Any, tp: Any) -> dict:
    if not isinstance(value, dict):
        raise StrictTypeError(value, tp)
    return dict(value)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and not (
        len(typing.get_args(tp)) == 2 and type(None) in typing.get_args(tp)
        and any(attrs.has(a) for a in typing.get_args(tp)))


def _union(converter: cattrs.Converter):
    def hook(value: Any, tp: Any) -> Any:
        members = typing.get_args(tp)
        concrete = [m for m in members if m is not type(None)]
        if value is not None and len(concrete) == 1:
            return converter.structure(value, concrete[0])  # Optional[X]: X's own, more precise errors
        if value is None:
            if type(None) in members:
                return None
            raise StrictTypeError(value, tp)
        for member in members:
            if member is type(None):
                continue
            try:
                return converter.structure(value, member)
            except Exception:  # noqa: BLE001 - try the next member
                continue
        raise StrictTypeError(value, tp)

    return hook


def _any(value: Any, _: Any) -> Any:
    return value


def _section(converter: cattrs.Converter):
    """attrs classes (config sections) take a mapping; anything else is named as such, not as the
    ``TypeError`` cattrs' generated code would raise ("argument of type 'int' is not iterable")."""
    from cattrs.gen import make_dict_structure_fn

    made: dict[type, Any] = {}

    def hook(value: Any, cls: type) -> Any:
        if not isinstance(value, dict):
            raise StrictTypeError(value, dict)
        if cls not in made:
            made[cls] = make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True,
                                               _cattrs_detailed_validation=True)
        return made[cls](value, cls)

    return hook


def make_converter() -> cattrs.Converter:
    c = cattrs.Converter(detailed_validation=True, forbid_extra_keys=True)
    c.register_structure_hook(int, _int)
    c.register_structure_hook(float, _float)
    c.register_structure_hook(bool, _bool)
    c.register_structure_hook(str, _str)
    c.register_structure_hook(Any, _any)
    c.register_structure_hook_func(lambda t: typing.get_origin(t) is list, _list(c))
    c.register_structure_hook_func(lambda t: t is dict or typing.get_origin(t) is dict, _dict)
    c.register_structure_hook_func(_is_union, _union(c))
    c.register_structure_hook_func(attrs.has, _section(c))
    return c


CONVERTER = make_converter()


def structure(data: Any, cls: type, root: str = "") -> tuple[Any, list[Problem]]:
    """Structure `data` into `cls`; returns (object or None, problems with dotted paths)."""
    try:
        return CONVERTER.structure(data, cls), []
    except ClassValidationError as exc:
        return None, list(_flatten(exc, root))
    except (TypeError, ValueError) as exc:
        return None, [Problem(path=root, message=str(exc), value=data)]


def _flatten(exc: BaseException, path: str):
    """Walk cattrs' exception groups, yielding one Problem per leaf error with its path."""
    if isinstance(exc, (ClassValidationError, cattrs.IterableValidationError)):
        for sub in exc.exceptions:
            yield from _flatten(sub, _extend(path, sub))
        return
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        for key in sorted(exc.extra_fields):
            yield Problem(path=f"{path}.{key}" if path else key, message="unknown key")
        return
    value = getattr(exc, "value", None)
    if isinstance(exc, KeyError):
        yield Problem(path=path, message="required key is missing")
        return
    yield Problem(path=path, message=str(exc), value=value)


def _extend(path: str, exc: BaseException) -> str:
    """The child path an error note names: cattrs' attribute/index notes, or our ``@index i`` text.

    Notes are ``str`` subclasses, and a plain ``str`` has an ``index`` *method*: the note types are
    told apart by class, so a path never shows a bound method (``data_path[<built-in method ...>]``)."""
    for note in getattr(exc, "__notes__", []):
        if isinstance(note, AttributeValidationNote):
            return f"{path}.{note.name}" if path else note.name
        if isinstance(note, IterableValidationNote):
            return f"{path}[{note.index}]"
        if isinstance(note, str) and note.startswith("@index "):
            return f"{path}[{note.split()[1]}]"
    return path
