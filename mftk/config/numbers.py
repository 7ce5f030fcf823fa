"""Every number in a config is finite and of a magnitude the engine can hold.

YAML reads ``.nan`` and ``.inf`` as floats and integers of any size (``10**30`` layers), and the
type checks pass them: a NaN ``learning_rate`` trains NaN weights, an infinite ``rms_norm_eps``
divides by infinity, a 31-digit layer count overflows the first ``range`` it meets. So after
structuring, one walk over the typed config visits *every* value of a number type — each attrs
field, and numbers inside its lists and mappings — and refuses:

- a float that is NaN or infinite, or whose magnitude overflows float32 (the engine computes in
  fp32, so 1e39 is infinity there);
- an integer outside int64 (every count ends up in a NumPy or MindSpore int64);
- in the ``model:`` section, an integer above 2^24: every one there is a size, a count or a token
  id, and the largest real ones (vocabularies, context lengths) are two orders of magnitude below.

The walk is generated from the attrs classes, so a field added to a section is covered without
being listed here. Paths are the YAML's (a model key the user spelt by its alias is reported so).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import attrs

from mftk.errors import Problem

FLOAT32_MAX = 3.4028234663852886e38
INT64_MAX = 2**63 - 1
MODEL_INT_MAX = 2**24


def number_problems(config: Any, yaml_key: Callable[[str], str] | None = None) -> list[Problem]:
    """The out-of-range numbers of a structured config (its ``model`` may be None); ``yaml_key`` maps a
    model field name to the key the YAML used for it."""
    problems: list[Problem] = []
    for f in attrs.fields(type(config)):
        value = getattr(config, f.name)
        if f.name == "model":
            if value is not None:
                _walk(value, "model", problems, MODEL_INT_MAX, yaml_key)
            continue
        _walk(value, f.name, problems, INT64_MAX, None)
    return problems


def model_number_problems(model: Any) -> list[Problem]:
    """`number_problems` of a ``model:`` section alone (an HF config.json's, say)."""
    problems: list[Problem] = []
    _walk(model, "model", problems, MODEL_INT_MAX, None)
    return problems


def _walk(value: Any, path: str, problems: list[Problem], int_max: int, yaml_key: Callable[[str], str] | None) -> None:
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, p = stack.pop()
        if attrs.has(type(v)):
            for f in reversed(attrs.fields(type(v))):
                key = yaml_key(f.name) if yaml_key is not None and p == "model" else f.name
                stack.append((getattr(v, f.name), f"{p}.{key}"))
        elif isinstance(v, dict):
            stack.extend((item, f"{p}.{k}") for k, item in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)):
            stack.extend((item, f"{p}[{i}]") for i, item in reversed(list(enumerate(v))))
        elif (problem := _check(v, p, int_max)) is not None:
            problems.append(problem)


def _check(v: Any, path: str, int_max: int) -> Problem | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        if math.isnan(v):
            return Problem(path=path, value=str(v), message="NaN is not a number a setting can take",
                           hint="write the number you mean (YAML reads .nan as NaN)")
        if math.isinf(v):
            return Problem(path=path, value=str(v), message=f"{'-' if v < 0 else ''}infinity is not a setting",
                           hint="write a finite number (YAML reads .inf as infinity)")
        if abs(v) > FLOAT32_MAX:
            return Problem(path=path, value=v, message=f"{v:g} overflows float32 (largest {FLOAT32_MAX:.4g}), the "
                           "precision the engine computes in", hint="write a number of a realistic magnitude")
        return None
    if isinstance(v, int) and abs(v) > int_max:
        where = ("every model: integer is a size, count or token id" if int_max == MODEL_INT_MAX
                 else "settings are 64-bit integers")
        return Problem(path=path, value=None, message=f"{_short(v)} is out of range: {where}, at most {int_max:,}",
                       hint="write a number of a realistic magnitude")
    return None


def _short(v: int) -> str:
    """An integer in at most ~30 characters (never ``str`` of a huge one: Python refuses past 4,300 digits)."""
    digits = math.floor(abs(v).bit_length() * math.log10(2)) + 1
    if digits <= 24:
        return str(v)
    return f"{'-' if v < 0 else ''}an integer of about {digits:,} digits"
