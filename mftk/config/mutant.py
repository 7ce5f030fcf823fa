"""The "forgetting" mutant of the field-effect check (`scripts/field_effects.py`, `tests/config/test_field_effects.py`).

A field the status table (`config.status`) calls ``implemented`` must change what the engine does. The bug
class this guards against is a setting that is validated and then never read. The mutant reproduces it on
purpose: with ``MFTK_TEST_FORGET_FIELD=<dotted YAML path>`` in the environment, `load.load_data` resets that
one field to its default *after* every rule has passed — the config is validated with the user's value and
the engine sees the default. The field's proving test must then fail. The switch is for the check only: it
is read nowhere else, and unset (the normal case) it changes nothing.
"""
from __future__ import annotations

import os
from typing import Any

import attrs

ENV = "MFTK_TEST_FORGET_FIELD"


def forget_from_env(config: Any) -> Any:
    """``config`` with the field named by ``MFTK_TEST_FORGET_FIELD`` reset to its default (unchanged when unset)."""
    path = os.environ.get(ENV, "").strip()
    return reset_field(config, path) if path else config


def reset_field(obj: Any, path: str) -> Any:
    """A copy of the attrs object ``obj`` with the dotted ``path`` set to its attrs default. List items (the
    ``callbacks`` list) are each reset; an absent (None) section has nothing to forget."""
    if obj is None:
        return None
    if isinstance(obj, list):
        return [reset_field(item, path) for item in obj]
    head, _, rest = path.partition(".")
    fields = attrs.fields_dict(type(obj))
    if head not in fields:
        raise KeyError(f"{ENV}: {type(obj).__name__} has no field {head!r}")
    if rest:
        return attrs.evolve(obj, **{head: reset_field(getattr(obj, head), rest)})
    default = fields[head].default
    value = default.factory() if isinstance(default, attrs.Factory) else default  # type: ignore[arg-type]
    return attrs.evolve(obj, **{head: value})
